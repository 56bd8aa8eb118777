#!/usr/bin/python3
"""The worker executes the step schedule: what a real step allocates equals the plan's.

Training: `halotrain train --trace-memory`; inference: `halotrain predict --trace-memory`
(its first batch) against `plan --mode predict --schedule`.

For each case, `halotrain train --trace-memory` records every allocation and free of
every rank's device allocator and host pool during the run's second step, under the
step schedule's operation that made it; `halotrain plan --schedule --json --rank R`
gives the schedule the plan sums for its memory figures. Per rank they must agree
operation for operation: the same actions on the same layers in the same order (a
micro-batch's operations once per micro-batch), the same allocations and frees in the
same order with the same byte counts, and the bytes held when the step starts equal to
what the schedule holds. Cases: the demo model (a chain with batch norm) on grids 2x1
and 2x2 under keep, offload, recompute and a tight `auto`, with micro-batches, with a frozen stem, under mpirun, a
strided conv kept for the ReLU recomputed after it, and planned on a "login node" (other CPU
count, OpenMP/MPI/Slurm variables, oneDNN capped at another ISA) with parallel.threads and
parallel.cpu_isa set; the U-Net (concatenations, transposed convs) under
keep and recompute; a residual graph on an uneven grid 3x2; EfficientNet-B0 (depthwise
convs, squeeze-excite, a gathered tail) on 3x1.

usage: schedule_trace_test.py HALOTRAIN WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

BIN, WORK = sys.argv[1], sys.argv[2]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MPIRUN = shutil.which("mpirun") or "mpirun"
RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    return ok


def sets(pairs):
    return [a for s in pairs for a in ("--set", s)]


def expected_ops(schedule):
    """The schedule's operations in the order a step runs them, each event as (pool, bytes)."""
    ops = schedule["ops"]
    first, end = schedule["micro_batch"]
    order = ops[first:end] * schedule["micro_batches"] + ops[end:]
    return [(o["action"], o["index"], [("host" if k == "host" else "device", b) for k, b in o["events"]])
            for o in order]


def held(schedule):
    """Device and host bytes the schedule holds when a step starts (its hold operation)."""
    device = sum(b for k, b in schedule["ops"][0]["events"] if k != "host")
    host = sum(b for k, b in schedule["ops"][0]["events"] if k == "host")
    return device, host


def first_difference(want, got):
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return f"op {i}: schedule {w[0]} {w[1]} {w[2]}; traced {g[0]} {g[1]} {g[2]}"
    return f"schedule has {len(want)} operations, the trace {len(got)}"


def environment(changes):
    env = dict(os.environ)
    env.update(changes)
    return env


def compare(tag, rank, plan_args, trace_path, env=None):
    """The schedule `plan ... --schedule --json --rank R` prints against a trace file."""
    q = subprocess.run([BIN, "plan", *plan_args, "--schedule", "--json", "--rank", str(rank)],
                       capture_output=True, text=True, timeout=120, env=environment(env or {}))
    if not check(f"{tag} rank {rank}: plan --schedule", q.returncode == 0, q.stderr[-2000:]):
        return
    schedule = json.loads(q.stdout)
    with open(trace_path) as f:
        trace = json.load(f)
    want = expected_ops(schedule)
    got = [(o["action"], o["index"], [tuple(e) for e in o["events"]]) for o in trace["ops"]]
    check(f"{tag} rank {rank}: {len(got)} operations, {sum(len(o[2]) for o in got)} allocations and frees, "
          f"as scheduled", want == got, first_difference(want, got))
    check(f"{tag} rank {rank}: held at the start as scheduled",
          held(schedule) == (trace["held"], trace["host_held"]),
          f"schedule {held(schedule)}, trace {(trace['held'], trace['host_held'])}")


def predict_case(tag, config, args, ranks, images):
    """predict --trace-memory's first batch against `plan --mode predict --schedule`."""
    run_dir = os.path.join(WORK, tag)
    p = subprocess.run([BIN, "predict", config, *args, "--checkpoint", os.path.join(run_dir, "checkpoints", "ckpt-2.h5"),
                        "--input", images, "--output", os.path.join(run_dir, "predictions.h5"), "--trace-memory"],
                       capture_output=True, text=True, timeout=600)
    if not check(f"{tag}: predict exits 0", p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]):
        return
    for rank in range(ranks):
        compare(f"{tag} predict", rank, [config, *args, "--mode", "predict"],
                os.path.join(run_dir, f"memory-trace-predict-{rank}.json"))


def run_case(tag, config, overrides, ranks, mpi=False, train_env=None, plan_env=None, predict_from=None):
    """Trains under `train_env` (a rank's environment), plans under `plan_env` (where the job
    is planned); both default to this one. `predict_from`: then predicts the images of this
    file with the final checkpoint and compares that too."""
    run_dir = os.path.join(WORK, tag)
    args = sets([f"run_dir={run_dir}", "training.steps=2", "checkpoint.resume=never", "training.validate_every=0",
                 "checkpoint.every_steps=0"] + overrides)
    launch = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] if mpi else []
    p = subprocess.run(launch + [BIN, "train", config, *args, "--trace-memory"], capture_output=True, text=True,
                       timeout=600, env=environment(train_env or {}))
    if not check(f"{tag}: train exits 0", p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]):
        return
    for rank in range(ranks):
        compare(tag, rank, [config, *args], os.path.join(run_dir, f"memory-trace-{rank}.json"), plan_env)
    if predict_from:
        predict_case(tag, config, args, ranks, predict_from)


def plan_inputs_checks(demo, small):
    """parallel.cpu_isa: set, it holds against ONEDNN_MAX_CPU_ISA; auto follows the host
    (what makes the set value necessary); a set ISA the CPU lacks is refused by name."""
    args = [demo, *sets(small + ["parallel.threads=2"]), "--schedule", "--json"]

    def workspace(extra, env):
        p = subprocess.run([BIN, "plan", *args, *sets(extra)], capture_output=True, text=True, timeout=120,
                           env=environment(env))
        if p.returncode != 0:
            return p.stderr.strip()
        return sum(b for k, b in json.loads(p.stdout)["ops"][0]["events"] if k == "workspace")

    capped = {"ONEDNN_MAX_CPU_ISA": "SSE41"}
    auto_here, auto_capped = workspace([], {}), workspace([], capped)
    if isinstance(workspace(["parallel.cpu_isa=avx2"], {}), str):
        print("skip auto follows the host: oneDNN does not reach AVX2 here", flush=True)
    else:
        check("cpu_isa auto: the conv scratch follows the host's ISA (AVX2 or above here, SSE4.1 capped)",
              isinstance(auto_here, int) and isinstance(auto_capped, int) and auto_here != auto_capped,
              f"{auto_here} vs {auto_capped}")
    check("cpu_isa sse41 set: the same plan under ONEDNN_MAX_CPU_ISA=AVX2 as under no cap",
          workspace(["parallel.cpu_isa=sse41"], {}) == workspace(["parallel.cpu_isa=sse41"], {"ONEDNN_MAX_CPU_ISA": "AVX2"})
          == auto_capped, f"{workspace(['parallel.cpu_isa=sse41'], {})} vs {auto_capped}")
    with open("/proc/cpuinfo") as f:
        has_amx = "amx_tile" in f.read()
    if not has_amx:
        refused = workspace(["parallel.cpu_isa=avx512_core_amx"], {})
        check("cpu_isa beyond this CPU: refused naming parallel.cpu_isa",
              isinstance(refused, str) and "parallel.cpu_isa avx512_core_amx" in refused, str(refused))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    demo = os.path.join(ROOT, "configs", "demo.yaml")
    small = [f"data.train={os.path.join(WORK, 'demo.h5')}", "data.validation=",
             "data.synthesize={count: 8, height: 256, width: 192, channels: 1, classes: 2}",
             "model.input=[256, 192, 1]", "training.batch_size=4"]
    for policy in ("keep", "offload", "recompute"):
        run_case(f"demo-2x1-{policy}", demo, small + [f"parallel.activations={policy}"], 2,
                 predict_from=os.path.join(WORK, "demo.h5") if policy == "keep" else None)
    run_case("demo-2x2-offload-accumulate", demo,
             small + ["parallel.grid=[2, 2]", "parallel.activations=offload", "training.accumulate=2"], 4)
    run_case("demo-2x2-recompute", demo, small + ["parallel.grid=[2, 2]", "parallel.activations=recompute"], 4,
             predict_from=os.path.join(WORK, "demo.h5"))
    run_case("demo-2x1-offload-mpirun", demo, small + ["parallel.activations=offload"], 2, mpi=True)
    # A strided last conv keeps its output as a recompute boundary: no backward reads it
    # (the ReLU's reads its own), but the ReLU's recompute does, so it stays; on the top
    # shard the conv keeps its halo-extended input besides.
    run_case("demo-2x1-recompute-strided", demo,
             small + ["parallel.activations=recompute", "model.layers[8].stride=2"], 2)
    # The plan's inputs are the config: a "login node" (another CPU count, OpenMP, MPI and
    # Slurm variables, oneDNN capped at SSE4.1) plans the schedule the ranks run, once
    # parallel.threads and parallel.cpu_isa are set.
    login = {"ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "7", "SLURM_CPUS_PER_TASK": "5",
             "SLURM_CPUS_ON_NODE": "48", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    run_case("demo-2x1-login-node", demo, small + ["parallel.threads=2", "parallel.cpu_isa=avx2"], 2,
             plan_env=login, train_env={"OMP_NUM_THREADS": "1"})
    plan_inputs_checks(demo, small)
    # Frozen layers: no backward reaches them; an offloaded input waits in the host pool.
    run_case("demo-2x1-frozen-offload", demo, small + ["parallel.activations=offload",
                                                       "model.layers[0].trainable=false",
                                                       "model.layers[1].trainable=false"], 2)
    unet = os.path.join(ROOT, "configs", "unet-demo.yaml")
    for policy in ("keep", "recompute"):
        run_case(f"unet-2x1-{policy}", unet,
                 [f"data.train={os.path.join(WORK, 'unet.h5')}", "data.validation=", "training.batch_size=2",
                  f"parallel.activations={policy}", "parallel.grid=[2, 1]"], 2,
                 predict_from=os.path.join(WORK, "unet.h5") if policy == "keep" else None)
    # Residual blocks on an uneven grid; EfficientNet's depthwise convs, squeeze-excite and
    # its gathered tail. Both CUDA configs, on the CPU at a small size.
    small = ["parallel.backend=cpu", "parallel.device_memory=4GiB", "model.input=[371,296,1]",
             "data.synthesize.height=371", "data.synthesize.width=296", "recycle.every_steps=0"]
    run_case("resnet-3x2-recompute", os.path.join(ROOT, "configs", "resnet-mammo.yaml"),
             small + [f"data.train={os.path.join(WORK, 'resnet.h5')}", "data.validation=", "parallel.grid=[3, 2]",
                      "parallel.activations=recompute"], 6)
    run_case("efficientnet-3x1", os.path.join(ROOT, "configs", "efficientnet-mammo.yaml"),
             small + [f"data.train={os.path.join(WORK, 'effnet.h5')}", "data.validation=", "parallel.grid=[3, 1]"], 3,
             predict_from=os.path.join(WORK, "effnet.h5"))
    print(f"{sum(RESULTS)}/{len(RESULTS)} checks passed")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
