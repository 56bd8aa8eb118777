#!/usr/bin/python3
"""What squeeze-excitation's collectives cost: EfficientNet-B0 (configs/efficientnet-mammo.yaml,
torchvision's, one input channel) trained a few steps on grid 2x2 (shard threads of one
process on this machine's cores), at a small image so that a step takes seconds.

Each squeeze-excitation block sums its global pool over the shards in forward and the
gate's gradient in backward (multiply with a channel vector). The trainer logs the wall
time every layer kind spends in collectives, waiting for the slowest shard included; this
reports the squeeze-excitation's share (global_avg_pool and multiply) of the step time, and
batch norm's beside it. Goal: the squeeze-excitation share under 10%.
Exit status 0 when the goal is met, 1 otherwise.

usage: se_cost.py --halotrain BIN [--workdir DIR] [--size N] [--steps S] [--out FILE.md]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cpu_vs_torch import machine  # noqa: E402

GOAL = 0.10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--halotrain", required=True)
    ap.add_argument("--workdir", default="se-cost")
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    with open(os.path.join(HERE, "..", "configs", "efficientnet-mammo.yaml")) as f:
        cfg = yaml.safe_load(f)
    n = args.size
    cfg["run_dir"] = os.path.join(args.workdir, "run")
    cfg["data"]["train"] = os.path.join(args.workdir, "data.h5")
    cfg["data"]["synthesize"] = dict(count=4, height=n, width=n, channels=1, classes=2)
    cfg["model"]["input"] = [n, n, 1]
    cfg["training"].update(steps=args.steps, batch_size=2, log_every=1)
    cfg["parallel"].update(backend="cpu", grid=[2, 2], device_memory="20GiB", activations="keep")
    cfg["checkpoint"] = dict(every_steps=0, keep=1, resume="never")
    cfg["recycle"] = dict(every_steps=0)
    path = os.path.join(args.workdir, "efficientnet.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run([args.halotrain, "train", path], capture_output=True, text=True, env=env, timeout=3600)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        sys.exit(f"se_cost: training failed:\n{log[-4000:]}")
    m = re.search(r"collectives inside layers, per step on rank 0 \(waiting included\): (.*); ([0-9.]+)% of the step", log)
    if not m:
        sys.exit(f"se_cost: no collective times in the log:\n{log[-2000:]}")
    per_kind = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+) ms", m.group(1))}
    total_share = float(m.group(2)) / 100
    all_ms = sum(per_kind.values())
    step_ms = all_ms / total_share
    se_ms = per_kind.get("global_avg_pool", 0) + per_kind.get("multiply", 0)
    share = se_ms / step_ms
    lines = [f"## Squeeze-excitation's collectives ({machine()})", "",
             f"EfficientNet-B0 (configs/efficientnet-mammo.yaml) at {n} x {n}, batch 2, grid 2x2 (threads), "
             f"{args.steps} steps; mean step {step_ms:.0f} ms.", "",
             "| layer kind | collective time per step | share of the step |", "|---|---|---|"]
    for kind, ms in sorted(per_kind.items()):
        lines.append(f"| {kind} | {ms:.2f} ms | {100 * ms / step_ms:.2f}% |")
    lines += ["", f"squeeze-excitation (global_avg_pool + multiply): {100 * share:.2f}% of the step "
              f"(goal < {100 * GOAL:.0f}%): {'met' if share < GOAL else 'MISSED'}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    sys.exit(0 if share < GOAL else 1)


if __name__ == "__main__":
    main()
