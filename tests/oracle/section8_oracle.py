#!/usr/bin/python3
"""Oracle for SPEC section 8: validation, evaluate, predict, augmentation and the training
options (lr_schedule, weight_decay, accumulate), against PyTorch in float64 on the whole
image. The model code is oracle.py's (the same layers, the same data order).

usage: section8_oracle.py PART --halotrain BIN --workdir DIR [--mpirun MPIRUN]

PART:
  predict    predict == the PyTorch model in eval mode (classifier: softmax; fully
             convolutional: sigmoid), grids 1x1, 2x2, 3x2 (uneven) and mpirun -np 4;
             measured peak device memory == the plan's (plan --mode predict) on every run
  evaluate   evaluate's loss and metrics (also under mpirun) == PyTorch's (auc == sklearn's roc_auc_score) on a
             file whose size is not a multiple of the batch; validation during training
             writes the same figures to metrics.csv and leaves the checkpoint bit for bit as
             training without it
  optimizer  cosine with warmup, step schedule, AdamW and SGD weight decay, accumulate 2:
             the weights after 4 steps == PyTorch loops (LambdaLR / StepLR, AdamW, SGD)
  augment    flips, random crops from larger images and data.downsample 2: the weights ==
             PyTorch with the same draws, on grids 1x1 and 2x2; resume bit for bit
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import checkpoints  # noqa: E402
import configs  # noqa: E402
import oracle  # noqa: E402

ATOL, RTOL = oracle.ATOL, oracle.RTOL
M64 = oracle.M64

CLASSIFIER = dict(
    input=[41, 37, 2], loss="softmax_cross_entropy", classes=2,
    optimizer=dict(type="adam", lr=1e-2, beta1=0.9, beta2=0.999, epsilon=1e-4),
    layers=[
        dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
        dict(type="batch_norm", momentum=0.8, epsilon=1e-3),
        dict(type="relu"),
        dict(type="max_pool2d", pool=2),
        dict(type="conv2d", filters=5, kernel=3, padding=1),
        dict(type="relu"),
        dict(type="global_avg_pool"),
        dict(type="dense", units=2),
    ],
)
SEGMENTER = dict(
    input=[33, 29, 1], loss="sigmoid_bce", masks=True,
    optimizer=dict(type="sgd", lr=0.05, momentum=0.9),
    layers=[
        dict(type="conv2d", filters=4, kernel=5, padding="same", bias=False),
        dict(type="batch_norm", momentum=0.8, epsilon=1e-3),
        dict(type="relu"),
        dict(type="conv2d", filters=3, kernel=3, padding=1),
        dict(type="relu"),
        dict(type="conv2d", filters=1, kernel=1),
    ],
)
SEED, BATCH = 99, 4


def run(cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{what}: exit {proc.returncode}: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc


def mpi(args, np_):
    return [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "-x", "OMP_NUM_THREADS=1"]


def write_data(path, case, count, rng, height=None, width=None, positive=0.4):
    h, w, c = case["input"]
    h, w = height or h, width or w
    images = rng.uniform(0, 1, (count, h, w, c)).astype(np.float32)
    out = dict(images=images)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images, chunks=(1, min(h, 16), min(w, 16), c))
        if case.get("masks"):
            # Bright pixels are more often positive: something for a model to learn.
            p = rng.uniform(0, 1, (count, h, w, 1)) * 0.5 + images[..., :1] * 0.5
            out["masks"] = (p > np.quantile(p, 1 - positive)).astype(np.uint8)
            f.create_dataset("masks", data=out["masks"], chunks=(1, min(h, 16), min(w, 16), 1))
        else:
            # Labels that the images tell apart a little, so that accuracy and auc vary.
            out["labels"] = (images.mean(axis=(1, 2, 3)) > np.median(images.mean(axis=(1, 2, 3)))).astype(np.int32)
            f.create_dataset("labels", data=out["labels"])
    return out


def config(work, tag, case, over):
    cfg = dict(
        name=tag, run_dir=os.path.join(work, "runs", tag), seed=SEED,
        data=dict(train=os.path.join(work, "train.h5"), targets="masks" if case.get("masks") else "labels"),
        model=dict(input=case["input"], layers=case["layers"], loss=case["loss"]),
        training=dict(batch_size=BATCH, steps=2, optimizer=case["optimizer"],
                      init_weights=os.path.join(work, "init.h5")),
        parallel=dict(backend="cpu", grid=[1, 1], device_memory="2GiB"),
        checkpoint=dict(every_steps=0, keep=3, resume="never"),
    )
    return configs.write_config(work, tag, cfg, over)


def report(line, problems):
    """Prints `line` as ok or MISMATCH with the first problems; True when it failed."""
    print(f"  {'ok' if not problems else 'MISMATCH'}: {line}")
    for p in problems[:8]:
        print("    " + p)
    return bool(problems)


def torch_from_checkpoint(case, ckpt):
    """oracle.Torch with the weights and batch-norm statistics of a halotrain checkpoint."""
    weights = {}
    with h5py.File(ckpt, "r") as f:
        for n in oracle.layer_names(case["layers"]):
            g = f[n]
            names = [w.decode() for w in g.attrs["weight_names"]]
            weights[n] = [(w.split("/")[-1], np.asarray(g[w], dtype=np.float64)) for w in names]
    return oracle.Torch(case, weights)


def setup(work, case, rng, count=6):
    os.makedirs(work, exist_ok=True)
    data = write_data(os.path.join(work, "train.h5"), case, count, rng)
    weights = oracle.init_weights(case, rng)
    oracle.write_keras_weights(os.path.join(work, "init.h5"), case, weights)
    return data, weights


def close(got, ref):
    err = np.abs(got - ref) / (ATOL + RTOL * np.abs(ref))
    return float(err.max()) if err.size else 0.0


# --- predict ---------------------------------------------------------------------------
def part_predict(args, work):
    failed = False
    rng = np.random.default_rng(11)
    for name, case, grids in (("classifier", CLASSIFIER, [([1, 1], 0), ([2, 2], 0), ([3, 2], 0), ([2, 1], 4)]),
                              ("segmenter", SEGMENTER, [([1, 1], 0), ([2, 2], 0), ([3, 2], 0), ([2, 2], 4)])):
        w = os.path.join(work, name)
        shutil.rmtree(w, ignore_errors=True)
        setup(w, case, rng)
        inputs = write_data(os.path.join(w, "input.h5"), case, 5, rng)
        cfg = config(w, "train", case, {})
        run([args.halotrain, "train", cfg], f"{name}: train")
        ckpt = os.path.join(w, "runs", "train", "checkpoints", "ckpt-2.h5")
        model = torch_from_checkpoint(case, ckpt)
        with torch.no_grad():
            x = torch.tensor(inputs["images"], dtype=torch.float64).permute(0, 3, 1, 2)
            y = model.forward(x, training=False)
            ref = (torch.softmax(y, dim=1) if case["loss"] == "softmax_cross_entropy"
                   else torch.sigmoid(y).permute(0, 2, 3, 1)).numpy()
        for grid, nproc in grids:
            tag = f"{grid[0]}x{grid[1]}" + (f"-np{nproc}" if nproc else "")
            out = os.path.join(w, f"pred-{tag}.h5")
            cmd = [args.halotrain, "predict", cfg, "--set", f"parallel.grid=[{grid[0]},{grid[1]}]",
                   "--checkpoint", ckpt, "--input", os.path.join(w, "input.h5"), "--output", out]
            if nproc:
                if not args.mpirun:
                    continue
                cmd = mpi(args, nproc) + cmd
            proc = run(cmd, f"{name} {tag}: predict")
            with h5py.File(out, "r") as f:
                got = np.asarray(f["predictions"], dtype=np.float64)
                chunked = f["predictions"].chunks is not None
            problems = []
            if got.shape != ref.shape:
                problems.append(f"shape {got.shape} != torch {ref.shape}")
            elif close(got, ref) > 1:
                problems.append(f"worst |a-r|/(atol+rtol|r|) {close(got, ref):.3g} > 1")
            if not chunked:
                problems.append("predictions is not chunked")
            # Measured == predicted peak (CPU): the command prints both.
            line = [l for l in proc.stdout.splitlines() if "peak device memory" in l]
            nums = [int(t) for t in line[0].replace(",", " ").split() if t.isdigit()] if line else []
            if len(nums) < 2 or nums[-2] != nums[-1]:
                problems.append(f"peak memory measured != predicted: {line}")
            plan = json.loads(run([args.halotrain, "plan", cfg, "--mode", "predict", "--json", "--set",
                                   f"parallel.grid=[{grid[0]},{grid[1]}]"], "plan --mode predict").stdout)
            if not nproc and nums and max(r["peak_device_bytes"] for r in plan["ranks"]) != nums[-1]:
                problems.append(f"plan --mode predict says {max(r['peak_device_bytes'] for r in plan['ranks'])} B, "
                                f"the run measured {nums[-1]} B")
            failed |= report(f"predict {name} {tag}, worst {close(got, ref) if got.shape == ref.shape else -1:.3g}; "
                             f"peak {nums[-1] if nums else '?'} B measured == predicted", problems)
    return failed


# --- evaluate --------------------------------------------------------------------------
def reference_metrics(case, model, data):
    from sklearn.metrics import roc_auc_score
    with torch.no_grad():
        x = torch.tensor(data["images"], dtype=torch.float64).permute(0, 3, 1, 2)
        y = model.forward(x, training=False)
    if case["loss"] == "softmax_cross_entropy":
        labels = torch.tensor(data["labels"], dtype=torch.int64)
        p = torch.softmax(y, dim=1)
        return {"loss": F.cross_entropy(y, labels).item(),
                "accuracy": (y.argmax(dim=1) == labels).double().mean().item(),
                "auc": roc_auc_score(data["labels"], p[:, 1].numpy())}
    m = torch.tensor(data["masks"], dtype=torch.float64).permute(0, 3, 1, 2)
    pred, t = (y > 0).double(), m
    tp, pp, pos = (pred * t).sum().item(), pred.sum().item(), t.sum().item()
    return {"loss": F.binary_cross_entropy_with_logits(y, m).item(),
            "accuracy": (pred == t).double().mean().item(),
            "dice": 2 * tp / (pp + pos), "iou": tp / (pp + pos - tp)}


def part_evaluate(args, work):
    failed = False
    rng = np.random.default_rng(12)
    for name, case, metrics, grid in (("classifier", CLASSIFIER, ["accuracy", "auc"], [2, 1]),
                                      ("segmenter", SEGMENTER, ["accuracy", "dice", "iou"], [3, 2])):
        w = os.path.join(work, name)
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        write_data(os.path.join(w, "train.h5"), case, 6, rng, positive=0.7)
        oracle.write_keras_weights(os.path.join(w, "init.h5"), case, oracle.init_weights(case, rng))
        val = write_data(os.path.join(w, "val.h5"), case, 13, rng, positive=0.7)  # 13: not a multiple of the batch
        over = {"data.validation": os.path.join(w, "val.h5"), "training.metrics": metrics,
                "training.validate_every": 4, "training.steps": 12, "parallel.grid": grid}
        cfg = config(w, "val", case, over)
        run([args.halotrain, "train", cfg], f"{name}: train with validation")
        plain = config(w, "plain", case, {"training.steps": 12, "parallel.grid": grid})
        run([args.halotrain, "train", plain], f"{name}: train without validation")
        problems = []
        ckpt = os.path.join(w, "runs", "val", "checkpoints", "ckpt-12.h5")
        problems += [f"validation changed training: {d}" for d in
                     checkpoints.differences(ckpt, os.path.join(w, "runs", "plain", "checkpoints", "ckpt-12.h5"))]
        ref = reference_metrics(case, torch_from_checkpoint(case, ckpt), val)
        proc = run([args.halotrain, "evaluate", cfg, "--checkpoint", ckpt], f"{name}: evaluate")
        with open(os.path.join(w, "runs", "val", "eval-12.json")) as f:
            got = json.load(f)
        sources = [("evaluate", got)]
        if args.mpirun:
            # Under MPI, 4 ranks on the grid: one process writes the figures.
            os.remove(os.path.join(w, "runs", "val", "eval-12.json"))
            run(mpi(args, 4 if grid == [2, 1] else 6) + [args.halotrain, "evaluate", cfg, "--checkpoint", ckpt],
                f"{name}: evaluate under mpirun")
            with open(os.path.join(w, "runs", "val", "eval-12.json")) as f:
                sources.append(("evaluate under mpirun", json.load(f)))
        import csv
        with open(os.path.join(w, "runs", "val", "metrics.csv")) as f:
            last = list(csv.DictReader(f))[-1]
        sources.append(("metrics.csv", {k[4:]: v for k, v in last.items() if k.startswith("val_")}))
        worst = 0.0
        for k, r in ref.items():
            for where, v in ((where, src.get(k)) for where, src in sources):
                if v in (None, ""):
                    problems.append(f"{where}: no {k}")
                    continue
                e = close(np.array(float(v)), np.array(r))
                worst = max(worst, e)
                if e > 1:
                    problems.append(f"{where} {k}: halotrain {float(v):.8g} vs torch {r:.8g}")
        # Metrics that say something: neither all right nor all wrong.
        problems += [f"{k} is {v}: the data make a weak test" for k, v in ref.items() if k != "loss" and v in (0, 1)]
        failed |= report(f"evaluate {name} grid {grid}, worst {worst:.3g}; {proc.stdout.strip().splitlines()[0]}",
                         problems)
    return failed


# --- optimizer options -----------------------------------------------------------------
def torch_train(case, weights, data, steps, schedule=None, weight_decay=0.0, accumulate=1, augment=None,
                downsample=1):
    model = oracle.Torch(case, weights)
    o = case["optimizer"]
    if o["type"] == "adam":
        cls = torch.optim.AdamW if weight_decay else torch.optim.Adam
        opt = cls(model.params(), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["epsilon"],
                  weight_decay=weight_decay)
    else:
        opt = torch.optim.SGD(model.params(), lr=o["lr"], momentum=o["momentum"], weight_decay=weight_decay)
    sched = None
    if schedule and schedule["type"] == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=schedule["every"], gamma=schedule["factor"])
    elif schedule and schedule["type"] == "cosine":
        W, lo, lr = schedule.get("warmup_steps", 0), schedule.get("min_lr", 0.0), o["lr"]

        def factor(t):  # SPEC section 8 / README: linear warmup, then cosine to min_lr
            if t < W:
                return (t + 1) / W
            return (lo + (lr - lo) * 0.5 * (1 + math.cos(math.pi * min((t - W) / max(steps - W, 1), 1.0)))) / lr
        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    images = torch.tensor(data["images"], dtype=torch.float64).permute(0, 3, 1, 2)
    if downsample > 1:
        images = F.avg_pool2d(images, downsample)
    n = len(data["images"])
    for step in range(steps):
        idx = [oracle.permutation(SEED, pos // n, n)[pos % n] for pos in range(step * BATCH, (step + 1) * BATCH)]
        xs, ms = [], []
        for s in idx:
            x = images[s]
            m = None
            if case.get("masks"):
                m = torch.tensor(data["masks"][s], dtype=torch.float64).permute(2, 0, 1)
            if augment:
                x, m = augment_one(augment, step, s, x, m, case)
            xs.append(x)
            ms.append(m)
        x = torch.stack(xs)
        y = torch.tensor(data["labels"][idx], dtype=torch.int64) if "labels" in data else None
        m = torch.stack(ms) if case.get("masks") else None
        opt.zero_grad()
        k = accumulate
        for j in range(k):
            sl = slice(j * BATCH // k, (j + 1) * BATCH // k)
            loss = oracle.loss_of(case, model.forward(x[sl]), y[sl] if y is not None else None,
                                  m[sl] if m is not None else None) / k
            loss.backward()
        opt.step()
        if sched:
            sched.step()
    return model


def part_optimizer(args, work):
    failed = False
    rng = np.random.default_rng(13)
    runs = [
        ("cosine-warmup", CLASSIFIER, {"training.lr_schedule": {"type": "cosine", "warmup_steps": 2, "min_lr": 1e-3}},
         dict(schedule={"type": "cosine", "warmup_steps": 2, "min_lr": 1e-3})),
        ("step", SEGMENTER, {"training.lr_schedule": {"type": "step", "every": 2, "factor": 0.3}},
         dict(schedule={"type": "step", "every": 2, "factor": 0.3})),
        ("adamw", CLASSIFIER, {"training.weight_decay": 0.05}, dict(weight_decay=0.05)),
        ("sgd-l2", SEGMENTER, {"training.weight_decay": 0.01}, dict(weight_decay=0.01)),
        ("accumulate2", CLASSIFIER, {"training.accumulate": 2}, dict(accumulate=2)),
        ("accumulate2-sgd", SEGMENTER, {"training.accumulate": 2, "parallel.grid": [2, 2]}, dict(accumulate=2)),
    ]
    for tag, case, over, kw in runs:
        w = os.path.join(work, tag)
        shutil.rmtree(w, ignore_errors=True)
        data, weights = setup(w, case, rng)
        over = dict(over)
        over.setdefault("parallel.grid", [2, 1])
        over["training.steps"] = 4
        cfg = config(w, tag, case, over)
        run([args.halotrain, "train", cfg], f"{tag}: train")
        model = torch_train(case, weights, data, 4, **kw)
        worst, failures = oracle.compare(case, model, os.path.join(w, "runs", tag, "checkpoints", "ckpt-4.h5"))
        failed |= report(f"optimizer {tag}, worst |a-r|/(atol+rtol|r|) = {worst:.3g}", failures)
    return failed


# --- augmentation ----------------------------------------------------------------------
def splitmix_draws(seed, step, sample, count=4):
    state = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + sample * 0x94D049BB133111EB) & M64
    out = []
    for _ in range(count):
        state, r = oracle.splitmix(state)
        out.append(r)
    return out


def augment_one(aug, step, sample, x, m, case):
    """worker/run/batch.cpp augment_view: four draws (h flip, v flip, crop top, crop left)."""
    h_draw, v_draw, top_draw, left_draw = splitmix_draws(SEED, step, sample)
    H, W = case["input"][0], case["input"][1]
    if aug.get("crop"):
        top = top_draw % (x.shape[1] - H + 1)
        left = left_draw % (x.shape[2] - W + 1)
        x = x[:, top:top + H, left:left + W]
        if m is not None:
            m = m[:, top:top + H, left:left + W]
    if "horizontal" in aug.get("flip", []) and h_draw >> 63:
        x = x.flip(2)
        m = m.flip(2) if m is not None else None
    if "vertical" in aug.get("flip", []) and v_draw >> 63:
        x = x.flip(1)
        m = m.flip(1) if m is not None else None
    return x, m


def part_augment(args, work):
    failed = False
    rng = np.random.default_rng(14)
    for name, case, factor in (("classifier", CLASSIFIER, 2), ("segmenter", SEGMENTER, 1)):
        w = os.path.join(work, name)
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        h, wd, _ = case["input"]
        # Images larger than the crop: downsampled by `factor` they are (h + 9) x (wd + 7).
        data = write_data(os.path.join(w, "train.h5"), case, 6, rng, (h + 9) * factor, (wd + 7) * factor)
        weights = oracle.init_weights(case, rng)
        oracle.write_keras_weights(os.path.join(w, "init.h5"), case, weights)
        aug = {"flip": ["horizontal", "vertical"], "crop": [h, wd]}
        if case.get("masks") and factor > 1:
            raise SystemExit("masks with downsample are not compared here")
        ref = torch_train(case, weights, data, 4, augment=aug, downsample=factor)
        ckpts = {}
        for grid in ([1, 1], [2, 2]):
            tag = f"{grid[0]}x{grid[1]}"
            cfg = config(w, tag, case, {"data.augment": aug, "data.downsample": factor, "training.steps": 4,
                                        "parallel.grid": grid, "checkpoint.every_steps": 2})
            run([args.halotrain, "train", cfg], f"{name} {tag}: train")
            ckpts[tag] = os.path.join(w, "runs", tag, "checkpoints", "ckpt-4.h5")
            worst, failures = oracle.compare(case, ref, ckpts[tag])
            failed |= report(f"augment {name} {tag} (flips, crop, downsample {factor}), worst {worst:.3g}", failures)
        # Resume: 2 steps, then 2 more from ckpt-2, bit for bit as the 4-step run of that grid.
        cfg = config(w, "resume", case, {"data.augment": aug, "data.downsample": factor, "training.steps": 2,
                                         "parallel.grid": [2, 2], "checkpoint.resume": "auto"})
        run([args.halotrain, "train", cfg], f"{name}: first half")
        run([args.halotrain, "train", cfg, "--set", "training.steps=4"], f"{name}: resumed half")
        diffs = checkpoints.differences(ckpts["2x2"], os.path.join(w, "runs", "resume", "checkpoints", "ckpt-4.h5"))
        failed |= report(f"augment {name} resume 2+2 == 4 bit for bit", diffs)
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=("predict", "evaluate", "optimizer", "augment"))
    ap.add_argument("--halotrain", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--mpirun", default="")
    args = ap.parse_args()
    work = os.path.join(args.workdir, args.part)
    os.makedirs(work, exist_ok=True)
    part = dict(predict=part_predict, evaluate=part_evaluate, optimizer=part_optimizer, augment=part_augment)
    sys.exit(1 if part[args.part](args, work) else 0)


if __name__ == "__main__":
    main()
