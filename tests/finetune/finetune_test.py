#!/usr/bin/python3
"""Fine-tuning (SPEC section 14) end to end. The validation monitors against Keras's rules, written out here:
tf.keras EarlyStopping, ReduceLROnPlateau and ModelCheckpoint(save_best_only), run on the
validation values the run itself logged in metrics.csv.

- a run with all three (sharded 2x1): it ends where EarlyStopping would, each step's
  learning rate is what ReduceLROnPlateau would set, best.h5 holds the step ModelCheckpoint
  would keep, outlives checkpoint.keep's pruning and verifies;
- the same run cut in the middle of a plateau wait and an early-stopping patience and
  resumed: the same final step, learning rates and weights, bit for bit;
- a run that early stopping must end: exit 0 with the reason; resubmitted, it exits 0 at
  once and writes nothing, and the temporary a kill during best.h5's write would leave is
  removed while best.h5 still verifies;
- a monitor that validation does not compute, or without validation: exit 1 naming it;
- frozen layers: the plan of a model with a frozen stem holds no gradient and no optimizer
  state for it (and its predicted peak is measured exactly, in the oracle cases); a run
  resumed across unfreeze_at ends bit for bit where a straight one does; a freeze pattern
  that matches nothing exits 1 listing the layers.

usage: finetune_test.py HALOTRAIN WORKDIR
"""
import csv
import glob
import json
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from configs import write_config  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
RESULTS = []
EVERY = 3      # validate_every
STEPS = 60
LR = 0.05


def check(name, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail and not ok else ''}", flush=True)


# --- Keras 2's rules (tf.keras 2.x callbacks), for one value per validation -------------

def keras_early_stopping(values, patience, min_delta, maximize):
    """EarlyStopping.on_epoch_end: the index of the validation that stops, or None."""
    best = -math.inf if maximize else math.inf
    delta = min_delta if maximize else -min_delta
    wait = 0
    for epoch, current in enumerate(values):
        wait += 1
        improved = (current - delta > best) if maximize else (current - delta < best)
        if improved:
            best, wait = current, 0
        if wait >= patience and epoch > 0:
            return epoch
    return None


def keras_plateau(values, lr, factor, patience, min_delta, cooldown, min_lr, maximize):
    """ReduceLROnPlateau.on_epoch_end: the learning rate after each validation."""
    best = -math.inf if maximize else math.inf
    wait = cooldown_counter = 0
    out = []
    for current in values:
        if cooldown_counter > 0:
            cooldown_counter -= 1
            wait = 0
        if (current > best + min_delta) if maximize else (current < best - min_delta):
            best, wait = current, 0
        elif not cooldown_counter > 0:
            wait += 1
            if wait >= patience and lr > min_lr:
                lr = max(lr * factor, min_lr)
                cooldown_counter, wait = cooldown, 0
        out.append(lr)
    return out


def keras_best(values, maximize):
    """ModelCheckpoint(save_best_only=True): the index of the validation it keeps."""
    best, at = (-math.inf if maximize else math.inf), None
    for i, current in enumerate(values):
        if (current > best) if maximize else (current < best):
            best, at = current, i
    return at


# --- runs ---------------------------------------------------------------------------------

def config(tag, **over):
    cfg = dict(
        name=tag, run_dir=os.path.join(WORK, "runs", tag), seed=11,
        data=dict(train=os.path.join(WORK, "train.h5"), validation=os.path.join(WORK, "val.h5"),
                  synthesize=dict(count=12, height=40, width=32, channels=1, classes=2, validation_count=10)),
        model=dict(input=[40, 32, 1], layers=[
            dict(type="conv2d", filters=4, kernel=3, padding="same", bias=False),
            dict(type="batch_norm"), dict(type="relu"), dict(type="max_pool2d", pool=2),
            dict(type="conv2d", filters=6, kernel=3, padding="same"), dict(type="relu"),
            dict(type="global_avg_pool"), dict(type="dense", units=2)]),
        training=dict(batch_size=4, steps=STEPS, optimizer=dict(type="sgd", lr=LR, momentum=0.9),
                      validate_every=EVERY, metrics=["accuracy", "auc"], log_every=1,
                      early_stopping=dict(monitor="val_loss", patience=4, min_delta=0.002),
                      lr_schedule=dict(type="plateau", monitor="val_accuracy", factor=0.5, patience=1,
                                       min_delta=0.0, cooldown=1, min_lr=0.01)),
        parallel=dict(backend="cpu", grid=[2, 1], device_memory="1GiB"),
        checkpoint=dict(every_steps=EVERY, keep=1, resume="auto", best=dict(monitor="val_auc")),
    )
    return write_config(WORK, tag, cfg, over)


def train(cfg, *sets):
    cmd = [BIN, "train", cfg] + [a for s in sets for a in ("--set", s)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def metrics(tag):
    with open(os.path.join(WORK, "runs", tag, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def weights(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and not name.startswith("halotrain/config") and name != "halotrain/monitors":
                out[name] = np.asarray(obj)
        f.visititems(visit)
    return out


def newest(tag):
    files = glob.glob(os.path.join(WORK, "runs", tag, "checkpoints", "ckpt-*.h5"))
    return max(files, key=lambda p: int(os.path.basename(p)[5:-3])) if files else None


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)

    # 1. All three monitors, straight through.
    r = train(config("watch"))
    check("a run with early stopping, a plateau and a best checkpoint exits 0", r.returncode == 0, r.stderr[-3000:])
    if r.returncode != 0:
        return
    rows = metrics("watch")
    validated = [row for row in rows if row["val_loss"] != ""]
    loss = [float(v["val_loss"]) for v in validated]
    acc = [float(v["val_accuracy"]) for v in validated]
    auc = [float(v["val_auc"]) for v in validated]
    stop = keras_early_stopping(loss, 4, 0.002, maximize=False)
    want_end = int(validated[stop]["step"]) if stop is not None else STEPS
    end = int(rows[-1]["step"])
    check(f"it ends where Keras's EarlyStopping would (step {want_end}; {len(loss)} validations)", end == want_end,
          f"ended at step {end}")
    check("the log says why it stopped", stop is None or "early stopping: val_loss has not improved" in r.stderr,
          r.stderr[-1500:])
    lrs = keras_plateau(acc, LR, 0.5, 1, 0.0, 1, 0.01, maximize=True)
    want_lr, k = [], 0
    for row in rows:  # a step's rate is the one set by the validations before it
        step = int(row["step"])
        while k < len(validated) and int(validated[k]["step"]) < step:
            k += 1
        want_lr.append(LR if k == 0 else lrs[k - 1])
    got_lr = [float(row["lr"]) for row in rows]
    lowered = len(set(lrs)) > 1
    check(f"every step's learning rate is ReduceLROnPlateau's (lowered {len(set(lrs)) - 1} times)",
          lowered and all(abs(a - b) <= 1e-12 + 1e-7 * b for a, b in zip(got_lr, want_lr)),
          f"got {got_lr} want {want_lr}")
    best = os.path.join(WORK, "runs", "watch", "checkpoints", "best.h5")
    at = keras_best(auc, maximize=True)
    ok = os.path.exists(best)
    step = None
    if ok:
        with h5py.File(best, "r") as f:
            step = int(f["halotrain"].attrs["step"])
    check(f"best.h5 is the step ModelCheckpoint(save_best_only) keeps (step {validated[at]['step']})",
          ok and step == int(validated[at]["step"]), f"best.h5 at step {step}")
    kept = sorted(os.path.basename(p) for p in glob.glob(os.path.join(WORK, "runs", "watch", "checkpoints", "*.h5")))
    check("checkpoint.keep 1 pruned the step checkpoints, never best.h5", len(kept) == 2 and "best.h5" in kept, kept)
    ins = subprocess.run([BIN, "inspect", best], capture_output=True, text=True, timeout=60)
    check("best.h5 verifies and inspect shows the monitors' state", ins.returncode == 0 and "checksum: OK" in ins.stdout
          and '"monitor":"val_auc"' in ins.stdout, ins.stdout[-800:])

    # 2. The same run cut where a plateau wait and an early-stopping patience are under way.
    cut = None
    for i in range(1, (stop if stop is not None else len(loss)) - 1):
        es_wait = 0
        b = math.inf
        for v in loss[:i + 1]:
            es_wait += 1
            if v + 0.002 < b:
                b, es_wait = v, 0
        if es_wait > 0:
            cut = int(validated[i]["step"])
            break
    if cut is None:
        check("the run has a validation without improvement to cut at", False, loss)
    else:
        first = train(config("split"), f"training.steps={cut}")
        second = train(config("split"))
        check(f"cut at step {cut} (early-stopping wait under way) and resumed: both exit 0",
              first.returncode == 0 and second.returncode == 0, (first.stderr + second.stderr)[-3000:])
        a, b = newest("watch"), newest("split")
        same = a and b and os.path.basename(a) == os.path.basename(b)
        wa, wb = (weights(a), weights(b)) if same else ({}, {})
        diff = [n for n in wa if n not in wb or not np.array_equal(wa[n], wb[n])]
        check("the resumed run ends at the same step with the same weights and state, bit for bit",
              same and not diff, f"{a} vs {b}: {diff[:5]}")
        check("and the same learning rate at every step",
              [row["lr"] for row in metrics("split")] == [row["lr"] for row in rows])

    # 3. A stop that must come: nothing is an improvement of 100.
    cfg = config("stops", **{"training.early_stopping": dict(monitor="val_auc", patience=2, min_delta=100.0)})
    r = train(cfg)
    rows = metrics("stops")
    check("early stopping ends the run with exit 0 at the third validation (step 9)",
          r.returncode == 0 and int(rows[-1]["step"]) == 3 * EVERY and "stopping after step 9" in r.stderr,
          r.stderr[-1500:])
    # What a kill -9 in the middle of writing best.h5 leaves: its temporary beside the intact file.
    ckdir = os.path.join(WORK, "runs", "stops", "checkpoints")
    torn = os.path.join(ckdir, "best.h5.tmp-999999")
    with open(torn, "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    before = sorted(n for n in os.listdir(ckdir) if n != os.path.basename(torn))
    again = train(cfg)
    after = sorted(os.listdir(os.path.join(WORK, "runs", "stops", "checkpoints")))
    check("resubmitted, the stopped run exits 0 at once and writes no checkpoint",
          again.returncode == 0 and "the run stopped early at step 9" in again.stderr and before == after,
          again.stderr[-1500:])
    ins = subprocess.run([BIN, "inspect", os.path.join(ckdir, "best.h5")], capture_output=True, text=True, timeout=60)
    check("a torn best.h5 temporary is removed; best.h5 is intact and verifies",
          not os.path.exists(torn) and ins.returncode == 0 and "checksum: OK" in ins.stdout, ins.stdout[-500:])

    # 4. Monitors that cannot be computed.
    r = train(config("bad", **{"checkpoint.best": dict(monitor="val_dice")}))
    check("an unknown monitor: exit 1 naming the figures validation computes",
          r.returncode == 1 and "checkpoint.best.monitor: expected a validation figure: one of val_loss, val_accuracy, "
          "val_auc" in r.stderr and "found 'val_dice'" in r.stderr, r.stderr[-800:])
    r = train(config("noval", **{"training.validate_every": 0}))
    check("a monitor without validate_every: exit 1 saying what to set",
          r.returncode == 1 and "training.validate_every" in r.stderr and "val_" in r.stderr, r.stderr[-800:])

    # 5. Frozen layers: what the plan holds for them.
    def plan_memory(cfg):
        p = subprocess.run([BIN, "plan", cfg, "--json"], capture_output=True, text=True, timeout=120)
        return json.loads(p.stdout)["ranks"][0]["memory"] if p.returncode == 0 else None
    base = plan_memory(config("plain"))
    cfg = config("frozen_stem")
    with open(cfg) as f:
        c = json.load(f)
    for layer in c["model"]["layers"][:2]:
        layer["trainable"] = False
    with open(cfg, "w") as f:
        json.dump(c, f)
    frozen = plan_memory(cfg)
    stem = (3 * 3 * 1 * 4 + 2 * 4) * 4  # the conv's kernel, the batch norm's gamma and beta, float32
    check(f"a frozen stem's plan holds no gradient and no optimizer state for it ({stem} bytes each)",
          base and frozen and base["grads"] - frozen["grads"] == stem and base["optimizer"] - frozen["optimizer"] == stem
          and frozen["total"] < base["total"], f"{base} vs {frozen}")
    r = train(cfg, "training.early_stopping=null", "training.steps=6")
    stem_after = weights(newest("frozen_stem")) if r.returncode == 0 else {}
    kernel = "conv2d_1/conv2d_1/kernel:0"
    init = subprocess.run([BIN, "train", cfg, "--set", "training.steps=1", "--set", "training.early_stopping=null",
                           "--set", f"run_dir={os.path.join(WORK, 'runs', 'frozen_stem_1')}"],
                          capture_output=True, text=True, timeout=600)
    stem_before = weights(newest("frozen_stem_1")) if init.returncode == 0 else {}
    check("a model with a frozen stem trains, and the stem's kernel stays as it was",
          kernel in stem_after and kernel in stem_before and np.array_equal(stem_after[kernel], stem_before[kernel])
          and not np.array_equal(stem_after["dense_1/dense_1/kernel:0"], stem_before["dense_1/dense_1/kernel:0"]),
          r.stderr[-1500:])

    # 6. Resumed across unfreeze_at: the same as straight through.
    over = {"training.freeze": ["conv2d_1", "batch_normalization_*"], "training.unfreeze_at": 4,
            "training.early_stopping": None, "training.steps": 9}
    straight = train(config("unfreeze", **over))
    first = train(config("unfreeze_split", **over), "training.steps=3")
    second = train(config("unfreeze_split", **over))
    check("freeze released at step 5: straight, and cut at step 3 and resumed, exit 0",
          straight.returncode == first.returncode == second.returncode == 0,
          (straight.stderr + first.stderr + second.stderr)[-2000:])
    a, b = newest("unfreeze"), newest("unfreeze_split")
    wa, wb = (weights(a), weights(b)) if a and b else ({}, {})
    diff = [n for n in wa if n not in wb or not np.array_equal(wa[n], wb[n])]
    check("the resumed run ends with the same weights and optimizer state, bit for bit", wa and not diff, diff[:5])
    r = train(config("nomatch", **{"training.freeze": ["stem*"], "training.unfreeze_at": 2}))
    check("a freeze pattern that matches nothing: exit 1 naming it and the layers with weights",
          r.returncode == 1 and "training.freeze: 'stem*' matches no layer with weights" in r.stderr
          and "conv2d_1" in r.stderr, r.stderr[-800:])


if __name__ == "__main__":
    main()
    print(f"{RESULTS.count(False)} failed" if False in RESULTS else "all passed")
    sys.exit(0 if RESULTS and all(RESULTS) else 1)
