"""A halotrain model (the YAML layer list of SPEC sections 3, 7 and 11) as a PyTorch float64
model on the whole image: the oracle every sharded run is compared with.

Feature maps are [N, C, H, W]; the per-image channel vectors after a global pool (or a
flatten) are [N, C]. Weights are held in PyTorch layouts and read and written in Keras's
(SPEC section 4). Each layer type is one handler of Torch.HANDLERS.
"""
import math

import h5py
import numpy as np
import torch
import torch.nn.functional as F

SEED = 99  # the run's seed: dropout and drop_path masks depend on it

# Keras default name prefixes (SPEC section 3): kinds that share a Keras class share numbers.
PREFIX = dict(conv2d="conv2d", batch_norm="batch_normalization", relu="activation", sigmoid="activation",
              tanh="activation", leaky_relu="leaky_re_lu", max_pool2d="max_pooling2d",
              avg_pool2d="average_pooling2d", global_avg_pool="global_average_pooling2d",
              global_max_pool="global_max_pooling2d", dropout="dropout", dense="dense", add="add",
              concatenate="concatenate", depthwise_conv2d="depthwise_conv2d", separable_conv2d="separable_conv2d",
              upsampling2d="up_sampling2d", conv2d_transpose="conv2d_transpose", zero_padding2d="zero_padding2d",
              cropping2d="cropping2d", resize="resizing", relu6="re_lu", clip="activation", silu="activation",
              hard_sigmoid="activation", hard_swish="activation", gelu="activation", multiply="multiply",
              layer_norm="layer_normalization", scale="scale", drop_path="drop_path", flatten="flatten",
              channel_shuffle="channel_shuffle", channel_slice="channel_slice",
              instance_norm="instance_normalization", group_norm="group_normalization")


def layer_names(layers):
    # An explicit name, or Keras's numbered per name prefix, counting the unnamed layers only.
    counts, names = {}, []
    for l in layers:
        if "name" in l:
            names.append(l["name"])
            continue
        p = PREFIX[l["type"]]
        counts[p] = counts.get(p, 0) + 1
        names.append(f"{p}_{counts[p]}")
    return names


def inputs_of(layers, names, i):
    """The names a layer reads: its `inputs`, or the layer before it ("input" for the first)."""
    return layers[i].get("inputs", ["input" if i == 0 else names[i - 1]])


def pair(v):
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v)


def side_pads(padding, n, k, s, d, axis):
    """(before, after) along one axis for a halotrain padding: same (TensorFlow), valid, an
    integer, [h, w], or [[top, bottom], [left, right]]."""
    span = d * (k - 1) + 1
    if padding == "same":
        out = -(-n // s)
        total = max((out - 1) * s + span - n, 0)
        return total // 2, total - total // 2
    if padding == "valid":
        return 0, 0
    if isinstance(padding, int):
        return padding, padding
    a = padding[axis]
    return (a, a) if isinstance(a, int) else tuple(a)


def window_pads(l, x, k, s, d):
    """F.pad's (left, right, top, bottom) of a windowed layer on x."""
    p = l.get("padding", "valid")
    top, bottom = side_pads(p, x.shape[2], k[0], s[0], d[0], 0)
    left, right = side_pads(p, x.shape[3], k[1], s[1], d[1], 1)
    return left, right, top, bottom


def margins(v):
    """zero_padding2d / cropping2d margins as ((top, bottom), (left, right))."""
    if isinstance(v, int):
        return (v, v), (v, v)
    return tuple(tuple(a) if isinstance(a, list) else (a, a) for a in v)


# --- masks (kernels/dropout.hpp) ------------------------------------------------------
def mix64(z):
    """splitmix64's finaliser on uint64 arrays."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def mask_key(layer, step):
    u = lambda v: np.asarray(v, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix64(mix64(mix64(u(SEED)) ^ u(layer)) ^ u(step))


def dropout_mask(shape, layer, step, rate):
    """Kept elements of a [B, C, H, W] tensor (or [B, C]): a function of (seed, layer, step,
    batch position, channel, pixel of the whole image)."""
    u = lambda v: np.asarray(v, dtype=np.uint64)
    with np.errstate(over="ignore"):
        key = mask_key(layer, step)
        b, c = shape[0], shape[1]
        h, w = (shape[2], shape[3]) if len(shape) == 4 else (1, 1)
        z = mix64(key ^ u(np.arange(b))[:, None, None, None])
        z = mix64(z ^ u(np.arange(c))[None, :, None, None])
        z = mix64(z ^ u(np.arange(h))[None, None, :, None])
        z = mix64(z ^ u(np.arange(w))[None, None, None, :])
    keep = (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 >= rate
    return keep.reshape(shape)


def drop_path_keep(images, layer, step, rate):
    """drop_path: image i of the step's batch kept whole or dropped whole."""
    with np.errstate(over="ignore"):
        z = mix64(mask_key(layer, step) ^ np.arange(images, dtype=np.uint64))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 >= rate


def kept_scale(rate):
    return float(np.float32(1.0 / (1.0 - rate)))  # the float32 factor halotrain applies


# --- Keras weight layouts ---------------------------------------------------------------
def to_torch(l, w, v):
    t = torch.tensor(v, dtype=torch.float64)
    if (w == "kernel:0" and l["type"] in ("conv2d", "conv2d_transpose")) or w == "pointwise_kernel:0":
        return t.permute(3, 2, 0, 1).contiguous()  # (kh, kw, in, out) -> [out][in][kh][kw]
    if w == "depthwise_kernel:0":  # (kh, kw, cin, m) -> [cin * m][1][kh][kw]
        return t.reshape(v.shape[0], v.shape[1], -1).permute(2, 0, 1).unsqueeze(1).contiguous()
    return t


def to_keras(t, w, shape):
    if w == "depthwise_kernel:0":  # [cin * m][1][kh][kw] -> (kh, kw, cin, m)
        return t.squeeze(1).permute(1, 2, 0).reshape(shape).numpy()
    if t.dim() == 4:
        return t.permute(2, 3, 1, 0).numpy()
    return t.numpy()


def new_weights(l, x, rng):
    """Keras-layout float32 initial weights of layer l on input x, from rng."""
    t, c = l["type"], x.shape[1]
    u = lambda lo, hi, shape: rng.uniform(lo, hi, shape)
    fan = lambda shape, n: u(-1, 1, shape) * math.sqrt(3.0 / n)
    w = []
    if t == "conv2d":
        kh, kw = pair(l.get("kernel", 1))
        g = l.get("groups", 1)
        w = [("kernel:0", fan((kh, kw, c // g, l["filters"]), kh * kw * c // g))]
        if l.get("bias", True):
            w.append(("bias:0", u(-0.1, 0.1, (l["filters"],))))
    elif t == "conv2d_transpose":
        kh, kw = pair(l["kernel"])
        w = [("kernel:0", fan((kh, kw, l["filters"], c), kh * kw * c))]
        if l.get("bias", True):
            w.append(("bias:0", u(-0.1, 0.1, (l["filters"],))))
    elif t in ("depthwise_conv2d", "separable_conv2d"):
        (kh, kw), m = pair(l["kernel"]), l.get("depth_multiplier", 1)
        w = [("depthwise_kernel:0", fan((kh, kw, c, m), kh * kw))]
        out = c * m
        if t == "separable_conv2d":
            w.append(("pointwise_kernel:0", fan((1, 1, out, l["filters"]), out)))
            out = l["filters"]
        if l.get("bias", True):
            w.append(("bias:0", u(-0.1, 0.1, (out,))))
    elif t == "batch_norm":  # center / scale false: no beta / gamma
        w = [("gamma:0", u(0.5, 1.5, (c,))), ("beta:0", u(-0.2, 0.2, (c,))),
             ("moving_mean:0", u(-0.1, 0.1, (c,))), ("moving_variance:0", u(0.5, 1.5, (c,)))]
        w = [(n, v) for n, v in w if (n != "gamma:0" or l.get("scale", True)) and (n != "beta:0" or l.get("center", True))]
    elif t in ("layer_norm", "instance_norm", "group_norm"):
        w = [("gamma:0", u(0.5, 1.5, (c,))), ("beta:0", u(-0.2, 0.2, (c,)))]
        w = [(n, v) for n, v in w if (n != "gamma:0" or l.get("scale", True)) and (n != "beta:0" or l.get("center", True))]
    elif t == "scale":
        w = [("gamma:0", u(0.2, 1.2, (c,)))]
    elif t == "dense":
        w = [("kernel:0", fan((c, l["units"]), c)), ("bias:0", u(-0.1, 0.1, (l["units"],)))]
    return [(n, np.asarray(v, dtype=np.float32)) for n, v in w]


class Torch:
    """The model in float64. `weights`: per layer name, Keras-layout (name, array) pairs; with
    `rng` instead, the weights are drawn on the first forward (init_weights)."""

    def __init__(self, case, weights=None, rng=None):
        self.case = case
        self.step = 0  # the training step: dropout's and drop_path's masks depend on it
        self.names = layer_names(case["layers"])
        self.rng = rng
        self.keras_weights = {} if weights is None else weights
        self.p, self.weights_shape = {}, {}
        self.frozen = set()  # layers whose weights stay (SPEC section 14): batch norm in eval mode
        if weights is not None:
            for n, l in zip(self.names, case["layers"]):
                for w, v in weights[n]:
                    self.hold(n, l, w, v)

    def hold(self, n, l, w, v):
        self.weights_shape[(n, w)] = v.shape
        self.p[(n, w)] = to_torch(l, w, v).requires_grad_(w not in ("moving_mean:0", "moving_variance:0"))

    def params(self):
        return [t for (n, w), t in self.p.items() if t.requires_grad]

    def get(self, n, w):
        return self.p.get((n, w))

    def forward(self, x, training=True):
        tensors = {"input": x}
        for i, (n, l) in enumerate(zip(self.names, self.case["layers"])):
            ins = [tensors[name] for name in inputs_of(self.case["layers"], self.names, i)]
            if self.rng is not None and n not in self.keras_weights:
                self.keras_weights[n] = new_weights(l, ins[0], self.rng)
                for w, v in self.keras_weights[n]:
                    self.hold(n, l, w, v)
            tensors[n] = self.HANDLERS[l["type"]](self, n, l, ins, training)
        return tensors[self.names[-1]]

    def keras(self, n, w):
        return to_keras(self.p[(n, w)].detach(), w, self.weights_shape[(n, w)])

    # --- one handler per layer type: (self, name, layer, inputs, training) -> output ---
    def conv2d(self, n, l, ins, training):
        x = ins[0]
        vector = x.dim() == 2
        if vector:
            x = x[:, :, None, None]
        k, s, d = pair(l.get("kernel", 1)), pair(l.get("stride", 1)), pair(l.get("dilation", 1))
        y = F.conv2d(F.pad(x, window_pads(l, x, k, s, d)), self.get(n, "kernel:0"), self.get(n, "bias:0"),
                     stride=s, dilation=d, groups=l.get("groups", 1))
        return y[:, :, 0, 0] if vector else y

    def depthwise(self, n, l, ins, training):
        x = ins[0]
        k, s, d = pair(l["kernel"]), pair(l.get("stride", 1)), pair(l.get("dilation", 1))
        separable = l["type"] == "separable_conv2d"
        y = F.conv2d(F.pad(x, window_pads(l, x, k, s, d)), self.get(n, "depthwise_kernel:0"),
                     None if separable else self.get(n, "bias:0"), stride=s, dilation=d, groups=x.shape[1])
        return F.conv2d(y, self.get(n, "pointwise_kernel:0"), self.get(n, "bias:0")) if separable else y

    def conv2d_transpose(self, n, l, ins, training):
        x = ins[0]
        k, s = pair(l["kernel"]), pair(l.get("stride", 1))
        y = F.conv_transpose2d(x, self.get(n, "kernel:0"), self.get(n, "bias:0"), stride=s)
        if l.get("padding", "valid") == "same":  # the k - s extra rows: the smaller half at the top
            ch, cw = k[0] - s[0], k[1] - s[1]
            y = y[:, :, ch // 2:ch // 2 + x.shape[2] * s[0], cw // 2:cw // 2 + x.shape[3] * s[1]]
        return y

    def resample(self, n, l, ins, training):
        x = ins[0]
        if x.dim() == 2:  # a channel vector broadcast to a map
            x = x[:, :, None, None]
        mode = l.get("interpolation", "nearest")
        extra = {"align_corners": False} if mode == "bilinear" else {}
        if l["type"] == "resize":
            return F.interpolate(x, size=tuple(l["size"]), mode=mode, **extra)
        return F.interpolate(x, scale_factor=pair(l.get("size", 2)), mode=mode, **extra)

    def shift(self, n, l, ins, training):
        x = ins[0]
        pad = l["type"] == "zero_padding2d"
        (top, bottom), (left, right) = margins(l.get("padding" if pad else "cropping", 1 if pad else 0))
        if pad:
            return F.pad(x, (left, right, top, bottom))
        return x[:, :, top:x.shape[2] - bottom, left:x.shape[3] - right]

    def batch_norm(self, n, l, ins, training):
        return F.batch_norm(ins[0], self.get(n, "moving_mean:0").data, self.get(n, "moving_variance:0").data,
                            self.get(n, "gamma:0"), self.get(n, "beta:0"), training=training and n not in self.frozen,
                            momentum=1 - l.get("momentum", 0.99), eps=l.get("epsilon", 1e-3))

    def layer_norm(self, n, l, ins, training):
        x = ins[0]
        c = x.shape[1]
        eps = l.get("epsilon", 1e-6)
        if x.dim() == 2:
            return F.layer_norm(x, (c,), self.get(n, "gamma:0"), self.get(n, "beta:0"), eps)
        y = F.layer_norm(x.permute(0, 2, 3, 1), (c,), self.get(n, "gamma:0"), self.get(n, "beta:0"), eps)
        return y.permute(0, 3, 1, 2)

    def image_norm(self, n, l, ins, training):
        x = ins[0]
        groups = x.shape[1] if l["type"] == "instance_norm" else l["groups"]
        return F.group_norm(x, groups, self.get(n, "gamma:0"), self.get(n, "beta:0"), l.get("epsilon", 1e-5))

    def activation(self, n, l, ins, training):
        x, t = ins[0], l["type"]
        if t == "relu":
            return F.relu(x)
        if t == "leaky_relu":
            return F.leaky_relu(x, negative_slope=l.get("alpha", 0.3))
        if t == "sigmoid":
            return torch.sigmoid(x)
        if t == "tanh":
            return torch.tanh(x)
        if t == "relu6":
            return F.relu6(x)
        if t == "clip":
            return torch.clamp(x, l.get("min", 0.0), l.get("max", 6.0))
        if t == "silu":
            return F.silu(x)
        if t == "hard_sigmoid":
            return torch.clamp(l.get("alpha", 0.2) * x + l.get("beta", 0.5), 0, 1)
        if t == "hard_swish":
            return F.hardswish(x)
        return F.gelu(x, approximate=l.get("approximate", "none"))

    def pool(self, n, l, ins, training):
        x = ins[0]
        k = pair(l.get("pool", 2))
        s = pair(l.get("stride", l.get("pool", 2)))
        left, right, top, bottom = window_pads(l, x, k, s, (1, 1))
        ceil = l.get("ceil_mode", False)
        if l["type"] == "max_pool2d":
            return F.max_pool2d(F.pad(x, (left, right, top, bottom), value=-math.inf), k, s, ceil_mode=ceil)
        if l.get("count_include_pad", False):
            if top == bottom and left == right:
                return F.avg_pool2d(x, k, s, padding=(top, left), ceil_mode=ceil, count_include_pad=True)
            raise ValueError("count_include_pad with asymmetric padding has no torch form")
        ones = torch.ones_like(x[:1, :1])
        total = F.avg_pool2d(F.pad(x, (left, right, top, bottom)), k, s, ceil_mode=ceil)
        count = F.avg_pool2d(F.pad(ones, (left, right, top, bottom)), k, s, ceil_mode=ceil)
        return total / count

    def global_pool(self, n, l, ins, training):
        x = ins[0]
        return x.mean(dim=(2, 3)) if l["type"] == "global_avg_pool" else x.amax(dim=(2, 3))  # ties share

    def dropout(self, n, l, ins, training):
        x, rate = ins[0], l["rate"]
        if not training:
            return x
        if l["type"] == "drop_path":
            keep = drop_path_keep(x.shape[0], self.names.index(n), self.step, rate)
            shape = (x.shape[0],) + (1,) * (x.dim() - 1)
            return x * torch.tensor(keep, dtype=x.dtype).reshape(shape) * kept_scale(rate)
        keep = torch.tensor(dropout_mask(tuple(x.shape), self.names.index(n), self.step, rate))
        return x * keep.to(x.dtype) * kept_scale(rate)

    def dense(self, n, l, ins, training):
        return ins[0] @ self.get(n, "kernel:0") + self.get(n, "bias:0")

    def flatten(self, n, l, ins, training):
        x = ins[0]
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # Keras's (h, w, c) order

    def add(self, n, l, ins, training):
        return sum(ins[1:], ins[0])

    def concatenate(self, n, l, ins, training):
        return torch.cat(ins, dim=1)

    def multiply(self, n, l, ins, training):
        a, b = ins
        if a.dim() != b.dim():  # a channel vector stands for its value at every pixel
            a, b = (a, b[:, :, None, None]) if a.dim() == 4 else (a[:, :, None, None], b)
        return a * b

    def scale(self, n, l, ins, training):
        x, g = ins[0], self.get(n, "gamma:0")
        return x * (g[None, :, None, None] if x.dim() == 4 else g[None, :])

    def channel_shuffle(self, n, l, ins, training):
        x, g = ins[0], l["groups"]
        b, c = x.shape[:2]
        return x.reshape(b, g, c // g, *x.shape[2:]).transpose(1, 2).reshape(x.shape)

    def channel_slice(self, n, l, ins, training):
        start = l.get("start", 0)
        return ins[0][:, start:start + l["channels"]]

    HANDLERS = dict(conv2d=conv2d, depthwise_conv2d=depthwise, separable_conv2d=depthwise,
                    conv2d_transpose=conv2d_transpose, upsampling2d=resample, resize=resample,
                    zero_padding2d=shift, cropping2d=shift, batch_norm=batch_norm, layer_norm=layer_norm,
                    instance_norm=image_norm, group_norm=image_norm, relu=activation, leaky_relu=activation,
                    sigmoid=activation, tanh=activation, relu6=activation, clip=activation, silu=activation,
                    hard_sigmoid=activation, hard_swish=activation, gelu=activation, max_pool2d=pool,
                    avg_pool2d=pool, global_avg_pool=global_pool, global_max_pool=global_pool, dropout=dropout,
                    drop_path=dropout, dense=dense, flatten=flatten, add=add, concatenate=concatenate,
                    multiply=multiply, scale=scale, channel_shuffle=channel_shuffle, channel_slice=channel_slice)


def init_weights(case, rng):
    """Keras-layout float32 weights per layer name (what the .h5 file holds), drawn layer by
    layer on a forward of zeros that gives each layer its input's channels."""
    h, w, c = case["input"]
    model = Torch(case, rng=rng)
    with torch.no_grad():
        model.forward(torch.zeros((2, c, h, w), dtype=torch.float64))
    return model.keras_weights


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
