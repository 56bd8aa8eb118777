#!/usr/bin/python3
"""The keras.applications of Keras 2.1 and 2.2 (VGG16, ResNet50, InceptionV3, MobileNet in
both releases' forms, Xception, DenseNet121), written by the test as those releases wrote
their JSON (tests/import/keras_models.py, at reduced width), and a model of the newer
Keras vocabulary (swish, ReLU(6), hard_sigmoid, gelu, squeeze-excitation with Multiply,
LayerNormalization, stochastic depth, instance and group norm, grouped and non-square
convs). For each:

- model.save() files written with h5py, imported with `halotrain import` (InceptionV3 with
  an open input and --input-size);
- one step of SGD sharded on an uneven grid from the imported weights, every weight equal
  to a PyTorch float64 model built from the same JSON by tests/import/keras_torch.py
  (dropout rates 0), within an allowance that follows each weight's own conditioning
  (below), with the memory model exact;
- `halotrain predict` from that checkpoint equal to the PyTorch eval forward of the
  checkpoint's weights.

usage: keras_apps_test.py HALOTRAIN WORKDIR [MODEL...]   (HT_GRID=R,C: every model on that grid)
"""
import copy
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
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
import keras_models  # noqa: E402
import oracle  # noqa: E402  (data order, memory check, tolerances)
from keras_torch import KerasTorch, draw_weights, layers_of, probabilities, write_model_save  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
FAILED = []
# The grid each trains on: uneven shards everywhere, tails where the maps get small.
GRIDS = {"vgg16": [3, 2], "resnet50": [3, 2], "inception_v3": [2, 2], "mobilenet": [3, 1], "mobilenet_21": [2, 2],
         "xception": [2, 3], "densenet121": [3, 2], "vocabulary": [2, 3]}
# One step of plain SGD, compared as the step it took (w1 - w0, the gradient times LR) per
# weight, against the largest step in its layer: several steps of fifty layers of batch
# norm on random weights are chaotic (moving the initial weights by 1e-7 of themselves
# moves PyTorch float64's own weights after 3 steps 50 to 1000 times the oracle's
# tolerance), and Adam divides each gradient by its own size, so a bias before a batch
# norm (gradient zero but for rounding) would move by LR whatever its rounding.
LR = 0.1
STEP_RTOL = 1e-3
# Even one step is not always well-conditioned: PyTorch float32's step of ResNet50's first
# conv is 24 times the allowance away from float64's, and where float32 lands on the other
# side of a kink (a ReLU's input or a max-pool window's two largest within 1e-5), a
# gradient takes another path (a ReLU6 in MobileNet's 6x6 maps moves its earlier layers'
# steps by 1%). A weight may also differ by ENVELOPE times the most PyTorch's float32 step
# moves, plus the sum of what flipping each such kink of the float64 model moves.
ENVELOPE = 3.0


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def without_dropout(model):
    m = copy.deepcopy(model)
    for l in layers_of(m):
        if l["class_name"] == "Dropout":
            l["config"]["rate"] = 0.0
    return m


def input_shape(model, info):
    shape = layers_of(model)[0]["config"]["batch_input_shape"]
    h, w = info.get("input_size") or (shape[1], shape[2])
    return h, w, shape[3]


def train_torch(model, weights, images, labels, dtype=torch.float64, flips=()):
    """The model after one step of SGD in PyTorch, on the test's first batch."""
    ref = KerasTorch(model, weights, dtype=dtype, flips=flips)
    opt = torch.optim.SGD(ref.params(), lr=LR)
    idx = oracle.samples_of_step(0, len(images))
    x = torch.tensor(images[idx], dtype=dtype).permute(0, 3, 1, 2)
    F.cross_entropy(ref.forward(x), torch.tensor(labels[idx], dtype=torch.int64)).backward()
    opt.step()
    return ref


def uncertainty(model, weights, images, labels, ref):
    """Per weight, how far PyTorch's own step may move: the most its float32 step does, plus
    what flipping each of the float64 model's near kinks does."""
    def moved(other):
        return {k: float(np.abs(other.keras_value(*k) - ref.keras_value(*k)).max()) for k in ref.p}
    most = moved(train_torch(model, weights, images, labels, torch.float32))
    for kink in ref.near_kinks:
        for k, v in moved(train_torch(model, weights, images, labels, flips=[kink])).items():
            most[k] += v
    return most, len(ref.near_kinks)


def compare(ref, weights, most, ckpt):
    """Per weight, the worst error over its allowance: for what SGD moves, STEP_RTOL times
    the largest step in its layer (a bias before a batch norm has a gradient of rounding
    only, of the size of its kernel's rounding) plus float32's rounding of the weight; for
    moving statistics, the oracle's tolerance; and ENVELOPE times `most`, PyTorch's own
    uncertainty."""
    initial = {(n, w): np.asarray(v, dtype=np.float64) for n, ws in weights.items() for w, v in ws}
    steps = {k: ref.keras_value(*k) - initial[k].reshape(ref.keras_value(*k).shape)
             for k, t in ref.p.items() if t.requires_grad}
    largest = {}
    for (n, _), step in steps.items():
        largest[n] = max(largest.get(n, 0.0), float(np.abs(step).max()))
    worst, bad = 0.0, []
    with h5py.File(ckpt, "r") as f:
        for (n, w), t in ref.p.items():
            ours = n.replace("/", "_")
            got = np.asarray(f[ours][ours][w], dtype=np.float64)
            want = ref.keras_value(n, w).reshape(got.shape)
            if t.requires_grad:
                allowed = STEP_RTOL * largest[n] + 3e-7 * (1 + np.abs(want).max())
            else:
                allowed = oracle.ATOL + oracle.RTOL * np.abs(want)
            ratio = np.abs(got - want) / (allowed + ENVELOPE * most[(n, w)])
            worst = max(worst, float(ratio.max()))
            if (ratio > 1).any():
                bad.append(f"{n}/{w} ({float(ratio.max()):.3g})")
    return worst, bad


def case(name, builder, info):
    work = os.path.join(WORK, name)
    os.makedirs(work)
    model = without_dropout(builder())
    h, w, c = input_shape(model, info)
    rng = np.random.default_rng(5)
    weights = draw_weights(model, (2, c, h, w), rng)
    src = os.path.join(work, f"{name}.h5")
    write_model_save(src, model, weights)
    r = subprocess.run([BIN, "import", src] + info.get("import_args", []), capture_output=True, text=True,
                       timeout=300)
    cfg, init = os.path.join(work, f"{name}.yaml"), os.path.join(work, f"{name}-init.h5")
    check(f"{name}: import exits 0 and writes the config and the weights", r.returncode == 0 and os.path.exists(init),
          (r.stdout + r.stderr)[-2000:])
    if r.returncode != 0:
        return
    n = oracle.COUNT
    images = rng.uniform(0, 1, (n, h, w, c)).astype(np.float32)
    labels = rng.integers(0, 2, n).astype(np.int32)
    data = os.path.join(work, "data.h5")
    with h5py.File(data, "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=labels)
    ref = train_torch(model, weights, images, labels)
    most, kinks = uncertainty(model, weights, images, labels, ref)
    grid = [int(v) for v in os.environ["HT_GRID"].split(",")] if "HT_GRID" in os.environ else GRIDS[name]
    run_dir = os.path.join(work, "run")
    sets = [f"data.train={data}", "data.targets=labels", "data.synthesize=null", f"seed={oracle.SEED}",
            f"training.batch_size={oracle.BATCH}", "training.steps=1",
            f"training.optimizer={{type: sgd, lr: {LR}, momentum: 0}}",
            f"parallel.grid=[{grid[0]},{grid[1]}]", "parallel.device_memory=4GiB",
            f"run_dir={run_dir}", "checkpoint.every_steps=0", "model.loss=softmax_cross_entropy"]
    r = subprocess.run([BIN, "train", cfg] + [a for s in sets for a in ("--set", s)], capture_output=True, text=True,
                       timeout=900, cwd=work)
    ckpt = os.path.join(run_dir, "checkpoints", "ckpt-1.h5")
    check(f"{name}: trains a step on grid {grid}", r.returncode == 0 and os.path.exists(ckpt), r.stderr[-3000:])
    if r.returncode != 0:
        return
    worst, bad = compare(ref, weights, most, ckpt)
    mem, line = oracle.check_memory(run_dir)
    check(f"{name}: every weight equals PyTorch float64 after the step (worst {worst:.3g} of its allowance, "
          f"{kinks} near kinks); {line}",
          not bad and not mem, f"{bad[:5]} {mem}")
    out = os.path.join(work, "predictions.h5")
    r = subprocess.run([BIN, "predict", cfg, "--checkpoint", ckpt, "--input", data, "--output", out] +
                       [a for s in sets for a in ("--set", s)], capture_output=True, text=True, timeout=600, cwd=work)
    if r.returncode != 0:
        return check(f"{name}: predict exits 0", False, r.stderr[-2000:])
    # The forward of the checkpoint's own weights: eval-mode batch norm with moving
    # statistics one step old is far from the batch's, and in ResNet50 amplifies the
    # weights' allowed differences to 1e-3 in the output.
    with h5py.File(ckpt, "r") as f:
        trained = {n: [(w, np.asarray(f[n.replace("/", "_")][n.replace("/", "_")][w])) for w, _ in ws]
                   for n, ws in weights.items() if ws}
    with torch.no_grad():
        x = torch.tensor(images, dtype=torch.float64).permute(0, 3, 1, 2)
        want = probabilities(KerasTorch(model, trained).forward(x, training=False)).numpy()
    with h5py.File(out, "r") as f:
        got = np.asarray(f["predictions"], dtype=np.float64)
    check(f"{name}: predict equals the PyTorch eval forward of the checkpoint (largest difference "
          f"{np.abs(got - want).max():.2g})", got.shape == want.shape and np.allclose(got, want, atol=2e-5, rtol=2e-4))

def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    names = sys.argv[3:] or list(keras_models.MODELS)
    for name in names:
        builder, info = keras_models.MODELS[name]
        torch.manual_seed(3)
        case(name, builder, info)
    print(f"{len(FAILED)} failed" if FAILED else "all passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
