#!/usr/bin/python3
"""halotrain (CPU backend) vs PyTorch 1.13 CPU on the same model, data, batch and threads.

Measures, on this machine:
  (a) grid 1x1, T threads (default 2): median step time halotrain / torch.
  (b) grid 2x1, two shards as threads of one process (T/2 threads each) vs torch on T.
  (c) peak tracked bytes per shard at grid P = 1, 2, 4 at 2048x2048 vs grid 1x1
      (goal: <= 1/P + 10% of the 1x1 peak).
Step time: halotrain's run_dir/metrics.csv `seconds` (wall time of one optimizer step,
data loading from HDF5 included), median over the steps after the first WARMUP; torch:
wall time of forward + loss + backward + Adam step on a batch already in memory, median
over the same number of steps after the same warm-up. Peak: halotrain's
`peak_device_bytes` (max over ranks of its counting allocator's high-water mark);
torch: growth of the process's peak RSS (getrusage ru_maxrss) from after the model and
the data are loaded to the end of the timed steps: tensors, autograd and the allocator
cache together, so it is an upper bound of what torch's tensors need at once. For context
halotrain's whole-process peak RSS (getrusage of the child: all shards, oneDNN scratch,
HDF5 buffers, the allocator's cached blocks) is shown beside its tracked peak.

Torch runs twice: with glibc's default heap (every large tensor is mmapped and unmapped,
so each step page-faults its activations in again) and with a warm heap (GLIBC_TUNABLES
keep freed memory); the goals are checked against the faster of the two.
Exit status 0 when every goal is met, 1 otherwise.

usage: cpu_vs_torch.py --halotrain BIN [--workdir DIR] [--threads T] [--repeat R] [--out FILE.md]
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time

WARMUP = 2  # steps not timed: oneDNN primitive creation, first-touch of every buffer
TIMED = 6

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import DEMO as LAYERS, torch_sequential  # noqa: E402

CLASSES = 2
LR = 0.003


def flow(d):
    return "{" + ", ".join(f"{k}: {v if not isinstance(v, bool) else str(v).lower()}"
                           for k, v in d.items()) + "}"


def write_config(path, run_dir, data, h, w, grid, batch, steps, layers=LAYERS, device_memory="16GiB"):
    """A training config for the CPU backend, no checkpoints (bench/speed.py uses it too)."""
    layers = "\n".join("    - " + flow(l) for l in layers)
    text = f"""name: bench
run_dir: {run_dir}
seed: 1234
data: {{train: {data}, images: images, targets: labels, shuffle: true}}
model:
  input: [{h}, {w}, 1]
  layers:
{layers}
  loss: softmax_cross_entropy
training:
  batch_size: {batch}
  steps: {steps}
  optimizer: {{type: adam, lr: {LR}}}
  log_every: 1
parallel: {{backend: cpu, grid: [{grid[0]}, {grid[1]}], device_memory: {device_memory}}}
checkpoint: {{every_steps: 0, keep: 1, resume: never}}
"""
    with open(path, "w") as f:
        f.write(text)


def make_data(binary, path, count, h, w):
    if not os.path.exists(path):
        subprocess.run([binary, "make-data", path, "--count", str(count), "--height", str(h),
                        "--width", str(w), "--classes", str(CLASSES), "--seed", "7"],
                       check=True, stdout=subprocess.DEVNULL)


def run_halotrain(args, tag, data, h, w, grid, batch, steps):
    run_dir = os.path.join(args.workdir, "run-" + tag)
    # Every run a fresh one: train refuses a run_dir holding another run's checkpoints
    # under resume: never.
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = os.path.join(args.workdir, tag + ".yaml")
    write_config(cfg, run_dir, data, h, w, grid, batch, steps)
    env = dict(os.environ)
    # The launcher gives each shard thread cores/shards OpenMP threads.
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.Popen([args.halotrain, "train", cfg], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"halotrain train {cfg} exited {proc.returncode}")
    rows = []
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        head = f.readline().strip().split(",")
        for line in f:
            rows.append(dict(zip(head, line.strip().split(","))))
    secs = [float(r["seconds"]) for r in rows]
    timed = secs[WARMUP:] if len(secs) > WARMUP else secs
    return dict(median=statistics.median(timed), steps=secs,
                peak=max(int(r["peak_device_bytes"]) for r in rows), rss=usage.ru_maxrss * 1024)


# ---- torch side: runs in a child process so its peak RSS is its own ----

def torch_worker(data, h, w, batch, steps, threads):
    import h5py
    import numpy as np
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    with h5py.File(data, "r") as f:
        images = np.ascontiguousarray(f["images"][...].transpose(0, 3, 1, 2), dtype=np.float32)
        labels = f["labels"][...].astype(np.int64)
    model = torch_sequential(LAYERS)
    opt = torch.optim.Adam(model.parameters(), lr=LR, eps=1e-7)
    n = images.shape[0]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for step in range(steps):
        idx = [(step * batch + i) % n for i in range(batch)]
        t0 = time.perf_counter()
        x = torch.from_numpy(images[idx])
        y = torch.from_numpy(labels[idx])
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    timed = times[WARMUP:] if len(times) > WARMUP else times
    print(json.dumps(dict(median=statistics.median(timed), steps=times, peak=rss1 - rss0)))


# glibc returns every large free block to the kernel (munmap), so each torch step faults its
# activations in again; on a VM a page fault is dear. These tunables keep freed memory in
# the heap: torch with a warm heap, the fairer comparison of the compute itself.
WARM_HEAP = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1000000000000"


def run_torch(data, h, w, batch, steps, threads, warm_heap=False):
    env = dict(os.environ)
    if warm_heap:
        env["GLIBC_TUNABLES"] = WARM_HEAP
    out = subprocess.run([sys.executable, __file__, "--torch-worker", data, str(h), str(w), str(batch),
                          str(steps), str(threads)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def repeated(fn, repeat):
    """Runs fn() `repeat` times; the median run by its median step time."""
    runs = sorted((fn() for _ in range(repeat)), key=lambda r: r["median"])
    best = dict(runs[len(runs) // 2])
    best["medians"] = [r["median"] for r in runs]
    return best


def machine():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    flags = open("/proc/cpuinfo").read()
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "SSE")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {model} ({isa}), {mem:.0f} GiB, {platform.platform()}, "
            f"load average at start {os.getloadavg()[0]:.2f}")


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def report(lines, out):
    """Prints a benchmark's markdown and writes it to `out` (when given)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        a = sys.argv[2:]
        torch_worker(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--halotrain", required=True)
    p.add_argument("--workdir", default="/tmp/halotrain-bench")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="runs per step-time measurement")
    p.add_argument("--out", default=None, help="markdown table to write")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    T, steps = args.threads, WARMUP + TIMED
    started = time.time()
    lines = [f"Machine: {machine()}; {datetime.date.today()}; torch threads {T}.", ""]
    ok = True

    # (a), (b): 1024 x 768, batch 4.
    h, w, batch = 1024, 768, 4
    data = os.path.join(args.workdir, f"data{h}x{w}.h5")
    make_data(args.halotrain, data, 8, h, w)
    R = args.repeat
    td = repeated(lambda: run_torch(data, h, w, batch, steps, T), R)
    tw = repeated(lambda: run_torch(data, h, w, batch, steps, T, warm_heap=True), R)
    t = min(td, tw, key=lambda r: r["median"])  # the goal is against torch's better figure
    a = repeated(lambda: run_halotrain(args, "a-1x1", data, h, w, (1, 1), batch, steps), R)
    b = repeated(lambda: run_halotrain(args, "b-2x1", data, h, w, (2, 1), batch, steps), R)
    ra, rb = a["median"] / t["median"], b["median"] / t["median"]
    ok &= ra <= 1.0 and rb <= 1.0

    def spread(r):
        return "/".join(f"{m:.3f}" for m in r["medians"])

    lines += [f"### Step time, {h}x{w}x1, batch {batch}: median of {TIMED} steps after {WARMUP}, "
              f"median of {R} runs (all runs' medians in brackets)", "",
              "| run | median step [runs] | images/s | peak memory | vs torch best | goal |",
              "|---|---|---|---|---|---|",
              f"| torch {T} threads, default glibc heap | {td['median']:.3f} s [{spread(td)}] | "
              f"{batch / td['median']:.2f} | {mib(td['peak'])} (RSS growth) | "
              f"{td['median'] / t['median']:.2f} | |",
              f"| torch {T} threads, warm heap (GLIBC_TUNABLES) | {tw['median']:.3f} s [{spread(tw)}] | "
              f"{batch / tw['median']:.2f} | {mib(tw['peak'])} (RSS growth) | "
              f"{tw['median'] / t['median']:.2f} | |",
              f"| (a) halotrain grid 1x1, {T} threads | {a['median']:.3f} s [{spread(a)}] | "
              f"{batch / a['median']:.2f} | {mib(a['peak'])} tracked, {mib(a['rss'])} process RSS | "
              f"{ra:.2f} | "
              f"<= 1.0 {'ok' if ra <= 1 else 'MISSED'} |",
              f"| (b) halotrain grid 2x1, 2 shard threads x {max(1, T // 2)} | {b['median']:.3f} s "
              f"[{spread(b)}] | {batch / b['median']:.2f} | {mib(b['peak'])} tracked per shard, "
              f"{mib(b['rss'])} process RSS | {rb:.2f} | "
              f"<= 1.0 {'ok' if rb <= 1 else 'MISSED'} |", ""]

    # (c): 2048 x 2048, batch 2: the peak is reached in the first step and repeats.
    h, w, batch = 2048, 2048, 2
    data = os.path.join(args.workdir, f"data{h}x{w}.h5")
    make_data(args.halotrain, data, 4, h, w)
    tc = run_torch(data, h, w, batch, WARMUP + 2, T)
    lines += [f"### Peak tracked bytes per shard, {h}x{w}x1, batch {batch} (one run each)", "",
              "| grid | shards P | peak tracked per shard | ratio to 1x1 | goal <= 1/P + 0.10 | "
              "process max RSS (all shards) | median step |",
              "|---|---|---|---|---|---|---|",
              f"| torch {T} threads, whole image | 1 | | | | {mib(tc['peak'])} (growth) | "
              f"{tc['median']:.3f} s |"]
    base = None
    for grid in [(1, 1), (2, 1), (2, 2)]:
        P = grid[0] * grid[1]
        r = run_halotrain(args, f"c-{grid[0]}x{grid[1]}", data, h, w, grid, batch, WARMUP + 2)
        base = base or r["peak"]
        ratio, goal = r["peak"] / base, 1 / P + 0.10
        ok &= ratio <= goal
        lines.append(f"| {grid[0]}x{grid[1]} | {P} | {mib(r['peak'])} | {ratio:.3f} | {goal:.3f} "
                     f"{'ok' if ratio <= goal else 'MISSED'} | {mib(r['rss'])} | {r['median']:.3f} s |")
    lines += ["", f"Bench wall time {time.time() - started:.0f} s."]
    report(lines, args.out)
    print(f"ratios: grid1x1/torch {ra:.3f}  grid2x1/torch {rb:.3f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
