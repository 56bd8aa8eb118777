#!/usr/bin/python3
"""Conv + activation chains (step_schedule.hpp conv_heads_chains) end to end.

A model of conv2d -> ReLU, conv2d -> ReLU6, depthwise_conv2d -> ReLU and a stride-2
conv2d -> ReLU, on grid [2, 2] (four shards as threads, halos on both axes), trained 3
steps with parallel.activations keep, offload and recompute, and keep with
parallel.fuse false. Checks:

- every run exits 0, and `plan` lists the four chains;
- the final checkpoints are bit-identical to the unfused run's (the chain runs the
  layers' own arithmetic: the ReLU in the conv's pass, the mask over the output gradient);
- per rank in each run's memory.csv the measured peak device bytes equal the memory
  model's prediction.

usage: conv_chain_test.py HALOTRAIN WORKDIR
"""
import csv
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import checkpoints  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
STEPS = 3
FAILED = []

CONFIG = """name: conv-chain
seed: 7
run_dir: {work}/default
data: {{train: {work}/data.h5, synthesize: {{count: 8, height: 96, width: 80, channels: 1, classes: 2}}}}
model:
  input: [96, 80, 1]
  layers:
    - {{type: conv2d, filters: 8, kernel: 3, padding: same}}
    - {{type: relu}}
    - {{type: conv2d, filters: 16, kernel: 3, padding: same}}
    - {{type: relu6}}
    - {{type: depthwise_conv2d, kernel: 3, padding: same}}
    - {{type: relu}}
    - {{type: conv2d, filters: 8, kernel: 3, stride: 2, padding: same}}
    - {{type: relu}}
    - {{type: global_avg_pool}}
    - {{type: dense, units: 2}}
  loss: softmax_cross_entropy
training:
  batch_size: 4
  steps: {steps}
  optimizer: {{type: adam, lr: 0.01}}
parallel: {{backend: cpu, grid: [2, 2]}}
checkpoint: {{every_steps: 0, keep: 1, resume: never}}
"""


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    if not ok:
        FAILED.append(name)
    return ok


def run(args):
    cmd = [BIN] + args
    return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    config = os.path.join(WORK, "conv-chain.yaml")
    with open(config, "w") as f:
        f.write(CONFIG.format(work=WORK, steps=STEPS))

    cmd, p = run(["plan", config])
    fused = next((l for l in p.stdout.splitlines() if l.strip().startswith("fused")), "")
    check("plan lists the four conv chains",
          p.returncode == 0 and all(f"{c} + {a}" in fused for c, a in
                                    (("conv2d_1", "activation_1"), ("conv2d_2", "re_lu_1"),
                                     ("depthwise_conv2d_1", "activation_2"), ("conv2d_3", "activation_3"))),
          f"exit {p.returncode}, '{fused}'; {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")

    ckpt = {}
    for tag, policy, fuse in (("unfused", "keep", "false"), ("keep", "keep", "true"),
                              ("offload", "offload", "true"), ("recompute", "recompute", "true")):
        run_dir = os.path.join(WORK, tag)
        cmd, p = run(["train", config, "--set", f"run_dir={run_dir}", "--set", f"parallel.activations={policy}",
                      "--set", f"parallel.fuse={fuse}"])
        if not check(f"{tag}: train exits 0", p.returncode == 0,
                     f"exit {p.returncode}; {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"):
            continue
        ckpt[tag] = os.path.join(run_dir, "checkpoints", f"ckpt-{STEPS}.h5")
        with open(os.path.join(run_dir, "memory.csv")) as f:
            rows = list(csv.DictReader(f))
        pairs = [(int(r["peak_device_bytes"]), int(r["predicted_peak_device_bytes"])) for r in rows]
        check(f"{tag}: predicted == measured peak on every rank", len(pairs) == 4 and all(m == q for m, q in pairs),
              ", ".join(f"r{i} {m}/{q}" for i, (m, q) in enumerate(pairs)))

    if "unfused" in ckpt:
        for tag in ckpt:
            if tag == "unfused":
                continue
            diff = checkpoints.differences(ckpt["unfused"], ckpt[tag])
            check(f"{tag}: checkpoint bit-identical to the unfused run's", not diff,
                  f"{len(diff)} differ: " + "; ".join(diff[:8]))
    print(f"{'FAILED' if FAILED else 'passed'}: {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
