#!/usr/bin/python3
"""A stop always ends the process, and data problems are said in a user's words:

- SIGTERM to a rank blocked in a collective (its peer is stopped with SIGSTOP): the job
  ends within slurm.signal_before (+ a margin) with exit 1 and a message saying what it
  waited for; every checkpoint on disk still verifies;
- SIGTERM during a normal run still checkpoints and exits 3 (the watchdog stands down);
- fewer images than training.batch_size: exit 1 naming both numbers;
- a data file cut short: exit 1 naming the file and the sizes, without a source path or an
  HDF5 call in the message.

usage: stop_and_data_test.py HALOTRAIN MPIRUN WORKDIR
"""
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from configs import write_config  # noqa: E402
from waiting import wait_for  # noqa: E402

BIN, MPIRUN, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
GRACE = 4  # slurm.signal_before in these runs
RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


def config(tag, **over):
    cfg = dict(
        name=tag, run_dir=os.path.join(WORK, "runs", tag), seed=3,
        data=dict(train=os.path.join(WORK, "data.h5"),
                  synthesize=dict(count=8, height=64, width=48, channels=1, classes=2)),
        model=dict(input=[64, 48, 1], layers=[dict(type="conv2d", filters=4, kernel=3, padding="same"),
                                             dict(type="relu"), dict(type="global_avg_pool"),
                                             dict(type="dense", units=2)]),
        training=dict(batch_size=2, steps=100000, optimizer=dict(type="sgd", lr=0.01), log_every=1),
        parallel=dict(backend="cpu", grid=[2, 1], device_memory="1GiB"),
        checkpoint=dict(every_steps=20, keep=3, resume="never"),
        slurm=dict(signal_before=GRACE, time="UNLIMITED"),
    )
    return write_config(WORK, tag, cfg, over)


def ranks_of(mpirun_pid):
    """pid of each MPI rank started by this mpirun, by OMPI_COMM_WORLD_RANK."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == mpirun_pid and b"OMPI_COMM_WORLD_RANK" in env:
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
    return out


def checkpoints_verify(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    bad = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if not name.endswith(".h5"):
            continue
        r = subprocess.run([BIN, "inspect", os.path.join(d, name)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0 or "checksum: OK" not in r.stdout:
            bad.append(name)
    return bad



def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)

    # Blocked in a collective: rank 1 stopped, rank 0 asked to stop.
    cfg = config("blocked")
    run_dir = os.path.join(WORK, "runs", "blocked")
    log = open(os.path.join(WORK, "blocked.log"), "w")
    proc = subprocess.Popen([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1",
                             BIN, "train", cfg], stdout=log, stderr=subprocess.STDOUT, cwd=WORK)
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    started = wait_for(lambda: os.path.isdir(ckpt_dir) and any(n.endswith(".h5") for n in os.listdir(ckpt_dir)), 120)
    ranks = ranks_of(proc.pid)
    check("two ranks training, a checkpoint written", started and len(ranks) == 2, f"ranks {ranks}")
    if len(ranks) == 2:
        os.kill(ranks[1], signal.SIGSTOP)
        t0 = time.time()
        os.kill(ranks[0], signal.SIGTERM)
        try:
            code = proc.wait(timeout=GRACE + 30)
        except subprocess.TimeoutExpired:
            code = None
        took = time.time() - t0
        if code is None:
            proc.kill()
            proc.wait()
        for pid in ranks.values():  # nothing left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
        with open(os.path.join(WORK, "blocked.log")) as f:
            text = f.read()
        check(f"SIGTERM while blocked in a collective: the job ends within {GRACE} + 30 s, non-zero",
              code not in (None, 0) and took < GRACE + 30, f"exit {code} after {took:.1f} s")
        check("  ... with a message saying it was blocked", "blocked reading data or waiting for another rank" in text,
              text[-800:])
        check("  ... and every checkpoint on disk verifies", not checkpoints_verify(run_dir),
              checkpoints_verify(run_dir))
    else:
        proc.kill()
        proc.wait()

    # A normal stop is unchanged: checkpoint, exit 3.
    cfg = config("normal", **{"training.steps": 100000})
    proc = subprocess.Popen([BIN, "train", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=WORK, text=True)
    run_dir = os.path.join(WORK, "runs", "normal")
    wait_for(lambda: os.path.exists(os.path.join(run_dir, "metrics.csv")) and
             sum(1 for _ in open(os.path.join(run_dir, "metrics.csv"))) > 3, 120)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    check("SIGTERM in a normal run: checkpoint and exit 3", proc.returncode == 3 and "stopped after step" in out,
          f"exit {proc.returncode}: {out[-600:]}")
    time.sleep(GRACE + 1)  # had the watchdog not stood down, it would have fired by now
    check("  ... and the watchdog did not fire", "blocked reading data" not in out, out[-400:])

    # Fewer images than a batch.
    cfg = config("few", **{"data.train": os.path.join(WORK, "few.h5"), "training.batch_size": 4, "training.steps": 2,
                           "data.synthesize": dict(count=3, height=64, width=48, channels=1, classes=2)})
    r = subprocess.run([BIN, "train", cfg], capture_output=True, text=True, timeout=120, cwd=WORK)
    check("fewer images than batch_size: exit 1 naming both", r.returncode == 1 and
          "holds 3 images, fewer than training.batch_size 4" in r.stderr, f"exit {r.returncode}: {r.stderr[-400:]}")

    # A data file cut short.
    cut = os.path.join(WORK, "cut.h5")
    with open(os.path.join(WORK, "data.h5"), "rb") as f:
        head = f.read()
    with open(cut, "wb") as f:
        f.write(head[: len(head) // 3])
    r = subprocess.run([BIN, "train", config("cut", **{"data.train": cut, "training.steps": 2})], capture_output=True,
                       text=True, timeout=120, cwd=WORK)
    msg = [l for l in r.stderr.splitlines() if " error " in l]
    check("a data file cut short: exit 1, one message naming the file and saying it is cut short",
          r.returncode == 1 and len(msg) == 1 and "cut.h5" in msg[0] and "cut short" in msg[0],
          f"exit {r.returncode}: {r.stderr[-400:]}")
    check("  ... without a source path or an HDF5 call", msg and ".cpp:" not in msg[0] and "H5" not in msg[0],
          msg[0] if msg else "")

    print(f"{sum(RESULTS)}/{len(RESULTS)} checks passed")
    sys.exit(0 if all(RESULTS) else 1)


if __name__ == "__main__":
    main()
