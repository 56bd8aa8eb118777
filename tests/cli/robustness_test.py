#!/usr/bin/python3
"""Hostile input, signals and kills against the real binary: exit codes as SPEC section 2
says, one clear message, and no checkpoint ever lost or invalid.

One check per class of defect:
- checkpoints: nothing non-finite is written; pruning keeps the newest valid file and never
  counts a corrupt one; `resume: never` over existing checkpoints refuses; temporaries of
  dead writers are removed at the next start, a live run's directory is refused;
- hangs: a FIFO in every place a path is read ends at once with exit 1; SIGTERM to the
  restart supervisor (alone, or its process group) stops the worker cleanly, exit 3, no
  orphan;
- crashes: Ctrl-C stops cleanly (exit 3, checkpoint), a second one at once; run_dir that
  cannot hold checkpoints is exit 1 naming run_dir; a data file declaring 2^36 images is
  exit 1 before anything is sized by it;
- messages: NaN pixels and NaN init weights are named where they are read; make-data with
  huge sizes names them and the bytes; an unknown command is named.

usage: robustness_test.py HALOTRAIN WORKDIR
Every run has a timeout, so a regression that hangs fails instead of blocking CI.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from configs import write_config  # noqa: E402
from waiting import wait_for  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
RESULTS = []
TIMEOUT = 60


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)


def config(tag, **over):
    cfg = dict(
        name=tag, run_dir=os.path.join(WORK, tag), seed=3,
        data=dict(train=os.path.join(WORK, "data.h5")),
        model=dict(input=[16, 12, 1], loss="softmax_cross_entropy", layers=[
            dict(type="conv2d", filters=2, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2)]),
        training=dict(batch_size=2, steps=3, optimizer=dict(type="adam", lr=0.01)),
        parallel=dict(grid=[2, 1], device_memory="1GiB"),
        checkpoint=dict(every_steps=1, keep=5, resume="auto"),
    )
    return write_config(WORK, tag, cfg, over)


def finish(proc, timeout=60):
    """(exit code, or "timeout" after killing it; output) of a process started with stdout=PIPE."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "timeout", ""


def halotrain(*args, timeout=TIMEOUT):
    try:
        r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        return "timeout", out.decode(errors="replace") if isinstance(out, bytes) else out


def train(cfg, *sets, timeout=TIMEOUT):
    return halotrain("train", cfg, *[a for s in sets for a in ("--set", s)], timeout=timeout)


def ckdir(tag):
    return os.path.join(WORK, tag, "checkpoints")


def ckpts(tag):
    d = ckdir(tag)
    return sorted((f for f in os.listdir(d) if f.startswith("ckpt-") and f.endswith(".h5")),
                  key=lambda f: int(f[5:-3])) if os.path.isdir(d) else []


def valid(path):
    code, out = halotrain("inspect", path)
    return code == 0 and "checksum: OK" in out, out


def user_error(code, out, *needles):
    """Exit 1 with every needle in the output and no internal error or trace."""
    return code == 1 and all(n in out for n in needles) and "internal error" not in out and "terminate" not in out



def checkpoint_cases():
    # Adam at lr 1e39: one step makes the weights infinite while the loss was still finite.
    code, out = train(config("huge_lr", **{"training.optimizer.lr": 1e39, "training.steps": 1}))
    check("lr 1e39: exit 1 naming the first non-finite weight, no checkpoint",
          user_error(code, out, "step 1: weight conv2d_1/", "not writing a checkpoint") and not ckpts("huge_lr"),
          f"exit {code} files {ckpts('huge_lr')} {out[-800:]}")
    # epsilon 1e-50 is 0 in float32: a weight whose gradient is exactly 0 (conv kernels on
    # all-zero images) gets 0/0 = NaN.
    zeros = os.path.join(WORK, "zeros.h5")
    with h5py.File(zeros, "w") as f:
        f["images"] = np.zeros((4, 16, 12, 1), np.float32)
        f["labels"] = np.array([0, 1, 0, 1], np.int64)
    code, out = train(config("tiny_eps", **{"training.optimizer.epsilon": 1e-50, "training.steps": 2,
                                            "data.train": zeros}))
    check("epsilon 1e-50: exit 1 naming the weight, no checkpoint holds NaN",
          user_error(code, out, "step 1: weight conv2d_1/kernel:0 holds NaN") and all(valid(os.path.join(ckdir("tiny_eps"), f))[0] for f in ckpts("tiny_eps"))
          and not any(np.isnan(v).any() for f in ckpts("tiny_eps") for v in weights(os.path.join(ckdir("tiny_eps"), f))),
          f"exit {code} files {ckpts('tiny_eps')} {out[-800:]}")

    # A corrupt newer ckpt-10 beside valid ones, keep 1: the valid newest survives pruning.
    cfg = config("prune", **{"checkpoint.keep": 1})
    code, out = train(cfg)
    corrupt = os.path.join(ckdir("prune"), "ckpt-10.h5")
    shutil.copy(os.path.join(ckdir("prune"), "ckpt-3.h5"), corrupt)
    with open(corrupt, "r+b") as f:
        f.truncate(os.path.getsize(corrupt) // 2)
    code, out = train(cfg, "training.steps=5")
    kept = ckpts("prune")
    check("pruning with a corrupt newer file keeps the newest valid checkpoint",
          code == 0 and "ckpt-5.h5" in kept and valid(os.path.join(ckdir("prune"), "ckpt-5.h5"))[0]
          and "ckpt-10.h5" in kept and "ckpt-4.h5" not in kept,
          f"exit {code} kept {kept} {out[-1200:]}")

    # resume: never over an earlier, longer run: refused, nothing touched.
    cfg = config("never", **{"training.steps": 10, "checkpoint.every_steps": 5})
    train(cfg)
    before = {f: os.path.getmtime(os.path.join(ckdir("never"), f)) for f in ckpts("never")}
    code, out = train(cfg, "training.steps=4", "checkpoint.resume=never")
    after = {f: os.path.getmtime(os.path.join(ckdir("never"), f)) for f in ckpts("never")}
    check("resume: never over existing checkpoints: exit 1 naming the directory and files, nothing changed",
          user_error(code, out, ckdir("never"), "ckpt-10.h5") and before == after and len(before) == 2,
          f"exit {code} before {before} after {after} {out[-800:]}")

    # resume from an older path with newer checkpoints beside it: refused too.
    code, out = train(cfg, "training.steps=12", "checkpoint.resume=" + os.path.join(ckdir("never"), "ckpt-5.h5"))
    check("resume from an older path under newer checkpoints: exit 1 naming them",
          user_error(code, out, "newer than step 5", "ckpt-10.h5") and ckpts("never") == ["ckpt-5.h5", "ckpt-10.h5"],
          f"exit {code} {ckpts('never')} {out[-800:]}")

    # Temporaries of dead writers (kill -9 mid-write) are removed at the next start.
    cfg = config("stale", **{"training.steps": 2})
    train(cfg)
    for pid in (999999, 999998, 1):
        with open(os.path.join(ckdir("stale"), f"ckpt-9.h5.tmp-{pid}"), "wb") as f:
            f.write(b"\x89HDF partial")
    code, out = train(cfg, "training.steps=3")
    left = [f for f in os.listdir(ckdir("stale")) if ".tmp-" in f]
    check("stale temporary checkpoint files are removed at the next start", code == 0 and not left,
          f"exit {code} left {left} {out[-800:]}")

    # A live run holds the directory: a second run on it is refused and removes nothing.
    cfg = config("live", **{"training.steps": 100000, "checkpoint.every_steps": 1000})
    proc = subprocess.Popen([BIN, "train", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(os.path.join(WORK, "live", "metrics.csv")), 30)
        marker = os.path.join(ckdir("live"), f"ckpt-7.h5.tmp-{proc.pid}")
        open(marker, "wb").close()  # stands for the live writer's temporary
        code, out = train(cfg, "training.steps=2")
        check("a second run on a live run's directory: exit 1 naming the live pid, its files untouched",
              user_error(code, out, "in use by another training run", f"pid {proc.pid}") and os.path.exists(marker),
              f"exit {code} {out[-800:]}")
    finally:
        proc.kill()
        proc.wait()


def weights(path):
    out = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.append(np.array(o)) if isinstance(o, h5py.Dataset) and o.dtype.kind == "f"
                     and not n.startswith("halotrain") else None)
    return out


def fifo_cases():
    fifo = os.path.join(WORK, "pipe")
    os.mkfifo(fifo)
    cases = {
        "the config": ("train", fifo),
        "data.train": ("train", config("fifo_data", **{"data.train": fifo})),
        "training.init_weights": ("train", config("fifo_init", **{"training.init_weights": fifo})),
        "checkpoint.resume": ("train", config("fifo_resume", **{"checkpoint.resume": fifo})),
        "inspect's file": ("inspect", fifo),
        "plan's config": ("plan", fifo),
    }
    for what, args in cases.items():
        t0 = time.time()
        code, out = halotrain(*args, timeout=20)
        check(f"a FIFO as {what}: exit 1 at once, naming it", user_error(code, out, "FIFO") and time.time() - t0 < 15,
              f"exit {code} after {time.time() - t0:.1f}s {out[-500:]}")


def process_alive(pattern):
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return r.returncode == 0


def signal_cases():
    # recycle.mode restart: SIGTERM to the supervisor alone, then to its process group.
    for how in ("supervisor", "group"):
        tag = f"restart_{how}"
        cfg = config(tag, **{"training.steps": 100000, "checkpoint.every_steps": 1000,
                             "recycle.every_steps": 20, "recycle.mode": "restart"})
        proc = subprocess.Popen([BIN, "train", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started = wait_for(lambda: len(ckpts(tag)) >= 2, 60)  # two restarts happened
        if how == "supervisor":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
        code, out = finish(proc)
        orphan = wait_for(lambda: not process_alive(cfg), 10) is False
        check(f"SIGTERM to the restart {how}: the worker stops with a checkpoint, exit 3, no orphan",
              started and code == 3 and not orphan and "stopped after step" in out,
              f"started {started} exit {code} orphan {orphan} {out[-1000:]}")
        subprocess.run(["pkill", "-9", "-f", cfg])

    # Ctrl-C: a clean stop at the next step boundary, with a checkpoint.
    cfg = config("sigint", **{"training.steps": 100000, "checkpoint.every_steps": 1000})
    proc = subprocess.Popen([BIN, "train", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for(lambda: os.path.exists(os.path.join(WORK, "sigint", "metrics.csv")), 30)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    files = ckpts("sigint")
    # Steps are fast: periodic checkpoints (multiples of 1000) may come first; the stop's own
    # checkpoint is the newest, at the step the log says it stopped after (which may itself
    # be a multiple of 1000).
    stopped = re.search(r"stopped after step (\d+)", out)
    newest = files[-1] if files else ""
    check("SIGINT: finish the step, checkpoint, exit 3",
          code == 3 and stopped and newest == f"ckpt-{stopped.group(1)}.h5"
          and valid(os.path.join(ckdir("sigint"), newest))[0],
          f"exit {code} files {files} {out[-800:]}")

    # A second Ctrl-C ends the process at once, even when the first one is still pending.
    # Steps of about a second, so the first request is still pending when the second comes.
    cfg = config("sigint2", **{"training.steps": 100000, "checkpoint.every_steps": 1000,
                               "model.input": [1024, 1024, 1], "data.train": os.path.join(WORK, "big.h5"),
                               "model.layers": [dict(type="conv2d", filters=16, kernel=3, padding="same"),
                                                dict(type="relu"),
                                                dict(type="conv2d", filters=16, kernel=3, padding="same"),
                                                dict(type="global_avg_pool"), dict(type="dense", units=2)]})
    subprocess.run([BIN, "make-data", os.path.join(WORK, "big.h5"), "--count", "2", "--height", "1024",
                    "--width", "1024", "--classes", "2"], capture_output=True, timeout=TIMEOUT)
    proc = subprocess.Popen([BIN, "train", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: os.path.exists(os.path.join(WORK, "sigint2", "metrics.csv")), 30)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    check("a second SIGINT ends training at once", proc.returncode == -signal.SIGINT and time.time() - t0 < 5,
          f"exit {proc.returncode} after {time.time() - t0:.1f}s")


def bad_place_cases():
    not_dir = os.path.join(WORK, "a_file")
    open(not_dir, "w").close()
    os.makedirs(os.path.join(WORK, "ck_file"), exist_ok=True)
    open(os.path.join(WORK, "ck_file", "checkpoints"), "w").close()
    for what, run_dir in (("under /proc", "/proc/halotrain-run"), ("a file", not_dir),
                          ("holding a file named checkpoints", os.path.join(WORK, "ck_file"))):
        code, out = train(config("bad_dir", run_dir=run_dir))
        check(f"run_dir {what}: exit 1 naming run_dir", user_error(code, out, "run_dir", run_dir),
              f"exit {code} {out[-600:]}")

    # A header declaring 2^36 images: refused before anything is sized by it.
    huge = os.path.join(WORK, "huge.h5")
    with h5py.File(huge, "w") as f:
        f.create_dataset("images", shape=(2 ** 36, 16, 12, 1), dtype="float32", chunks=(1, 16, 12, 1))
        f.create_dataset("labels", shape=(2 ** 36,), dtype="int64", chunks=(1024,))
    code, out = train(config("huge", **{"data.train": huge}))
    check("a data file declaring 2^36 images: exit 1 naming the count and the memory",
          user_error(code, out, huge, "68719476736 images", "host memory"), f"exit {code} {out[-600:]}")


def message_cases():
    # A NaN pixel: named with its image, row, column.
    nan_data = os.path.join(WORK, "nan.h5")
    shutil.copy(os.path.join(WORK, "data.h5"), nan_data)
    with h5py.File(nan_data, "r+") as f:
        f["images"][1, 9, 4, 0] = np.nan
    code, out = train(config("nan_data", **{"data.train": nan_data, "data.shuffle": False}))
    check("a NaN pixel: exit 1 naming the file, image, row and column",
          user_error(code, out, nan_data, "image 1 has NaN at row 9, col 4") and not ckpts("nan_data"),
          f"exit {code} {out[-600:]}")

    # An Inf in init_weights: named with its layer and weight.
    cfg = config("inf_source", **{"training.steps": 1})
    train(cfg)
    inf_weights = os.path.join(WORK, "inf.h5")
    shutil.copy(os.path.join(ckdir("inf_source"), "ckpt-1.h5"), inf_weights)
    with h5py.File(inf_weights, "r+") as f:
        f["dense_1/dense_1/kernel:0"][1, 0] = np.inf
    code, out = train(config("inf_init", **{"training.init_weights": inf_weights}))
    check("an Inf in init_weights: exit 1 naming the layer and weight",
          user_error(code, out, inf_weights, "layer dense_1 weight kernel:0 holds +inf"), f"exit {code} {out[-600:]}")

    code, out = halotrain("make-data", os.path.join(WORK, "x.h5"), "--count", "1", "--height", "1000",
                          "--width", "2000000000")
    check("make-data with a huge width: exit 1 naming --width and the bytes",
          user_error(code, out, "--width 2000000000", "of memory") and not os.path.exists(os.path.join(WORK, "x.h5")),
          f"exit {code} {out[-400:]}")
    code, out = halotrain("make-data", os.path.join(WORK, "y.h5"), "--count", "100000", "--height", "100000",
                          "--width", "100000")
    check("make-data larger than the disk: exit 1 naming the sizes and the bytes",
          user_error(code, out, "--height 100000", "on disk"), f"exit {code} {out[-400:]}")

    code, out = halotrain("frobnicate", "x")
    check("an unknown command is named, with the commands", user_error(code, out, "'frobnicate'", "train"),
          f"exit {code} {out[-300:]}")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    subprocess.run([BIN, "make-data", os.path.join(WORK, "data.h5"), "--count", "4", "--height", "16",
                    "--width", "12", "--classes", "2"], check=True, capture_output=True, timeout=TIMEOUT)
    for group in (checkpoint_cases, fifo_cases, signal_cases, bad_place_cases, message_cases):
        group()
    failed = RESULTS.count(False)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
