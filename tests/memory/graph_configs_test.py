#!/usr/bin/python3
"""The graph configs train on CPU with the memory model exact.

- configs/unet-demo.yaml as shipped: exits 0, memory.csv's predicted peak equals the
  measured one on every rank, and the last validation's dice is above 0.5;
- configs/resnet-mammo.yaml (a CUDA config for 5928 x 4728 images) on the CPU backend at
  1/16 of the size, 2 steps on its grid [2, 1] with its planned policies, with recompute
  and with parallel.fuse false: exits 0, predicted == measured on every rank, and the
  three final checkpoints are bit-identical (its batch norm + ReLU chains are exact);
- configs/nnunet-demo.yaml as shipped (instance norm): the same as unet-demo;
- configs/efficientnet-mammo.yaml (torchvision's EfficientNet-B0 for the seed case) on the
  CPU backend at 1/16 of the size, 2 steps on grid [3, 1], its tail gathered: exits 0 and
  predicted == measured on every rank.

usage: graph_configs_test.py HALOTRAIN WORKDIR
"""
import csv
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import checkpoints  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs")
FAILED = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    if not ok:
        FAILED.append(name)


def train(tag, config, sets):
    work = os.path.join(WORK, tag)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cmd = [BIN, "train", os.path.join(CONFIGS, config)] + [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)
    check(f"{tag}: trains", proc.returncode == 0, "" if proc.returncode == 0 else proc.stdout[-3000:] + proc.stderr[-3000:])
    return work, proc.stdout + proc.stderr


def exact_memory(tag, run_dir):
    path = os.path.join(run_dir, "memory.csv")
    if not os.path.exists(path):
        check(f"{tag}: memory.csv", False, "missing")
        return
    with open(path) as f:
        rows = list(csv.DictReader(f))
    pairs = [(int(r["peak_device_bytes"]), int(r["predicted_peak_device_bytes"])) for r in rows]
    check(f"{tag}: predicted == measured peak on every rank", bool(pairs) and all(m == p for m, p in pairs),
          ", ".join(f"r{i} {m}/{p}" for i, (m, p) in enumerate(pairs)))


for demo in ("unet-demo", "nnunet-demo"):
    work, out = train(demo, f"{demo}.yaml", [])
    exact_memory(demo, os.path.join(work, "runs", demo))
    dice = [float(v) for v in re.findall(r"val_dice ([0-9.]+)", out)]
    check(f"{demo}: learns (last val_dice > 0.5)", bool(dice) and dice[-1] > 0.5, f"val_dice {dice}")

small = ["parallel.backend=cpu", "parallel.device_memory=4GiB", "model.input=[371,296,1]",
         "data.synthesize.height=371", "data.synthesize.width=296", "training.steps=2", "checkpoint.every_steps=0",
         "recycle.every_steps=0"]
for tag, extra in (("auto", []), ("recompute", []), ("unfused", ["parallel.fuse=false"])):
    tag = f"resnet-mammo-{tag}"
    policy = "recompute" if tag.endswith("recompute") else "auto"
    work, _ = train(tag, "resnet-mammo.yaml",
                    small + [f"parallel.activations={policy}", f"run_dir=runs/{tag}"] + extra)
    exact_memory(tag, os.path.join(work, "runs", tag))
# Its batch norm + ReLU chains (no pool after them) run the kernels of the layers apart in
# fewer passes, with the same bits; every policy runs the same kernels.
final = {t: os.path.join(WORK, f"resnet-mammo-{t}", "runs", f"resnet-mammo-{t}", "checkpoints", "ckpt-2.h5")
         for t in ("auto", "recompute", "unfused")}
for t in ("recompute", "unfused"):
    if os.path.exists(final["auto"]) and os.path.exists(final[t]):
        diff = checkpoints.differences(final["auto"], final[t])
        check(f"resnet-mammo-{t}: checkpoint bit-identical to auto's", not diff, "; ".join(diff[:8]))
    else:
        check(f"resnet-mammo-{t}: checkpoints written", False, f"{final['auto']}, {final[t]}")

work, _ = train("efficientnet-mammo", "efficientnet-mammo.yaml",
                small + ["parallel.grid=[3,1]", "run_dir=runs/efficientnet-mammo"])
exact_memory("efficientnet-mammo", os.path.join(work, "runs", "efficientnet-mammo"))

print(f"{len(FAILED)} failed" if FAILED else "all passed")
sys.exit(1 if FAILED else 0)
