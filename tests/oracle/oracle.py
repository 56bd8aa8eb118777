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
import checkpoints  # noqa: E402

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
}

COUNT, BATCH, SEED = 6, 4, 99


# --- the data order of worker/batch.cpp: splitmix64 Fisher-Yates per epoch -------------
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


# --- the model in PyTorch, float64, whole image ----------------------------------------
def window(n, k, s, d, padding):
    span = d * (k - 1) + 1
    if padding == "same":
        out = -(-n // s)
        total = max((out - 1) * s + span - n, 0)
        return total // 2, total - total // 2
    if padding == "valid":
        return 0, 0
    return int(padding), int(padding)


def margins(v):
    """zero_padding2d / cropping2d margins as ((top, bottom), (left, right))."""
    if isinstance(v, int):
        return (v, v), (v, v)
    return tuple(tuple(a) if isinstance(a, list) else (a, a) for a in v)


def layer_names(layers):
    # An explicit name, or Keras's numbered per name prefix (relu, sigmoid and tanh are all
    # Activation layers), counting the unnamed layers only.
    prefix = dict(conv2d="conv2d", batch_norm="batch_normalization", relu="activation", sigmoid="activation",
                  tanh="activation", leaky_relu="leaky_re_lu", max_pool2d="max_pooling2d",
                  avg_pool2d="average_pooling2d", global_avg_pool="global_average_pooling2d",
                  global_max_pool="global_max_pooling2d", dropout="dropout", dense="dense", add="add",
                  concatenate="concatenate", depthwise_conv2d="depthwise_conv2d",
                  separable_conv2d="separable_conv2d", upsampling2d="up_sampling2d",
                  conv2d_transpose="conv2d_transpose", zero_padding2d="zero_padding2d", cropping2d="cropping2d")
    counts, names = {}, []
    for l in layers:
        if "name" in l:
            names.append(l["name"])
            continue
        p = prefix[l["type"]]
        counts[p] = counts.get(p, 0) + 1
        names.append(f"{p}_{counts[p]}")
    return names


def inputs_of(layers, names, i):
    """The names a layer reads: its `inputs`, or the layer before it ("input" for the first)."""
    return layers[i].get("inputs", ["input" if i == 0 else names[i - 1]])


def init_weights(case, rng):
    """Keras-layout weights per layer name, float32 (what the .h5 file holds)."""
    names = layer_names(case["layers"])
    channels = {"input": case["input"][2]}
    weights = {}
    for i, (name, l) in enumerate(zip(names, case["layers"])):
        ins = [channels[n] for n in inputs_of(case["layers"], names, i)]
        c = ins[0]
        if l["type"] == "concatenate":
            c = sum(ins)
        t = l["type"]
        if t == "conv2d":
            k = l["kernel"]
            fan = k * k * c
            w = [("kernel:0", rng.uniform(-1, 1, (k, k, c, l["filters"])) * math.sqrt(3.0 / fan))]
            if l.get("bias", True):
                w.append(("bias:0", rng.uniform(-0.1, 0.1, (l["filters"],))))
            c = l["filters"]
        elif t == "conv2d_transpose":
            k = l["kernel"]
            w = [("kernel:0", rng.uniform(-1, 1, (k, k, l["filters"], c)) * math.sqrt(3.0 / (k * k * c)))]
            if l.get("bias", True):
                w.append(("bias:0", rng.uniform(-0.1, 0.1, (l["filters"],))))
            c = l["filters"]
        elif t in ("depthwise_conv2d", "separable_conv2d"):
            k, m = l["kernel"], l.get("depth_multiplier", 1)
            w = [("depthwise_kernel:0", rng.uniform(-1, 1, (k, k, c, m)) * math.sqrt(3.0 / (k * k)))]
            c = c * m
            if t == "separable_conv2d":
                w.append(("pointwise_kernel:0", rng.uniform(-1, 1, (1, 1, c, l["filters"])) * math.sqrt(3.0 / c)))
                c = l["filters"]
            if l.get("bias", True):
                w.append(("bias:0", rng.uniform(-0.1, 0.1, (c,))))
        elif t == "batch_norm":  # center / scale false: no beta / gamma
            w = [("gamma:0", rng.uniform(0.5, 1.5, (c,))), ("beta:0", rng.uniform(-0.2, 0.2, (c,))),
                 ("moving_mean:0", rng.uniform(-0.1, 0.1, (c,))), ("moving_variance:0", rng.uniform(0.5, 1.5, (c,)))]
            w = [(n, v) for n, v in w if (n != "gamma:0" or l.get("scale", True)) and (n != "beta:0" or l.get("center", True))]
        elif t == "dense":
            w = [("kernel:0", rng.uniform(-1, 1, (c, l["units"])) * math.sqrt(3.0 / c)),
                 ("bias:0", rng.uniform(-0.1, 0.1, (l["units"],)))]
            c = l["units"]
        else:
            w = []
        weights[name] = [(n, np.asarray(v, dtype=np.float32)) for n, v in w]
        channels[name] = c
    return weights


def write_keras_weights(path, case, weights):
    names = layer_names(case["layers"])
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.array([n.encode() for n in names])
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.1.6"
        for n in names:
            g = f.create_group(n)
            g.attrs["weight_names"] = np.array([f"{n}/{w}".encode() for w, _ in weights[n]])
            for w, v in weights[n]:
                g.create_dataset(f"{n}/{w}", data=v)


class Torch:
    def __init__(self, case, weights):
        self.case = case
        self.step = 0  # the training step: dropout's mask depends on it
        self.names = layer_names(case["layers"])
        self.p = {}
        self.weights_shape = {}
        for n, l in zip(self.names, case["layers"]):
            for w, v in weights[n]:
                self.weights_shape[(n, w)] = v.shape
                t = torch.tensor(v, dtype=torch.float64)
                if (w == "kernel:0" and l["type"] in ("conv2d", "conv2d_transpose")) or w == "pointwise_kernel:0":
                    t = t.permute(3, 2, 0, 1).contiguous()
                elif w == "depthwise_kernel:0":  # (kh, kw, cin, m) -> [cin * m][1][kh][kw]
                    t = t.reshape(v.shape[0], v.shape[1], -1).permute(2, 0, 1).unsqueeze(1).contiguous()
                self.p[(n, w)] = t.requires_grad_(w not in ("moving_mean:0", "moving_variance:0"))

    def params(self):
        return [t for (n, w), t in self.p.items() if t.requires_grad]

    def forward(self, x, training=True):
        tensors = {"input": x}
        for i, (n, l) in enumerate(zip(self.names, self.case["layers"])):
            ins = [tensors[name] for name in inputs_of(self.case["layers"], self.names, i)]
            x = ins[0]
            t = l["type"]
            if t == "conv2d":
                k, s, d = l["kernel"], l.get("stride", 1), l.get("dilation", 1)
                pt, pb = window(x.shape[2], k, s, d, l.get("padding", "valid"))
                pl, pr = window(x.shape[3], k, s, d, l.get("padding", "valid"))
                x = F.conv2d(F.pad(x, (pl, pr, pt, pb)), self.p[(n, "kernel:0")], self.p.get((n, "bias:0")),
                             stride=s, dilation=d)
            elif t in ("depthwise_conv2d", "separable_conv2d"):
                k, s, d = l["kernel"], l.get("stride", 1), l.get("dilation", 1)
                pt, pb = window(x.shape[2], k, s, d, l.get("padding", "valid"))
                pl, pr = window(x.shape[3], k, s, d, l.get("padding", "valid"))
                separable = t == "separable_conv2d"
                x = F.conv2d(F.pad(x, (pl, pr, pt, pb)), self.p[(n, "depthwise_kernel:0")],
                             None if separable else self.p.get((n, "bias:0")), stride=s, dilation=d, groups=x.shape[1])
                if separable:
                    x = F.conv2d(x, self.p[(n, "pointwise_kernel:0")], self.p.get((n, "bias:0")))
            elif t == "conv2d_transpose":
                k, s = l["kernel"], l.get("stride", 1)
                x_in = x
                x = F.conv_transpose2d(x, self.p[(n, "kernel:0")], self.p.get((n, "bias:0")), stride=s)
                if l.get("padding", "valid") == "same":  # the k - s extra rows: the smaller half at the top
                    crop = k - s
                    h, w = x_in.shape[2] * s, x_in.shape[3] * s
                    x = x[:, :, crop // 2:crop // 2 + h, crop // 2:crop // 2 + w]
            elif t == "upsampling2d":
                size = l.get("size", 2)
                size = tuple(size) if isinstance(size, list) else (size, size)
                mode = l.get("interpolation", "nearest")
                x = F.interpolate(x, scale_factor=size, mode=mode,
                                  **({"align_corners": False} if mode == "bilinear" else {}))
            elif t in ("zero_padding2d", "cropping2d"):
                (top, bottom), (left, right) = margins(l.get("padding" if t == "zero_padding2d" else "cropping",
                                                             1 if t == "zero_padding2d" else 0))
                if t == "zero_padding2d":
                    x = F.pad(x, (left, right, top, bottom))
                else:
                    x = x[:, :, top:x.shape[2] - bottom, left:x.shape[3] - right]
            elif t == "batch_norm":
                x = F.batch_norm(x, self.p[(n, "moving_mean:0")].data, self.p[(n, "moving_variance:0")].data,
                                 self.p.get((n, "gamma:0")), self.p.get((n, "beta:0")), training=training,
                                 momentum=1 - l.get("momentum", 0.99), eps=l.get("epsilon", 1e-3))
            elif t == "relu":
                x = F.relu(x)
            elif t == "leaky_relu":
                x = F.leaky_relu(x, negative_slope=l.get("alpha", 0.3))
            elif t == "sigmoid":
                x = torch.sigmoid(x)
            elif t == "tanh":
                x = torch.tanh(x)
            elif t in ("max_pool2d", "avg_pool2d"):
                k = l.get("pool", 2)
                s = l.get("stride", k)
                pt, pb = window(x.shape[2], k, s, 1, l.get("padding", "valid"))
                pl, pr = window(x.shape[3], k, s, 1, l.get("padding", "valid"))
                if t == "max_pool2d":
                    x = F.max_pool2d(F.pad(x, (pl, pr, pt, pb), value=-math.inf), k, s)
                else:
                    ones = torch.ones_like(x[:1, :1])
                    total = F.avg_pool2d(F.pad(x, (pl, pr, pt, pb)), k, s)
                    count = F.avg_pool2d(F.pad(ones, (pl, pr, pt, pb)), k, s)
                    x = total / count
            elif t == "global_avg_pool":
                x = x.mean(dim=(2, 3))
            elif t == "dropout":
                rate = l["rate"]
                if training:
                    keep = torch.tensor(dropout_mask(tuple(x.shape), self.names.index(n), self.step, rate))
                    x = x * keep.to(x.dtype) * float(np.float32(1.0 / (1.0 - rate)))
            elif t == "global_max_pool":
                x = x.amax(dim=(2, 3))  # ties share the gradient
            elif t == "dense":
                x = x @ self.p[(n, "kernel:0")] + self.p[(n, "bias:0")]
            elif t == "add":
                x = sum(ins[1:], ins[0])
            elif t == "concatenate":
                x = torch.cat(ins, dim=1)
            tensors[n] = x
        return x

    def keras(self, n, w):
        t = self.p[(n, w)].detach()
        if w == "depthwise_kernel:0":  # [cin * m][1][kh][kw] -> (kh, kw, cin, m)
            cin = self.weights_shape[(n, w)][2]
            t = t.squeeze(1).permute(1, 2, 0).reshape(t.shape[2], t.shape[3], cin, -1)
        elif t.dim() == 4:
            t = t.permute(2, 3, 1, 0)
        return t.numpy()


def mix64(z):
    """splitmix64's finaliser on uint64 arrays (kernels/dropout.hpp)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_mask(shape, layer, step, rate):
    """Kept elements of a [B, C, H, W] tensor (or [B, C]): a function of (seed, layer, step,
    batch position, channel, pixel of the whole image), as kernels/dropout.hpp."""
    u = lambda v: np.asarray(v, dtype=np.uint64)
    with np.errstate(over="ignore"):
        key = mix64(mix64(mix64(u(SEED)) ^ u(layer)) ^ u(step))
        b, c = shape[0], shape[1]
        h, w = (shape[2], shape[3]) if len(shape) == 4 else (1, 1)
        z = mix64(key ^ u(np.arange(b))[:, None, None, None])
        z = mix64(z ^ u(np.arange(c))[None, :, None, None])
        z = mix64(z ^ u(np.arange(h))[None, None, :, None])
        z = mix64(z ^ u(np.arange(w))[None, None, None, :])
    keep = (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 >= rate
    return keep.reshape(shape)


def loss_of(case, out, labels, masks):
    if case["loss"] == "softmax_cross_entropy" and case.get("masks"):
        return F.cross_entropy(out, masks[:, 0].long())  # per pixel, the mean over every pixel
    if case["loss"] == "softmax_cross_entropy":
        return F.cross_entropy(out, labels)
    if case["loss"] == "sigmoid_bce":
        return F.binary_cross_entropy_with_logits(out, masks)
    target = masks if case.get("masks") else F.one_hot(labels, out.shape[1]).to(out.dtype)
    return F.mse_loss(out, target)


def reference(case, images, labels, masks, weights):
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
        opt.zero_grad()
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
                      init_weights=os.path.join(workdir, "init.h5")),
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
    images = rng.uniform(0, 1, (COUNT, h, w, c)).astype(np.float32)
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
