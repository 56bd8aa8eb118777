#!/usr/bin/env python3
"""halotrain (backend cuda) vs PyTorch with cuDNN on the same GPU, model, batch and run.

For the demo model at 1024 x 768 (batch 4) and the seed model (configs/seed-k80.yaml) at
2048 x 2048 (batch 2):
  - halotrain grid 1x1 and grid 2x1 (two shard threads sharing GPU 0, halos and gradient
    sums through the host): median step time over the steps after WARMUP, from
    run_dir/metrics.csv (`seconds`: one optimizer step, reading the batch's tiles from
    HDF5 included);
  - PyTorch float32 on the same GPU (cudnn.benchmark on, the batch already on the
    device): median of forward + loss + backward + Adam step, synchronized;
  - the ratio halotrain / torch, and the share of a 2x1 step that sharding adds on one
    GPU, 1 - t(1x1)/t(2x1): an upper bound of the halo exchange and all-reduce time (both
    shards also compete for the same GPU).
Needs torch with CUDA (the GPU machine's Python); no h5py (halotrain makes its own data).
Prints one line per model and, with --out, a markdown table. Exit 0 when every run
completed (no speed goal is checked here).

usage: gpu_vs_torch.py --halotrain BIN [--workdir DIR] [--steps N] [--out FILE.md]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WARMUP = 3  # cuDNN algorithm search, first touch of every buffer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import DEMO, SEED, torch_sequential  # noqa: E402

MODELS = [("demo 1024x768 b4", DEMO, 1024, 768, 4), ("seed model 2048x2048 b2", SEED, 2048, 2048, 2)]


def halotrain_step(binary, work, tag, layers, h, w, batch, grid, steps):
    data = os.path.join(work, f"data-{h}x{w}.h5")
    if not os.path.exists(data):
        subprocess.run([binary, "make-data", data, "--count", str(2 * batch), "--height", str(h), "--width",
                        str(w), "--classes", "2", "--seed", "7"], check=True, stdout=subprocess.DEVNULL)
    run_dir = os.path.join(work, "run-" + tag)
    cfg = dict(name=tag, run_dir=run_dir, seed=1234,
               data=dict(train=data, images="images", targets="labels", shuffle=True),
               model=dict(input=[h, w, 1], layers=layers, loss="softmax_cross_entropy"),
               training=dict(batch_size=batch, steps=steps, optimizer=dict(type="adam", lr=1e-4), log_every=1),
               parallel=dict(backend="cuda", grid=grid, device_memory="11441MiB", devices_per_node=1),
               checkpoint=dict(every_steps=0, keep=1, resume="never"))
    path = os.path.join(work, tag + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    proc = subprocess.run([binary, "train", path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"halotrain train {path} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        head = f.readline().strip().split(",")
        secs = [float(dict(zip(head, line.strip().split(",")))["seconds"]) for line in f]
    return statistics.median(secs[WARMUP:] if len(secs) > WARMUP else secs)


def torch_step(layers, h, w, batch, steps):
    import torch
    import torch.nn as nn
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = torch_sequential(layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-7)
    x = torch.rand(batch, 1, h, w, device=dev)
    y = torch.randint(0, 2, (batch,), device=dev)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--halotrain", required=True)
    p.add_argument("--workdir", default="/tmp/halotrain-gpu-bench")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    import torch
    if not torch.cuda.is_available():
        print("gpu_vs_torch: torch sees no CUDA device")
        return 1
    gpu = torch.cuda.get_device_name(0)
    rows = []
    for name, layers, h, w, batch in MODELS:
        tag = name.split()[0]
        one = halotrain_step(args.halotrain, args.workdir, tag + "-1x1", layers, h, w, batch, [1, 1], args.steps)
        two = halotrain_step(args.halotrain, args.workdir, tag + "-2x1", layers, h, w, batch, [2, 1], args.steps)
        ref = torch_step(layers, h, w, batch, args.steps)
        rows.append((name, one, two, ref))
        print(f"{name}: halotrain 1x1 {one * 1e3:.2f} ms, 2x1 {two * 1e3:.2f} ms; torch {ref * 1e3:.2f} ms; "
              f"ratio 1x1 {one / ref:.2f}x, 2x1 {two / ref:.2f}x; sharding share of a 2x1 step "
              f"{100 * max(0.0, 1 - one / two):.0f}% ({gpu})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"GPU: {gpu}; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}\n\n")
            f.write("| model | halotrain 1x1 | halotrain 2x1 | torch | 1x1 / torch | 2x1 / torch | sharding share |\n")
            f.write("|---|---|---|---|---|---|---|\n")
            for name, one, two, ref in rows:
                f.write(f"| {name} | {one * 1e3:.2f} ms | {two * 1e3:.2f} ms | {ref * 1e3:.2f} ms | {one / ref:.2f} | "
                        f"{two / ref:.2f} | {100 * max(0.0, 1 - one / two):.0f}% |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
