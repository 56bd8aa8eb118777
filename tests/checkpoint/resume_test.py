#!/usr/bin/python3
"""Checkpoint exactness and robustness, end to end through `halotrain train`.

- N steps straight == N/2 steps + resume to N, bit for bit (Adam, batch norm, shuffling,
  an epoch boundary crossed), and the same with recycle in_process and restart;
- train on grid 2x1, resume on 1x2: equal within float tolerance;
- a graph (residual add, dropout, upsampling, concatenate, shifts, transposed conv, group
  and instance norm, stochastic depth):
  resume and recycle bit for bit, and grid 1x1 equal to 2x1 (the same dropout masks);
- a torn newest checkpoint is skipped with a warning naming it;
- a checkpoint of another model is refused with exit 1;
- a leaking layer (test_leak, a layer kind of the test tree) grows the process without
  recycling and stays bounded with restart.

usage: resume_test.py HALOTRAIN WORKDIR HALOTRAIN_TEST_LAYERS
(the last: the CLI with tests/common/test_layers.cpp's layer kinds)
"""
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from configs import write_config  # noqa: E402

BIN, WORK, BIN_TEST_LAYERS = sys.argv[1], sys.argv[2], sys.argv[3]
RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)


def config(tag, leak_mib=0, **over):
    leak = [dict(type="test_leak", mib=leak_mib)] if leak_mib else []
    cfg = dict(
        name=tag, run_dir=os.path.join(WORK, tag), seed=5,
        data=dict(train=os.path.join(WORK, "data.h5"), shuffle=True),
        model=dict(input=[40, 36, 1], loss="softmax_cross_entropy", layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu")] + leak + [
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2)]),
        training=dict(batch_size=4, steps=8, optimizer=dict(type="adam", lr=0.01)),
        parallel=dict(grid=[2, 1]),
        checkpoint=dict(every_steps=100, keep=10, resume="auto"),
    )
    return write_config(WORK, tag, cfg, over)


def graph_config(tag, **over):
    """A graph (SPEC section 7): a residual add, dropout, a U-Net style skip through an
    upsampling and a concatenation, zero padding and cropping; group and instance norm and
    stochastic depth (section 11)."""
    cfg = dict(
        name=tag, run_dir=os.path.join(WORK, tag), seed=5,
        data=dict(train=os.path.join(WORK, "data.h5"), shuffle=True),
        model=dict(input=[40, 36, 1], loss="softmax_cross_entropy", layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu", name="a"),
            dict(type="separable_conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="instance_norm", name="b"),
            dict(type="add", inputs=["b", "a"]),
            dict(type="dropout", rate=0.3),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="group_norm", groups=2),
            dict(type="upsampling2d", interpolation="bilinear", name="up"),
            dict(type="concatenate", inputs=["up", "a"]),
            dict(type="zero_padding2d", padding=1),
            dict(type="cropping2d", cropping=[[1, 1], [0, 2]]),
            dict(type="conv2d_transpose", filters=3, kernel=3, stride=2, padding="same"),
            dict(type="drop_path", rate=0.3),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2)]),
        training=dict(batch_size=4, steps=8, optimizer=dict(type="adam", lr=0.01)),
        parallel=dict(grid=[2, 1]),
        checkpoint=dict(every_steps=100, keep=10, resume="auto"),
    )
    return write_config(WORK, tag, cfg, over)


def train(cfg, *sets, binary=BIN):
    cmd = [binary, "train", cfg] + [a for s in sets for a in ("--set", s)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def weights(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and not name.startswith("halotrain/config") and obj.dtype.kind == "f":
                out[name] = np.array(obj)
        f.visititems(visit)
    return out


def same(a, b, rtol=0.0, atol=0.0):
    if a.keys() != b.keys():
        return False, f"different datasets {sorted(a.keys() ^ b.keys())}"
    for k in a:
        if rtol == 0 and atol == 0:
            if not np.array_equal(a[k], b[k]):
                return False, f"{k} differs (max {np.abs(a[k] - b[k]).max():.3g})"
        elif not np.allclose(a[k], b[k], rtol=rtol, atol=atol):
            return False, f"{k} differs beyond tolerance (max {np.abs(a[k] - b[k]).max():.3g})"
    return True, ""


def ckpt(tag, step):
    return os.path.join(WORK, tag, "checkpoints", f"ckpt-{step}.h5")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    # 6 images, batch 4: steps cross epoch boundaries with a fresh permutation each epoch.
    subprocess.run([BIN, "make-data", os.path.join(WORK, "data.h5"), "--count", "6", "--height", "40",
                    "--width", "36", "--classes", "2"], check=True, capture_output=True)

    r = train(config("straight"))
    check("straight run trains", r.returncode == 0, r.stderr[-2000:])
    ref = weights(ckpt("straight", 8))

    cfg = config("resumed")
    r1 = train(cfg, "training.steps=4")
    r2 = train(cfg)
    ok, why = same(ref, weights(ckpt("resumed", 8))) if r1.returncode == 0 and r2.returncode == 0 else (False, r2.stderr[-2000:])
    check("4 steps + resume to 8 == 8 steps, bit for bit", ok, why)
    check("the resumed run says where it resumed from", "resuming from" in r2.stderr and "at step 4" in r2.stderr,
          r2.stderr[-1000:])

    r = train(config("in_process", **{"recycle.every_steps": 3, "recycle.mode": "in_process"}))
    ok, why = same(ref, weights(ckpt("in_process", 8))) if r.returncode == 0 else (False, r.stderr[-2000:])
    check("recycle in_process every 3 steps == no recycle, bit for bit", ok, why)
    check("in_process recycling happened", r.stderr.count("recycled the device state") == 2, r.stderr[-1000:])

    r = train(config("restart", **{"recycle.every_steps": 3, "recycle.mode": "restart"}))
    ok, why = same(ref, weights(ckpt("restart", 8))) if r.returncode == 0 else (False, r.stderr[-2000:])
    check("recycle restart every 3 steps == no recycle, bit for bit", ok, why)
    check("restart relaunched the worker twice", r.stderr.count("starting it again") == 2, r.stderr[-1000:])

    cfg = config("regrid")
    r1 = train(cfg, "training.steps=4")
    r2 = train(cfg, "parallel.grid=[1,2]")
    ok, why = same(ref, weights(ckpt("regrid", 8)), rtol=1e-4, atol=1e-5) if r2.returncode == 0 else (False, r2.stderr[-2000:])
    check("train on 2x1, resume on 1x2: equal within float tolerance", ok, why)

    # A graph with dropout: resume and recycling are bit for bit too, and another grid
    # draws the same dropout masks (equal within float tolerance).
    r = train(graph_config("graph-straight"))
    check("graph: straight run trains", r.returncode == 0, r.stderr[-2000:])
    gref = weights(ckpt("graph-straight", 8)) if r.returncode == 0 else {}
    cfg = graph_config("graph-resumed")
    r1 = train(cfg, "training.steps=4")
    r2 = train(cfg)
    ok, why = same(gref, weights(ckpt("graph-resumed", 8))) if r1.returncode == 0 and r2.returncode == 0 else (
        False, r1.stderr[-1000:] + r2.stderr[-1000:])
    check("graph: 4 steps + resume to 8 == 8 steps, bit for bit", ok, why)
    r = train(graph_config("graph-in_process", **{"recycle.every_steps": 3, "recycle.mode": "in_process"}))
    ok, why = same(gref, weights(ckpt("graph-in_process", 8))) if r.returncode == 0 else (False, r.stderr[-2000:])
    check("graph: recycle in_process every 3 steps == no recycle, bit for bit", ok, why)
    r = train(graph_config("graph-1x1", **{"parallel.grid": [1, 1]}))
    ok, why = same(gref, weights(ckpt("graph-1x1", 8)), rtol=1e-4, atol=1e-5) if r.returncode == 0 else (
        False, r.stderr[-2000:])
    check("graph: grid 1x1 == grid 2x1 within float tolerance (the same dropout masks)", ok, why)

    # Torn newest file: truncate ckpt-8 of the straight run, then ask for 10 steps.
    torn = ckpt("straight", 8)
    shutil.copy(ckpt("resumed", 4), ckpt("straight", 4))
    with open(torn, "r+b") as f:
        f.truncate(os.path.getsize(torn) // 2)
    r = train(config("straight", **{"training.steps": 10}))
    check("a torn newest checkpoint is skipped, naming it and the one used",
          r.returncode == 0 and "skipping " + torn in r.stderr and "resuming from " + ckpt("straight", 4) in r.stderr,
          r.stderr[-2000:])

    # Another model in the same run_dir: refused.
    r = train(config("resumed", **{"training.steps": 12}), "model.layers[4].filters=5")
    check("a checkpoint of another model is refused (exit 1, says why)",
          r.returncode == 1 and "another model" in r.stderr, r.stderr[-1000:])

    # Leak: 64 MiB per step for 9 steps; restart every 3 steps keeps each process small.
    rss = lambda text: [float(x) for x in re.findall(r"process peak RSS ([0-9.]+) MiB", text)]
    r = train(config("leaky", leak_mib=64, **{"training.steps": 9}), binary=BIN_TEST_LAYERS)
    grow = rss(r.stderr)
    r = train(config("leaky_restart", leak_mib=64,
                     **{"training.steps": 9, "recycle.every_steps": 3, "recycle.mode": "restart"}),
              binary=BIN_TEST_LAYERS)
    bounded = rss(r.stderr)
    check("without recycling the leak grows the process (> 9 x 64 MiB)", grow and max(grow) > 9 * 64, str(grow))
    check("with restart every 3 steps every process stays under 4 x 64 MiB + base",
          len(bounded) == 3 and max(bounded) < min(grow) - 4 * 64, str(bounded))

    # Disk full while writing: RLIMIT_FSIZE stops the write; clear error, old files intact.
    cfg = config("diskfull", **{"checkpoint.every_steps": 1})
    r = train(cfg, "training.steps=2")
    good = ckpt("diskfull", 2)
    before = open(good, "rb").read() if os.path.exists(good) else b""
    limit_kib = 8
    r = subprocess.run(["bash", "-c", f"ulimit -f {limit_kib}; exec {BIN} train {cfg} --set training.steps=4"],
                       capture_output=True, text=True, timeout=300)
    leftovers = [f for f in os.listdir(os.path.dirname(good)) if ".tmp" in f]
    check("disk full during a checkpoint: exit 1 with a message naming the file, no temp file left",
          r.returncode == 1 and "intact" in r.stderr and "internal error" not in r.stderr and "ckpt-3.h5" in r.stderr and not leftovers and not os.path.exists(ckpt("diskfull", 3)),
          f"exit {r.returncode} leftovers {leftovers} {r.stderr[-1500:]}")
    check("disk full: the previous checkpoint is intact",
          before and open(good, "rb").read() == before and subprocess.run([BIN, "inspect", good],
                                                                         capture_output=True).returncode == 0)

    # Killed while training with a checkpoint every step: the next run resumes from a good file.
    cfg = config("killed", **{"checkpoint.every_steps": 1, "training.steps": 100000})
    proc = subprocess.Popen([BIN, "train", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time
    deadline = time.time() + 60
    ckdir = os.path.join(WORK, "killed", "checkpoints")
    while time.time() < deadline and len(os.listdir(ckdir) if os.path.isdir(ckdir) else []) < 3:
        time.sleep(0.05)
    time.sleep(0.137)
    proc.kill()
    proc.wait()
    r = train(cfg, "training.steps=%d" % (max(int(f[5:-3]) for f in os.listdir(ckdir) if f.endswith(".h5")) + 1))
    check("killed mid-run (kill -9): the next run resumes from the last good checkpoint",
          r.returncode == 0 and "resuming from" in r.stderr, r.stderr[-1500:])

    # Strict init_weights of another model: one line naming layer, weight, both shapes.
    r = train(config("strict", **{"training.init_weights": ckpt("resumed", 8), "checkpoint.resume": "never"}),
              "model.layers[0].filters=3", "model.layers[4].filters=3")
    check("init_weights with other shapes: exit 1 naming layer, weight, expected and found",
          r.returncode == 1 and "conv2d_1 weight kernel:0: the model expects (3, 3, 1, 3)" in r.stderr
          and "is (3, 3, 1, 4)" in r.stderr, r.stderr[-800:])

    failed = RESULTS.count(False)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
