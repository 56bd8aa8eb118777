#!/usr/bin/python3
"""Speed on one machine: what sharding costs, how close the step is to the machine's conv
throughput, what the process really uses, and how the step grows with the image.

Every figure is a ratio measured in this one run (`make bench` runs it):
  (1) grid: the conv3 model (bench/models.py: three 3x3 convs, 16-32 channels) at 768 x 768,
      batch 2, on grid 1x1 (one worker, all threads), 2x1 and 2x2 (shard threads of one
      process sharing the same cores). Goals: 2x1 within 2% of 1x1, 2x2 within 4%.
      Runs interleave (1x1, 2x1, 2x2, 1x1, ...) so a drift of the machine hits all alike; each
      ratio is the median over 5 rounds of the round's ratio to its own 1x1 run.
  (2) throughput: the training step in GFLOP/s of the model's counted flops (train_flops:
      conv and dense multiply-adds x 2 in forward and both backwards) against the best
      forward convolution of oneDNN's direct kernels that `halotrain_conv_throughput`
      measures in the same run (3x3, 64-128 channels; beside it the same convs on the kernel
      the step runs, Winograd's where the CPU has it, counted in the direct flops). Goals:
      >= 0.40 for the seed model at 1024 x 1024, >= 0.15 for the demo model at 1024 x 768;
      the conv3 model's step <= 0.75 of torch's. Beside it, PyTorch's best forward conv2d
      on the same shapes and threads, and the step's ratio to that.
  (3) memory: every halotrain run's process peak RSS (getrusage of the child: all shards)
      against its tracked peaks (memory.csv, summed over the shards of the process).
      Goal: RSS <= 1.25 x tracked + 256 MiB (the allocator's cache may hold up to a quarter
      more than the peak in use: worker/runtime/tensor.hpp).
  (4) scaling: the demo model's step from 512^2 to 4096^2 (batch 2), per megapixel, with
      the ratio to torch on the same image.
  (5) small channels: each pass of the seed's and demo's few-channel convs (and an RGB
      and a 16-channel one) on the kernels the step runs (kernels/cpu/conv_small.hpp where
      it serves) against oneDNN's alone, the median of 7 interleaved pairs.
Torch: PyTorch 1.13 CPU with a warm heap (bench/cpu_vs_torch.py says why), same model,
batch, data and threads, timed from a batch already in memory.
Exit status 0 when every goal is met, 1 otherwise.

usage: speed.py --halotrain BIN [--workdir DIR] [--threads T] [--repeat R] [--out FILE.md]
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cpu_vs_torch import WARM_HEAP, machine, make_data, mib, report, write_config  # noqa: E402
from models import MODELS, conv_shapes, torch_sequential, train_flops  # noqa: E402

WARMUP, TIMED = 2, 6
MiB = 2**20


def run_halotrain(args, model, tag, data, h, w, grid, batch, steps=WARMUP + TIMED, sets=()):
    run_dir = os.path.join(args.workdir, "run-" + tag)
    shutil.rmtree(run_dir, ignore_errors=True)  # every run a fresh one: no resume, no stale metrics
    cfg = os.path.join(args.workdir, tag + ".yaml")
    write_config(cfg, run_dir, data, h, w, grid, batch, steps, layers=MODELS[model], device_memory="20GiB")
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # the launcher divides the cores among the shards
    log = os.path.join(args.workdir, tag + ".log")
    with open(log, "w") as out:
        cmd = [args.halotrain, "train", cfg] + [a for kv in sets for a in ("--set", kv)]
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        with open(log) as f:
            raise RuntimeError(f"halotrain train {cfg} failed:\n{f.read()[-4000:]}")
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        head = f.readline().strip().split(",")
        rows = [dict(zip(head, line.strip().split(","))) for line in f]
    with open(os.path.join(run_dir, "memory.csv")) as f:
        head = f.readline().strip().split(",")
        mem = [dict(zip(head, line.strip().split(","))) for line in f]
    secs = [float(r["seconds"]) for r in rows]
    tracked = sum(int(m["peak_device_bytes"]) for m in mem)
    exact = all(m["peak_device_bytes"] == m["predicted_peak_device_bytes"] for m in mem)
    return dict(median=statistics.median(secs[WARMUP:]), tracked=tracked, exact=exact,
                rss=usage.ru_maxrss * 1024)


def torch_worker(model, data, batch, steps, threads):
    import h5py
    import numpy as np
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    with h5py.File(data, "r") as f:
        images = np.ascontiguousarray(f["images"][...].transpose(0, 3, 1, 2), dtype=np.float32)
        labels = f["labels"][...].astype(np.int64)
    net = torch_sequential(MODELS[model])
    opt = torch.optim.Adam(net.parameters(), lr=0.003, eps=1e-7)
    times = []
    for step in range(steps):
        idx = [(step * batch + i) % images.shape[0] for i in range(batch)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(torch.from_numpy(images[idx])), torch.from_numpy(labels[idx])).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps(dict(median=statistics.median(times[WARMUP:]))))


def torch_conv_worker(shapes, threads):
    """PyTorch's forward conv2d, 3x3 'same', on each (n, channels, height, width): the best
    of repeated calls for about 2 s each, in GFLOP/s (2 x multiply-adds)."""
    import torch
    torch.set_num_threads(threads)
    out = []
    with torch.no_grad():
        for n, c, h, w in shapes:
            x, k = torch.randn(n, c, h, w), torch.randn(c, c, 3, 3)
            torch.nn.functional.conv2d(x, k, padding=1)  # warm-up: primitive creation
            best, spent = float("inf"), 0.0
            while spent < 2.0:
                t0 = time.perf_counter()
                torch.nn.functional.conv2d(x, k, padding=1)
                dt = time.perf_counter() - t0
                best, spent = min(best, dt), spent + dt
            out.append(dict(n=n, channels=c, height=h, width=w, gflops=2.0 * n * c * c * 9 * h * w / best / 1e9))
    print(json.dumps(out))


def run_torch_conv(shapes, threads):
    env = dict(os.environ, GLIBC_TUNABLES=WARM_HEAP)
    arg = ";".join(",".join(str(v) for v in s) for s in shapes)
    out = subprocess.run([sys.executable, __file__, "--torch-conv", arg, str(threads)], check=True,
                         capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_torch(model, data, batch, threads, steps=WARMUP + TIMED):
    env = dict(os.environ, GLIBC_TUNABLES=WARM_HEAP)
    out = subprocess.run([sys.executable, __file__, "--torch-worker", model, data, str(batch), str(steps),
                          str(threads)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["median"]


def conv_throughput(args, extra=()):
    exe = os.path.join(os.path.dirname(args.halotrain), "bench", "halotrain_conv_throughput")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([exe, "--seconds", "2", *extra], check=True, capture_output=True, text=True, env=env)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def each_conv(args, model, h, w, batch):
    """[(cin, cout, height, width, GFLOP/s, seconds)] of the model's 3x3 convs, each conv's
    training passes timed alone on the kernels the step runs."""
    convs, _ = conv_shapes(MODELS[model], h, w)
    out = []
    for cin, cout, k, ch, cw, first in convs:
        assert k == 3, "halotrain_conv_throughput times 3x3 'same' convs"
        r = conv_throughput(args, ["--conv", f"{batch},{cin},{cout},{ch},{cw},{int(first)}"])[0]
        out.append((cin, cout, ch, cw, r["gflops"], r["seconds"]))
    return out


def convs_alone(convs):
    """GFLOP/s of all the convs of each_conv together: the step if nothing else took time."""
    return sum(gflops * seconds for *_, gflops, seconds in convs) / sum(c[5] for c in convs)


def data_file(args, h, w, count=4):
    path = os.path.join(args.workdir, f"data{h}x{w}.h5")
    make_data(args.halotrain, path, count, h, w)
    return path


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        a = sys.argv[2:]
        torch_worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-conv":
        torch_conv_worker([tuple(int(v) for v in s.split(",")) for s in sys.argv[2].split(";")], int(sys.argv[3]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--halotrain", required=True)
    p.add_argument("--workdir", default="/tmp/halotrain-speed")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="interleaved rounds of the grid runs")
    p.add_argument("--out", default=None, help="markdown to write")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    T = args.threads
    started = time.time()
    ok = True
    memory_rows = []

    def check_memory(name, r):
        nonlocal ok
        bound = 1.25 * r["tracked"] + 256 * MiB
        good = r["rss"] <= bound and r["exact"]
        ok &= good
        memory_rows.append(f"| {name} | {mib(r['tracked'])} | {'yes' if r['exact'] else 'NO'} | {mib(r['rss'])} | "
                           f"{r['rss'] / r['tracked']:.3f} | {mib(bound)} {'ok' if good else 'MISSED'} |")

    lines = [f"Machine: {machine()}; {datetime.date.today()}; {T} threads.", ""]

    # (1) grid
    h = w = 768
    batch = 2
    data = data_file(args, h, w)
    grids = [(1, 1), (2, 1), (2, 2)]
    runs = {g: [] for g in grids}
    for rnd in range(args.repeat):
        for g in grids:
            r = run_halotrain(args, "conv3", f"grid-{g[0]}x{g[1]}", data, h, w, g, batch)
            runs[g].append(r)
            if rnd == 0:
                check_memory(f"conv3 {h}x{w} grid {g[0]}x{g[1]}", r)
    torch_grid = statistics.median(run_torch("conv3", data, batch, T) for _ in range(args.repeat))
    med = {g: statistics.median(r["median"] for r in runs[g]) for g in grids}
    lines += [f"### (1) Grid on one machine: conv3 at {h}x{w}, batch {batch}, {T} cores", "",
              f"Median step of {TIMED} after {WARMUP}; median over {args.repeat} interleaved rounds (each run's "
              "median in brackets); vs 1x1: the median of the rounds' ratios, each to the 1x1 run of its round.",
              "",
              "| grid | shard threads x OpenMP threads | median step [runs] | vs 1x1 | goal | vs torch |",
              "|---|---|---|---|---|---|"]
    goals = {(1, 1): None, (2, 1): 1.02, (2, 2): 1.04}
    for g in grids:
        P = g[0] * g[1]
        ratio = statistics.median(a["median"] / b["median"] for a, b in zip(runs[g], runs[(1, 1)]))
        goal = goals[g]
        good = goal is None or ratio <= goal
        ok &= good
        spread = "/".join(f"{r['median']:.3f}" for r in runs[g])
        lines.append(f"| {g[0]}x{g[1]} | {P} x {max(1, T // P)} | {med[g]:.3f} s [{spread}] | {ratio:.3f} | "
                     f"{'' if goal is None else f'<= {goal:.2f} ' + ('ok' if good else 'MISSED')} | "
                     f"{med[g] / torch_grid:.2f} |")
    lines += [f"| torch, {T} threads | | {torch_grid:.3f} s | | | 1.00 |", ""]

    # (2) throughput
    ceiling = conv_throughput(args)
    best = max(c["gflops"] for c in ceiling)
    torch_ceiling = run_torch_conv([(c["n"], c["channels"], c["height"], c["width"]) for c in ceiling], T)
    torch_best = max(c["gflops"] for c in torch_ceiling)
    lines += ["### (2) Training step throughput against oneDNN's forward convolution", "",
              "oneDNN's direct forward conv, 3x3 'same', NCHW in and out (DnnlConv2d), best call: " +
              ", ".join(f"{c['n']}x{c['channels']}x{c['height']}x{c['width']} {c['gflops']:.1f} GFLOP/s"
                        for c in ceiling) + f"; ceiling {best:.1f} GFLOP/s. On the step's kernel "
              "(direct flops counted): " +
              ", ".join(f"{c['step_kernel_gflops']:.1f}{' (Winograd)' if c['winograd'] else ''}" for c in ceiling) +
              " GFLOP/s.", "",
              f"PyTorch's conv2d on the same shapes ({T} threads, best call): " +
              ", ".join(f"{c['gflops']:.1f}" for c in torch_ceiling) + f" GFLOP/s; its best {torch_best:.1f} "
              "GFLOP/s (the last column's yardstick).", "",
              "Beside each step: the model's own convs, every training pass of each timed alone on the "
              "kernels the step runs (what the step would reach if nothing but its convs took time), and "
              "torch's step in the same GFLOP/s.", "",
              "| model | image, batch | counted GFLOP per step | median step | GFLOP/s | vs ceiling | goal | "
              "its convs alone: GFLOP/s, vs ceiling | torch: GFLOP/s, vs ceiling | step vs torch | "
              "step vs PyTorch's best conv2d |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    per_conv = {}  # model: each_conv, for the table below
    for model, h, w, batch in [("seed", 1024, 1024, 2), ("demo", 1024, 768, 4), ("conv3", 768, 768, 2)]:
        data = data_file(args, h, w)
        r = run_halotrain(args, model, f"flops-{model}", data, h, w, (1, 1), batch)
        if model != "conv3":
            check_memory(f"{model} {h}x{w} grid 1x1", r)
        # conv3's torch step is table (1)'s, the median of its runs (one run varied 10-15% here)
        t = torch_grid if model == "conv3" else run_torch(model, data, batch, T)
        gflop = train_flops(MODELS[model], h, w) * batch / 1e9
        rate = gflop / r["median"]
        if model == "conv3":  # the goal is against torch's step
            good = r["median"] <= 0.75 * t
            goal = f"step <= 0.75 x torch's {'ok' if good else 'MISSED'}"
        else:
            floor = {"seed": 0.40, "demo": 0.15}[model]
            good = rate >= floor * best
            goal = f">= {floor:.2f} {'ok' if good else 'MISSED'}"
        ok &= good
        per_conv[model] = each_conv(args, model, h, w, batch)
        alone = convs_alone(per_conv[model])
        lines.append(f"| {model} | {h}x{w}, {batch} | {gflop:.2f} | {r['median']:.3f} s | {rate:.1f} | "
                     f"{rate / best:.2f} | {goal} | {alone:.1f}, {alone / best:.2f} | "
                     f"{gflop / t:.1f}, {gflop / t / best:.2f} | {r['median'] / t:.2f} | {rate / torch_best:.2f} |")
    lines += ["", "Where the convs alone stand: each conv of the model, its training passes timed alone on the "
              "step's kernels (forward, backward data unless it reads the image, backward weights).", "",
              "| model | conv | size, batch | GFLOP/s | vs ceiling | share of the convs' time |", "|---|---|---|---|---|---|"]
    for model, batch in [("seed", 2), ("demo", 4)]:
        convs = per_conv[model]
        total = sum(c[5] for c in convs)
        for cin, cout, ch, cw, gflops, seconds in convs:
            lines.append(f"| {model} | {cin} -> {cout} | {ch}x{cw}, {batch} | {gflops:.1f} | {gflops / best:.2f} | "
                         f"{seconds / total:.2f} |")
    lines.append("")

    # (4) scaling
    lines += ["### (4) Step time against image size: demo model, batch 2, grid 1x1", "",
              "| image | megapixels per step | median step | ms per megapixel | torch step | vs torch |",
              "|---|---|---|---|---|---|"]
    for side in [512, 1024, 2048, 4096]:
        data = data_file(args, side, side, count=2)
        r = run_halotrain(args, "demo", f"size-{side}", data, side, side, (1, 1), 2)
        if side == 4096:
            check_memory(f"demo {side}x{side} grid 1x1", r)
        t = run_torch("demo", data, 2, T)
        mp = 2 * side * side / 1e6
        lines.append(f"| {side}x{side} | {mp:.2f} | {r['median']:.3f} s | {1000 * r['median'] / mp:.1f} | "
                     f"{t:.3f} s | {r['median'] / t:.2f} |")
    lines.append("")

    # (5) small channels
    lines += ["### (5) Small-channel convolutions: the step's kernels against oneDNN's", "",
              "Each pass alone, 3x3 'same', the median of 7 interleaved pairs (each side the best of 3 calls); "
              "below 1 the step's kernel is faster.", "",
              "| conv | size, batch | pass | step's kernel | oneDNN | ratio |", "|---|---|---|---|---|---|"]
    for n, cin, cout, h, w in [(2, 1, 12, 1024, 1024), (2, 12, 16, 512, 512), (4, 1, 8, 1024, 768),
                               (4, 8, 16, 256, 192), (2, 3, 32, 512, 512), (2, 16, 16, 256, 256)]:
        for r in conv_throughput(args, ["--passes", f"{n},{cin},{cout},{h},{w}"]):
            lines.append(f"| {cin} -> {cout} | {h}x{w}, {n} | {r['pass']} | {1000 * r['ours_seconds']:.2f} ms | "
                         f"{1000 * r['onednn_seconds']:.2f} ms | {r['ratio']:.2f} |")
    lines.append("")

    lines += ["### (3) Process RSS against the tracked peak", "",
              "| run | tracked peak (all shards) | predicted == measured | process peak RSS | RSS / tracked | "
              "goal: <= 1.25 x tracked + 256 MiB |", "|---|---|---|---|---|---|"] + memory_rows
    lines += ["", f"Bench wall time {time.time() - started:.0f} s."]
    report(lines, args.out)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
