#!/usr/bin/python3
"""Oracle: sharded halotrain training == PyTorch float64 training on the whole image.

For one case it writes data and Keras-format initial weights with h5py, trains the same
model in PyTorch (float64, whole image, same data order, init and optimizer) for K steps,
runs `halotrain train` on several grids (threads of one process, and under mpirun), and
compares every weight and batch-norm moving statistic of the final checkpoint:
|a - r| <= 1e-5 + 1e-4 |r|.

After every run it also checks RUN_DIR/memory.csv: each rank's measured peak device memory
is within 10% of the memory model's prediction. The case's second grid also runs with
`parallel.activations` offload and recompute: against PyTorch as above, and bit for bit
against that grid's keep run (every checkpoint dataset and attribute but checksums and
the config).

With `--backend cuda` it runs one rank and the case's second grid as shard threads sharing
GPU 0 (halos through the host), keep, offload and recompute, and no MPI.

usage: oracle.py CASE --halotrain BIN --workdir DIR [--mpirun MPIRUN] [--backend cpu|cuda]
"""
import argparse
import fnmatch
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoints  # noqa: E402
from torch_model import SEED, Torch, dropout_mask, init_weights, layer_names, mix64, write_keras_weights  # noqa: E402,F401

STEPS = 3
ATOL, RTOL = 1e-5, 1e-4
MEMORY_RTOL = 0.10  # |measured - predicted| peak device bytes per rank, relative to predicted
POLICIES = ("offload", "recompute")  # extra runs of the second grid, besides keep

# Layers in the YAML spelling of SPEC section 3. Conv layers followed by batch norm have no
# bias: its gradient is zero in exact arithmetic, and Adam would amplify float32 noise.
CASES = {
    "classifier_adam": dict(
        input=[97, 83, 2], loss="softmax_cross_entropy", classes=3,
        optimizer=dict(type="adam", lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-4),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9, epsilon=1e-3),
            dict(type="relu"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=5, kernel=3, stride=2, padding=1),
            dict(type="relu"),
            dict(type="conv2d", filters=6, kernel=3, dilation=2, padding="valid"),
            dict(type="avg_pool2d", pool=2),
            dict(type="global_avg_pool"),
            dict(type="dense", units=3),
        ],
        grids=[[1, 1], [2, 1], [1, 2], [2, 2], [3, 2]],
        mpi=[(4, [2, 2]), (2, [1, 1]), (4, [2, 1])],
    ),
    "segmentation_bce_sgd": dict(
        input=[61, 50, 1], loss="sigmoid_bce", masks=True,
        optimizer=dict(type="sgd", lr=0.05, momentum=0.9),
        layers=[
            dict(type="conv2d", filters=4, kernel=5, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.99, epsilon=1e-3),
            dict(type="relu"),
            dict(type="conv2d", filters=3, kernel=3, padding=1),
            dict(type="relu"),
            dict(type="conv2d", filters=1, kernel=1),
        ],
        grids=[[1, 1], [4, 1], [1, 3], [3, 2]],
        mpi=[(3, [1, 3])],
    ),
    "regression_mse_pools": dict(
        input=[45, 52, 1], loss="mse", classes=4,
        optimizer=dict(type="sgd", lr=0.1, momentum=0.0),
        layers=[
            dict(type="conv2d", filters=3, kernel=7, stride=2, padding="same"),
            dict(type="relu"),
            dict(type="avg_pool2d", pool=3, stride=2, padding="same"),
            dict(type="conv2d", filters=4, kernel=3, padding="same", dilation=2),
            dict(type="max_pool2d", pool=3, stride=1, padding=1),
            dict(type="global_avg_pool"),
            dict(type="dense", units=4),
        ],
        grids=[[1, 1], [2, 2], [2, 1]],
        mpi=[(2, [1, 2])],
    ),
    "activations_max_adam": dict(
        input=[38, 41, 1], loss="softmax_cross_entropy", classes=2,
        optimizer=dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="leaky_relu", alpha=0.2),
            dict(type="conv2d", filters=4, kernel=3, stride=2, padding="same"),
            dict(type="tanh"),
            dict(type="conv2d", filters=3, kernel=3, padding="valid"),
            dict(type="dropout", rate=0.25),
            dict(type="sigmoid"),
            dict(type="leaky_relu"),
            dict(type="global_max_pool"),
            dict(type="dropout", rate=0.5),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # SPEC section 7's graphs: ResNet blocks (an identity and a strided 1x1 shortcut after a
    # padded 3x3/2 max pool), and a concatenated skip of a tensor read by three layers.
    "residual_sgd": dict(
        input=[45, 38, 1], loss="softmax_cross_entropy", classes=3,
        optimizer=dict(type="sgd", lr=0.05, momentum=0.9),
        layers=[
            dict(type="conv2d", name="stem", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9),
            dict(type="relu"),
            dict(type="max_pool2d", name="pool", pool=3, stride=2, padding=1),
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="conv2d", name="b1", filters=4, kernel=3, padding="same"),
            dict(type="add", inputs=["b1", "pool"]),
            dict(type="relu", name="r1"),
            dict(type="conv2d", filters=5, kernel=3, stride=2, padding=1),
            dict(type="relu"),
            dict(type="conv2d", name="c2b", filters=5, kernel=3, padding="same"),
            dict(type="conv2d", name="short", filters=5, kernel=1, stride=2, inputs=["r1"]),
            dict(type="add", inputs=["c2b", "short"]),
            dict(type="relu", name="r2"),
            dict(type="concatenate", inputs=["r2", "short", "r2"]),
            dict(type="global_avg_pool"),
            dict(type="dense", units=3),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # MobileNet-style: depthwise and separable convs (strided, dilated, depth multipliers).
    "separable_max_sgd": dict(
        input=[41, 36, 2], loss="softmax_cross_entropy", classes=2,
        optimizer=dict(type="sgd", lr=0.05, momentum=0.9),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="leaky_relu", alpha=0.1),
            dict(type="depthwise_conv2d", kernel=3, stride=2, padding=1, depth_multiplier=2),
            dict(type="leaky_relu"),
            dict(type="separable_conv2d", filters=5, kernel=3, padding="same", dilation=2),
            dict(type="batch_norm", center=False),
            dict(type="relu"),
            dict(type="separable_conv2d", filters=4, kernel=5, stride=2, padding="same", depth_multiplier=3,
                 bias=False),
            dict(type="depthwise_conv2d", kernel=3, padding="valid"),
            dict(type="global_max_pool"),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # A two-level U-Net: bilinear and nearest upsampling, a transposed conv, concatenated
    # skips, zero padding and cropping that shift coordinates, per-pixel BCE.
    "unet_bce_adam": dict(
        input=[44, 40, 1], loss="sigmoid_bce", masks=True,
        optimizer=dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="relu", name="r1"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=6, kernel=3, padding="same"),
            dict(type="relu", name="r2"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=6, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="upsampling2d", size=2, interpolation="bilinear", name="u2"),
            dict(type="concatenate", inputs=["u2", "r2"]),
            dict(type="conv2d", filters=4, kernel=3, padding="same"),
            dict(type="relu", name="r4"),
            dict(type="conv2d_transpose", name="t1", filters=4, kernel=3, stride=2, padding="same"),
            dict(type="upsampling2d", name="u1", size=[2, 2], inputs=["r4"]),
            dict(type="concatenate", inputs=["t1", "u1", "r1"]),
            dict(type="zero_padding2d", padding=[[2, 1], [1, 2]]),
            dict(type="cropping2d", cropping=[[1, 0], [0, 1]]),
            dict(type="conv2d", filters=3, kernel=3, padding="valid"),
            dict(type="tanh"),
            dict(type="conv2d_transpose", filters=1, kernel=3, stride=1, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # Per-pixel softmax over 3 classes, class maps [N, H, W] as targets.
    "unet_softmax_sgd": dict(
        input=[40, 36, 2], loss="softmax_cross_entropy", masks=True, classes=3,
        optimizer=dict(type="sgd", lr=0.1, momentum=0.9),
        layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", scale=False),
            dict(type="relu", name="e1"),
            dict(type="max_pool2d", pool=2),
            dict(type="separable_conv2d", filters=6, kernel=3, padding="same"),
            dict(type="relu"),
            dict(type="upsampling2d", name="up"),
            dict(type="concatenate", inputs=["up", "e1"]),
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # A valid transposed conv cropped back onto its skip, and two global pools joined.
    "transpose_two_pools_adam": dict(
        input=[30, 26, 1], loss="softmax_cross_entropy", classes=2,
        optimizer=dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4),
        layers=[
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
            dict(type="relu", name="a"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d_transpose", filters=3, kernel=3, stride=2),
            dict(type="cropping2d", cropping=[[0, 1], [1, 0]]),
            dict(type="add", inputs=["cropping2d_1", "a"], name="sum"),
            dict(type="global_avg_pool", name="mean"),
            dict(type="global_max_pool", name="max", inputs=["sum"]),
            dict(type="concatenate", inputs=["mean", "max"]),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    "skip_concat_adam": dict(
        input=[33, 29, 2], loss="sigmoid_bce", masks=True,
        optimizer=dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4),
        layers=[
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
            dict(type="tanh", name="t"),
            dict(type="conv2d", filters=3, kernel=5, padding="same", inputs=["input"]),
            dict(type="add", inputs=["t", "conv2d_2", "t"]),
            dict(type="concatenate", inputs=["input", "add_1", "t"]),
            dict(type="conv2d", filters=1, kernel=3, padding="same"),
        ],
        grids=[[1, 1], [2, 2], [3, 2], [1, 4]],
        mpi=[(4, [2, 2])],
    ),
    # Raw 16-bit-like pixels (around 1e4): batch norm's one-pass statistics on every shard,
    # merged over the shards, as exact as the whole image's; the second batch norm fused
    # with its ReLU and pool where the shards allow.
    "large_mean_batch_norm_adam": dict(
        input=[30, 26, 1], loss="softmax_cross_entropy", classes=2, pixels=(9000.0, 11000.0),
        optimizer=dict(type="adam", lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-4),
        layers=[
            dict(type="batch_norm", momentum=0.9, epsilon=1e-3),
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm", momentum=0.9, epsilon=1e-3),
            dict(type="relu"),
            dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=3, kernel=3, padding="same"),
            dict(type="global_avg_pool"),
            dict(type="dense", units=2),
        ],
        grids=[[1, 1], [2, 2], [3, 2]],
        mpi=[(4, [2, 2])],
    ),
}

from cases_section11 import CASES as SECTION11  # noqa: E402
from cases_section14 import CASES as SECTION14  # noqa: E402

CASES.update(SECTION11)
CASES.update(SECTION14)

COUNT, BATCH = 6, 4


# --- the data order of worker/run/batch.cpp: splitmix64 Fisher-Yates per epoch -------------
M64 = (1 << 64) - 1


def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def permutation(seed, epoch, n, shuffle=True):
    p = list(range(n))
    if not shuffle:
        return p
    state = (seed * 0x100000001B3 + epoch) & M64
    for i in range(n - 1, 0, -1):
        state, r = splitmix(state)
        j = r % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def samples_of_step(step, n):
    out = []
    for pos in range(step * BATCH, (step + 1) * BATCH):
        out.append(permutation(SEED, pos // n, n)[pos % n])
    return out


def loss_of(case, out, labels, masks):
    """The training loss as SPEC sections 5 and 14 define it: Keras's class_weight (each
    image's or pixel's loss times its class's weight, then the plain mean) and torch's
    BCEWithLogitsLoss(pos_weight)."""
    cw = case.get("training", {}).get("class_weights")
    cw = torch.tensor(cw, dtype=out.dtype) if cw else None
    if case["loss"] == "softmax_cross_entropy":
        target = masks[:, 0].long() if case.get("masks") else labels  # class maps: per pixel
        each = F.cross_entropy(out, target, reduction="none")
        return (each * cw[target]).mean() if cw is not None else each.mean()
    if case["loss"] == "sigmoid_bce":
        pos = case.get("training", {}).get("pos_weight")
        return F.binary_cross_entropy_with_logits(
            out, masks, weight=None if cw is None else (1 - masks) * cw[0] + masks * cw[1],
            pos_weight=None if pos is None else torch.tensor([pos], dtype=out.dtype))
    target = masks if case.get("masks") else F.one_hot(labels, out.shape[1]).to(out.dtype)
    return F.mse_loss(out, target)


def frozen_at(case, names, step):
    """SPEC section 14: the layers whose weights stay at `step`: `trainable: false`, and
    training.freeze's (glob patterns) before unfreeze_at (always when it is 0)."""
    t = case.get("training", {})
    release = t.get("unfreeze_at", 0)
    frozen = {n for n, l in zip(names, case["layers"]) if l.get("trainable", True) is False}
    if release == 0 or step < release:
        frozen |= {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in t.get("freeze", []))}
    return frozen


def reference(case, images, labels, masks, weights):
    """torch's own loop; a frozen layer's tensors have requires_grad False and no .grad, so the
    optimizer skips them and keeps no state for them until they train (Adam's step count of a
    tensor starts there), and its batch norm runs in eval mode."""
    model = Torch(case, weights)
    o = case["optimizer"]
    if o["type"] == "adam":
        opt = torch.optim.Adam(model.params(), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["epsilon"])
    else:
        opt = torch.optim.SGD(model.params(), lr=o["lr"], momentum=o["momentum"])
    x_all = torch.tensor(images, dtype=torch.float64).permute(0, 3, 1, 2)
    losses = []
    for step in range(STEPS):
        idx = samples_of_step(step, len(images))
        x = x_all[idx]
        y = torch.tensor(labels[idx], dtype=torch.int64) if labels is not None else None
        m = torch.tensor(masks[idx], dtype=torch.float64).permute(0, 3, 1, 2) if masks is not None else None
        opt.zero_grad(set_to_none=True)
        model.frozen = frozen_at(case, model.names, step)
        for (n, w), t in model.p.items():
            if w not in ("moving_mean:0", "moving_variance:0"):
                t.requires_grad_(n not in model.frozen)
        model.step = step
        loss = loss_of(case, model.forward(x), y, m)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def write_config(path, case, workdir, tag, backend="cpu"):
    import json
    cfg = dict(
        name=tag, run_dir=os.path.join(workdir, "runs", tag), seed=SEED,
        data=dict(train=os.path.join(workdir, "data.h5"), targets="masks" if case.get("masks") else "labels",
                  shuffle=True),
        model=dict(input=case["input"], layers=case["layers"], loss=case["loss"]),
        training=dict(batch_size=BATCH, steps=STEPS, optimizer=case["optimizer"],
                      init_weights=os.path.join(workdir, "init.h5"), **case.get("training", {})),
        # On CUDA every shard thread uses GPU 0 (one device per node).
        parallel=dict(backend=backend, grid=[1, 1], device_memory="4GiB",
                      devices_per_node=1 if backend == "cuda" else 2),
        checkpoint=dict(every_steps=0, keep=2, resume="never"),
    )
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)  # JSON is YAML


def compare(case, model, ckpt):
    worst, failures = 0.0, []
    with h5py.File(ckpt, "r") as f:
        for n, l in zip(model.names, case["layers"]):
            for (ln, w), _ in model.p.items():
                if ln != n:
                    continue
                ref = model.keras(n, w)
                got = np.asarray(f[n][n][w], dtype=np.float64)
                if got.shape != ref.shape:
                    failures.append(f"{n}/{w}: shape {got.shape} != {ref.shape}")
                    continue
                err = np.abs(got - ref) - (ATOL + RTOL * np.abs(ref))
                worst = max(worst, float((np.abs(got - ref) / (ATOL + RTOL * np.abs(ref))).max()))
                if (err > 0).any():
                    i = np.unravel_index(np.argmax(err), err.shape)
                    failures.append(f"{n}/{w}{list(i)}: halotrain {got[i]:.8g} vs torch {ref[i]:.8g}")
    return worst, failures


def check_memory(run_dir):
    """Measured vs predicted peak device bytes per rank from RUN_DIR/memory.csv."""
    import csv
    path = os.path.join(run_dir, "memory.csv")
    if not os.path.exists(path):
        return [f"{path}: missing"], ""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return [f"{path}: no ranks"], ""
    failures, parts = [], []
    for r in rows:
        measured, predicted = int(r["peak_device_bytes"]), int(r["predicted_peak_device_bytes"])
        off = abs(measured - predicted) / max(predicted, 1)
        parts.append(f"r{r['rank']} {measured}/{predicted}" + (f" host {r['host_pool_peak_bytes']}"
                                                              if int(r["host_pool_peak_bytes"]) else ""))
        if off > MEMORY_RTOL:
            failures.append(f"memory rank {r['rank']}: measured peak {measured} B vs predicted {predicted} B "
                            f"({100 * off:.1f}% off, limit {100 * MEMORY_RTOL:.0f}%) in {path}")
    return failures, "memory measured/predicted B: " + ", ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--halotrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--mpirun", default="")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    case = CASES[args.case]
    work = os.path.join(args.workdir, args.case)
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(7)
    h, w, c = case["input"]
    lo, hi = case.get("pixels", (0.0, 1.0))
    images = rng.uniform(lo, hi, (COUNT, h, w, c)).astype(np.float32)
    labels = masks = None
    with h5py.File(os.path.join(work, "data.h5"), "w") as f:
        f.create_dataset("images", data=images, chunks=(1, min(h, 32), min(w, 32), c))
        if case.get("masks") and case["loss"] == "softmax_cross_entropy":
            # Class maps [N, H, W], the form SPEC section 7 names first.
            maps = rng.integers(0, case["classes"], (COUNT, h, w)).astype(np.uint8)
            f.create_dataset("masks", data=maps, chunks=(1, min(h, 32), min(w, 32)))
            masks = maps[..., None]
        elif case.get("masks"):
            masks = (rng.uniform(0, 1, (COUNT, h, w, 1)) > 0.6).astype(np.uint8)
            f.create_dataset("masks", data=masks, chunks=(1, min(h, 32), min(w, 32), 1))
        else:
            labels = rng.integers(0, case["classes"], COUNT).astype(np.int32)
            f.create_dataset("labels", data=labels)
    weights = init_weights(case, rng)
    write_keras_weights(os.path.join(work, "init.h5"), case, weights)
    model, losses = reference(case, images, labels, masks, weights)
    print(f"{args.case}: torch float64 losses {['%.6f' % v for v in losses]}")

    # (kind, grid, processes, activations); the second grid runs keep, offload and recompute.
    extra = case["grids"][1]
    grids = case["grids"] if args.backend == "cpu" else [[1, 1], extra]
    runs = []
    for g in grids:
        runs.append(("local", g, None, "keep" if g == extra else None))
        if g == extra:
            runs += [("local", g, None, p) for p in POLICIES]
    if args.mpirun and args.backend == "cpu":
        runs += [("mpi", g, np_, None) for np_, g in case["mpi"]]
    failed = False
    keep_ckpt = None
    for kind, grid, nproc, policy in runs:
        tag = f"{kind}-{grid[0]}x{grid[1]}" + (f"-np{nproc}" if nproc else "") + (f"-{policy}" if policy else "")
        cfg = os.path.join(work, f"{tag}.yaml")
        write_config(cfg, case, work, tag, args.backend)
        shutil.rmtree(os.path.join(work, "runs", tag), ignore_errors=True)  # a fresh run every time
        cmd = [args.halotrain, "train", cfg, "--set", f"parallel.grid=[{grid[0]},{grid[1]}]"]
        if policy:
            cmd += ["--set", f"parallel.activations={policy}"]
        if nproc:
            cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(nproc),
                   "-x", "OMP_NUM_THREADS=1"] + cmd
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(f"  {tag}: FAILED to train (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
            failed = True
            continue
        run_dir = os.path.join(work, "runs", tag)
        ckpt = os.path.join(run_dir, "checkpoints", f"ckpt-{STEPS}.h5")
        worst, failures = compare(case, model, ckpt)
        mem_failures, mem_line = check_memory(run_dir)
        failures += mem_failures
        if policy == "keep":
            keep_ckpt = ckpt
        elif policy:
            if keep_ckpt is None:
                failures.append("no keep run of this grid to compare with")
            else:
                failures += [f"vs keep: {line}" for line in checkpoints.differences(keep_ckpt, ckpt)]
        status = "ok" if not failures else "MISMATCH"
        same = ", bit-identical to keep" if policy in POLICIES and not failures else ""
        print(f"  {tag}: {status}, worst |a-r|/(atol+rtol|r|) = {worst:.3g}{same}; {mem_line}")
        for line in failures[:10]:
            print("    " + line)
        if failures:
            print(f"    command: {' '.join(cmd)}")
        failed |= bool(failures)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
