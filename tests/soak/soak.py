#!/usr/bin/python3
"""Soak: a long run with in-process recycling every 50 steps and a checkpoint every 10,
killed with SIGKILL at random moments (some while a checkpoint is being written) and
resumed each time.

Checks:
- after every kill, every ckpt-*.h5 in the run's checkpoints/ verifies its checksum;
- the final checkpoint of the interrupted run equals an uninterrupted run's bit for bit
  (every dataset and attribute but checksums and the config);
- the uninterrupted run's RSS does not grow across recycles: per recycle window (50 steps)
  the lowest RSS sampled in it (the sawtooth of one window, checkpoint writes and the
  allocator's churn sit above it), and the slope of those over the second half of the run,
  in MiB per 1000 steps, is reported and must stay under 32. The floors of a run without
  a leak wander by about +-12 MiB from window to window on the 2-core VM (the allocator
  keeps or returns freed pages as it likes), which puts the slope's own spread near 10 MiB
  per 1000 steps at 1500 steps: 32 is three of those, and a leak of 1.6 MiB per recycle
  (every 50 steps) or more fails.

usage: soak.py HALOTRAIN WORKDIR [--steps N] [--kills K] [--seed S]
(CI runs the short form: 1500 steps, 8 kills; bench/run-all the long one: 2000 steps, 20 kills.)
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import checkpoints  # noqa: E402
from configs import write_config  # noqa: E402

RSS_SLOPE_LIMIT = 32.0  # MiB per 1000 steps: see the docstring
RECYCLE_EVERY = 50


def config(work, tag, steps):
    cfg = dict(
        name=tag, run_dir=os.path.join(work, tag), seed=21,
        data=dict(train=os.path.join(work, "data.h5"),
                  synthesize=dict(count=10, height=256, width=192, channels=1, classes=2)),
        model=dict(input=[256, 192, 1], layers=[dict(type="conv2d", filters=8, kernel=3, padding="same", bias=False),
                                             dict(type="batch_norm", momentum=0.9), dict(type="relu"),
                                             dict(type="max_pool2d", pool=2),
                                             dict(type="conv2d", filters=6, kernel=3, padding="same"),
                                             dict(type="relu"), dict(type="global_avg_pool"),
                                             dict(type="dense", units=2)]),
        training=dict(batch_size=4, steps=steps, optimizer=dict(type="adam", lr=0.003), log_every=50),
        parallel=dict(backend="cpu", grid=[2, 1], device_memory="1GiB"),
        checkpoint=dict(every_steps=10, keep=3, resume="auto"),
        recycle=dict(every_steps=RECYCLE_EVERY, mode="in_process"),
    )
    return write_config(work, tag, cfg, {})


def bad_checkpoints(binary, run_dir):
    d = os.path.join(run_dir, "checkpoints")
    bad = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if re.fullmatch(r"ckpt-\d+\.h5", name):
            r = subprocess.run([binary, "inspect", os.path.join(d, name)], capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or "checksum: OK" not in r.stdout:
                bad.append(name)
    return bad


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def last_step(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.csv")) as f:
            rows = f.read().strip().splitlines()[1:]
        return int(rows[-1].split(",")[0]) if rows else 0
    except (OSError, ValueError):
        return 0


def slope(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("halotrain")
    ap.add_argument("workdir")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = random.Random(args.seed)
    failures = []

    # The uninterrupted run, its RSS sampled against the step it is at.
    ref_cfg = config(work, "reference", args.steps)
    t0 = time.time()
    proc = subprocess.Popen([args.halotrain, "train", ref_cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    while proc.poll() is None:
        rss, step = rss_mib(proc.pid), last_step(os.path.join(work, "reference"))
        if rss and step:
            samples.append((step, rss))
        time.sleep(0.1)
    ref_seconds = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the reference run failed (exit {proc.returncode})")
    floors = {}  # recycle window -> its lowest RSS
    for s, r in samples:
        if s >= args.steps // 2:
            w = s // RECYCLE_EVERY
            floors[w] = min(r, floors.get(w, r))
    windows = sorted(floors)
    rss_slope = (slope([(w + 0.5) * RECYCLE_EVERY for w in windows], [floors[w] for w in windows]) * 1000
                 if len(windows) > 2 else 0.0)
    peak = max((r for _, r in samples), default=0)
    print(f"reference: {args.steps} steps in {ref_seconds:.1f} s, {len(samples)} RSS samples, peak {peak:.1f} MiB, "
          f"slope of the per-recycle RSS floor over the second half {rss_slope:+.2f} MiB per 1000 steps")
    if rss_slope > RSS_SLOPE_LIMIT:
        failures.append(f"RSS grows {rss_slope:.2f} MiB per 1000 steps across recycles (limit {RSS_SLOPE_LIMIT})")

    # The interrupted run: SIGKILL at random moments, half of them while a checkpoint's
    # temporary file exists (a write under way), each time resumed.
    cfg = config(work, "killed", args.steps)
    run_dir = os.path.join(work, "killed")
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    kills = mid_write = 0
    while kills < args.kills:
        proc = subprocess.Popen([args.halotrain, "train", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        during_write = rng.random() < 0.5
        deadline = time.time() + rng.uniform(0.3, max(0.6, ref_seconds / args.kills))
        hit = False
        while proc.poll() is None and time.time() < deadline + (5 if during_write else 0):
            if during_write and time.time() >= deadline - 0.2 and os.path.isdir(ckpt_dir) and \
                    any(".tmp-" in n for n in os.listdir(ckpt_dir)):
                hit = True
                break
            if not during_write and time.time() >= deadline:
                break
            time.sleep(0.002)
        if proc.poll() is not None:
            break  # it finished before this kill
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        mid_write += hit
        bad = bad_checkpoints(args.halotrain, run_dir)
        if bad:
            failures.append(f"after kill {kills} (at step {last_step(run_dir)}): checkpoints that do not verify: {bad}")
    proc = subprocess.run([args.halotrain, "train", cfg], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        failures.append(f"the last resume failed (exit {proc.returncode}): {proc.stderr[-600:]}")
    final = os.path.join(ckpt_dir, f"ckpt-{args.steps}.h5")
    ref = os.path.join(work, "reference", "checkpoints", f"ckpt-{args.steps}.h5")
    diffs = checkpoints.differences(ref, final) if os.path.exists(final) else [f"no {final}"]
    failures += [f"final checkpoint vs uninterrupted: {d}" for d in diffs[:10]]
    print(f"killed {kills} times ({mid_write} while a checkpoint was being written), resumed each time; final "
          f"checkpoint {'bit-identical to' if not diffs else 'DIFFERS from'} the uninterrupted run's")
    for f in failures:
        print("FAIL " + f)
    print("soak: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
