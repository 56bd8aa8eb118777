#!/usr/bin/python3
"""Fused against unfused: the step schedule's batch norm + ReLU (+ max pool) and conv + ReLU
chains (`parallel.fuse`, orchestrator/step_schedule.hpp fused_chains) against the same layers run
apart (`parallel.fuse: false`), same binary, same machine.

For each model (bench/models.py) and image: 5 interleaved pairs of runs (fused, unfused,
fused, ...), 12 steps each on grid 1x1; a run's time is the median of its steps 3-12, and
the figure is the median of the pairs' ratios fused / unfused (a drift of the machine hits
both runs of a pair alike). Beside it each side's tracked peak (memory.csv; predicted ==
measured is checked on every run). Models: seed (batch norm + ReLU + 2x2 pool chains), demo
(4x4 and 2x2 pools, and a conv + ReLU), conv_bn (ResNet's conv -> batch norm -> ReLU -> conv,
no pools), conv3 (three conv + ReLU chains).

usage: fusion.py --halotrain BIN [--workdir DIR] [--pairs P] [--out FILE.md]
Exit status 1 when a run's predicted peak differs from the measured one.
"""
import argparse
import datetime
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cpu_vs_torch import machine, mib, report  # noqa: E402
from speed import data_file, run_halotrain  # noqa: E402

STEPS = 12
CASES = [("seed", 1024, 1024, 2), ("demo", 1024, 768, 4), ("conv_bn", 768, 768, 2), ("conv3", 768, 768, 2)]


def times(xs):
    return " ".join(f"{x:.3f}" for x in xs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--halotrain", required=True)
    p.add_argument("--workdir", default="/tmp/halotrain-bench-fusion")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    lines = [f"## Fused against unfused ({datetime.date.today()})", "", machine(), "",
             f"{args.pairs} interleaved pairs, {STEPS} steps a run, grid 1x1; seconds per step "
             "(each run's median of steps 3-12); ratio fused / unfused pair by pair.", "",
             "| model | image, batch | fused | unfused | ratios | median ratio | tracked peak fused / unfused |",
             "|---|---|---|---|---|---|---|"]
    exact = True
    for model, h, w, batch in CASES:
        data = data_file(args, h, w)
        fused, apart = [], []
        for i in range(args.pairs):
            for sets, runs in (((), fused), (("parallel.fuse=false",), apart)):
                tag = f"{model}-{'apart' if sets else 'fused'}-{i}"
                r = run_halotrain(args, model, tag, data, h, w, (1, 1), batch, steps=STEPS, sets=sets)
                exact = exact and r["exact"]
                runs.append(r)
            print(f"{model} pair {i + 1}: {fused[-1]['median']:.3f} / {apart[-1]['median']:.3f} s", flush=True)
        ratios = [a["median"] / b["median"] for a, b in zip(fused, apart)]
        lines.append(f"| {model} | {h}x{w}, {batch} | {times(r['median'] for r in fused)} | "
                     f"{times(r['median'] for r in apart)} | {times(ratios)} | {statistics.median(ratios):.2f} | "
                     f"{mib(fused[0]['tracked'])} / {mib(apart[0]['tracked'])} |")
    lines += ["", f"predicted == measured peak on every run: {'yes' if exact else 'NO'}"]
    report(lines, args.out)
    sys.exit(0 if exact else 1)


if __name__ == "__main__":
    main()
