"""A Keras 2 model (its model.to_json() text, Sequential or functional) as a PyTorch float64 model, read here
independently of halotrain's importer: the oracle of the Keras import tests.

Keras is channels-last; the tensors here are NCHW ([N, C, H, W], and [N, C] after a global
pool), with TensorFlow's padding rules and Keras's weight layouts. The final softmax or
sigmoid is left out (the loss applies it); `probabilities` applies it.

Where float32 may land on the other side of a kink from float64 (a ReLU's input within
TAU of its kink, a max-pool window whose two largest are within TAU), the model records
the place (`near_kinks`), and a model built with `flips` takes the other side's
derivative there: what a test allows for such a flip it measures, not guesses.
"""
import json
import math

import h5py
import numpy as np
import torch
import torch.nn.functional as F


TAU = 1e-5  # near a kink: within TAU times the tensor's largest magnitude
# Kinks are recorded in maps of at most SMALL_MAP pixels: a flip moves a step by about one
# pixel's share of its map, below a test's allowance in larger maps.
SMALL_MAP = 256


def layers_of(model):
    c = model["config"]
    return c if isinstance(c, list) else c["layers"]


def output_name(model):
    c = model["config"]
    return c["output_layers"][0][0] if isinstance(c, dict) and "output_layers" in c \
        else layers_of(model)[-1]["config"]["name"]


def inbound(layer):
    nodes = layer.get("inbound_nodes", [])
    return [i[0] for i in nodes[0]] if nodes else []


def pair(v, default=1):
    if v is None:
        return (default, default)
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v)


def same_pads(n, k, s, d=1):
    """TensorFlow's 'same': total padding max((ceil(n/s)-1)*s + span - n, 0), the extra at the end."""
    span = d * (k - 1) + 1
    out = -(-n // s)
    total = max((out - 1) * s + span - n, 0)
    return total // 2, total - total // 2


def window_pad(x, c, k, s, d=(1, 1)):
    """F.pad's (left, right, top, bottom) for a Keras padding."""
    if c.get("padding", "valid") != "same":
        return (0, 0, 0, 0)
    (t, b), (l, r) = same_pads(x.shape[2], k[0], s[0], d[0]), same_pads(x.shape[3], k[1], s[1], d[1])
    return (l, r, t, b)


def activate(name, x):
    if name in (None, "linear"):
        return x
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "tanh":
        return torch.tanh(x)
    if name in ("swish", "silu"):
        return x * torch.sigmoid(x)
    if name == "hard_sigmoid":
        return torch.clamp(0.2 * x + 0.5, 0, 1)
    if name == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    raise ValueError(f"activation {name}")


def wanted(weight, c):
    """Whether a norm layer of config c has this weight (no gamma without scale, no beta
    without center)."""
    return (weight != "gamma:0" or c.get("scale", True)) and (weight != "beta:0" or c.get("center", True))


def keras_shapes(cls, c, cin):
    """Per weight of a layer of `cin` input channels: (name, Keras shape, kind) in the order
    Keras stores them; kind chooses the initial values."""
    k = pair(c.get("kernel_size", 1))
    bias = c.get("use_bias", True)
    w = []
    if cls in ("Conv2D", "Convolution2D"):
        g = c.get("groups", 1)
        w = [("kernel:0", (k[0], k[1], cin // g, c["filters"]), "fan")]
        out = c["filters"]
    elif cls == "Conv2DTranspose":
        w = [("kernel:0", (k[0], k[1], c["filters"], cin), "fan")]
        out = c["filters"]
    elif cls in ("DepthwiseConv2D", "SeparableConv2D"):
        m = c.get("depth_multiplier", 1)
        w = [("depthwise_kernel:0", (k[0], k[1], cin, m), "fan")]
        out = cin * m
        if cls == "SeparableConv2D":
            w.append(("pointwise_kernel:0", (1, 1, out, c["filters"]), "fan"))
            out = c["filters"]
    elif cls == "Dense":
        w = [("kernel:0", (cin, c["units"]), "fan")]
        out = c["units"]
    elif cls == "BatchNormalization":
        w = [("gamma:0", (cin,), "one"), ("beta:0", (cin,), "small"), ("moving_mean:0", (cin,), "small"),
             ("moving_variance:0", (cin,), "var")]
        return [x for x in w if wanted(x[0], c)]
    elif "Normalization" in cls:
        w = [("gamma:0", (cin,), "one"), ("beta:0", (cin,), "small")]
        return [x for x in w if wanted(x[0], c)]
    else:
        return []
    if bias:
        w.append(("bias:0", (out,), "small"))
    return w


def initial(shape, kind, rng):
    if kind == "fan":
        fan = int(np.prod(shape[:-1]))
        return rng.uniform(-1, 1, shape) * math.sqrt(3.0 / max(fan, 1))
    if kind == "one":
        return rng.uniform(0.6, 1.4, shape)
    if kind == "var":
        return rng.uniform(0.5, 1.5, shape)
    return rng.uniform(-0.2, 0.2, shape)


class KerasTorch:
    """The model in float64 (or `dtype`). weights: per Keras layer name, [(weight name,
    Keras-layout array)]; with rng instead, they are drawn on the first forward (draw_weights)."""

    def __init__(self, model, weights=None, rng=None, dtype=torch.float64, flips=()):
        self.model, self.rng, self.dtype = model, rng, dtype
        self.flips = set(flips)  # (layer name, flat index) that take the other side's derivative
        self.near_kinks = []  # (layer name, flat index) of the last forward
        self.layers = layers_of(model)
        self.keras = {} if weights is None else weights
        self.p = {}
        for l in self.layers:
            for w, v in self.keras.get(l["config"]["name"], []):
                self.hold(l, w, v)
        self.final = output_name(model)
        by_name = {l["config"]["name"]: l for l in self.layers}
        while by_name[self.final]["class_name"] in ("Reshape", "Flatten") and inbound(by_name[self.final]):
            self.final = inbound(by_name[self.final])[0]  # MobileNet's softmax sits before a Reshape

    def hold(self, l, w, v):
        t = torch.tensor(np.asarray(v, dtype=np.float64)).to(self.dtype)
        cls = l["class_name"]
        if w in ("kernel:0", "pointwise_kernel:0") and t.dim() == 4:
            t = t.permute(3, 2, 0, 1).contiguous()
        elif w == "depthwise_kernel:0":  # (kh, kw, cin, m) -> [cin * m][1][kh][kw]
            t = t.reshape(t.shape[0], t.shape[1], -1).permute(2, 0, 1).unsqueeze(1).contiguous()
        self.p[(l["config"]["name"], w)] = t.requires_grad_("moving" not in w)
        self.p[(l["config"]["name"], w)].keras_shape = tuple(np.asarray(v).shape)
        _ = cls

    def params(self):
        return [t for (n, w), t in self.p.items() if t.requires_grad]

    def get(self, n, w):
        return self.p.get((n, w))

    def keras_value(self, n, w):
        """A weight back in Keras layout."""
        t = self.p[(n, w)].detach()
        shape = self.p[(n, w)].keras_shape
        if w == "depthwise_kernel:0":
            t = t.squeeze(1).permute(1, 2, 0).reshape(shape)
        elif t.dim() == 4:
            t = t.permute(2, 3, 1, 0)
        return t.double().numpy()

    def piecewise(self, n, x, threshold=0.0, slope_below=0.0, max_value=None):
        """Keras's ReLU (threshold, negative slope, max value) as its value plus its slope
        times the change of x: the slope is the other side's where (n, index) is flipped."""
        value = torch.where(x >= threshold, x, slope_below * (x - threshold))
        top = math.inf if max_value is None else max_value
        value = torch.clamp(value, max=top)
        xd = x.detach()
        slope = torch.where(xd < threshold, torch.full_like(xd, slope_below),
                            torch.where(xd < top, torch.ones_like(xd), torch.zeros_like(xd))).contiguous()
        small = xd.dim() == 2 or xd.shape[2] * xd.shape[3] <= SMALL_MAP
        near_low = ((xd - threshold).abs() <= TAU * xd.abs().max()) & (xd != threshold) & small
        near_top = ((xd - top).abs() <= TAU * xd.abs().max()) & (xd != top) & small
        for i in torch.nonzero((near_low | near_top).flatten()).flatten().tolist():
            self.near_kinks.append((n, i))
            if (n, i) in self.flips:
                v = xd.flatten()[i]
                other = (1.0 if v < threshold else slope_below) if near_low.flatten()[i] else (0.0 if v < top else 1.0)
                slope.view(-1)[i] = other
        return value.detach() + slope * (x - xd)

    def max_pool(self, n, x, pool, strides, pads):
        """Max pooling by gathering each window's largest; where the two largest are within
        TAU and (n, window) is flipped, the second."""
        xp = F.pad(x, pads, value=-math.inf)
        oh, ow = (xp.shape[2] - pool[0]) // strides[0] + 1, (xp.shape[3] - pool[1]) // strides[1] + 1
        cols = F.unfold(xp, pool, stride=strides).view(x.shape[0], x.shape[1], pool[0] * pool[1], oh * ow)
        top2 = cols.detach().topk(2, dim=2) if pool[0] * pool[1] > 1 else None
        index = cols.detach().argmax(dim=2, keepdim=True).contiguous()
        if top2 is not None and oh * ow <= SMALL_MAP:
            gap = top2.values[:, :, 0] - top2.values[:, :, 1]
            near = (gap <= TAU * x.detach().abs().max()) & (gap > 0)  # exact ties: both take the first
            for i in torch.nonzero(near.flatten()).flatten().tolist():
                self.near_kinks.append((n, i))
                if (n, i) in self.flips:
                    index.view(-1)[i] = top2.indices[:, :, 1].flatten()[i]
        return cols.gather(2, index).view(x.shape[0], x.shape[1], oh, ow)

    def activate(self, n, name, x):
        if name == "relu":
            return self.piecewise(n, x)
        if name == "relu6":
            return self.piecewise(n, x, max_value=6.0)
        return activate(name, x)

    def forward(self, x, training=True):
        self.near_kinks = []
        out = {}
        sequential, prev = self.model.get("class_name") == "Sequential", None
        for l in self.layers:
            c, n, cls = l["config"], l["config"]["name"], l["class_name"]
            if cls == "InputLayer":
                out[n], prev = x, n
                continue
            ins = ([out[prev]] if prev else [x]) if sequential else [out[i] for i in inbound(l)]
            prev = n
            if self.rng is not None and n not in self.keras:
                self.keras[n] = [(w, np.asarray(initial(s, kind, self.rng), dtype=np.float32))
                                 for w, s, kind in keras_shapes(cls, c, ins[0].shape[1])]
                for w, v in self.keras[n]:
                    self.hold(l, w, v)
            y = self.layer(l, ins, training)
            act = c.get("activation") if cls != "Activation" else c["activation"]
            if n == self.final and act in ("softmax", "sigmoid"):
                act = None  # the loss applies it
            if act not in (None, "linear", "softmax"):
                y = self.activate(n, act, y)
            out[n] = y
        return out[output_name(self.model)]

    def layer(self, l, ins, training):
        c, n, cls = l["config"], l["config"]["name"], l["class_name"]
        x = ins[0]
        k, s, d = pair(c.get("kernel_size", 1)), pair(c.get("strides", 1)), pair(c.get("dilation_rate", 1))
        if cls in ("Conv2D", "Convolution2D") and x.dim() == 2:  # a 1x1 conv on a channel vector
            return F.conv2d(x[:, :, None, None], self.get(n, "kernel:0"), self.get(n, "bias:0"))[:, :, 0, 0]
        if cls in ("Conv2D", "Convolution2D"):
            return F.conv2d(F.pad(x, window_pad(x, c, k, s, d)), self.get(n, "kernel:0"), self.get(n, "bias:0"),
                            stride=s, dilation=d, groups=c.get("groups", 1))
        if cls in ("DepthwiseConv2D", "SeparableConv2D"):
            sep = cls == "SeparableConv2D"
            y = F.conv2d(F.pad(x, window_pad(x, c, k, s, d)), self.get(n, "depthwise_kernel:0"),
                         None if sep else self.get(n, "bias:0"), stride=s, dilation=d, groups=x.shape[1])
            return F.conv2d(y, self.get(n, "pointwise_kernel:0"), self.get(n, "bias:0")) if sep else y
        if cls == "Conv2DTranspose":
            y = F.conv_transpose2d(x, self.get(n, "kernel:0"), self.get(n, "bias:0"), stride=s)
            if c.get("padding") == "same":
                ch, cw = k[0] - s[0], k[1] - s[1]
                y = y[:, :, ch // 2:ch // 2 + x.shape[2] * s[0], cw // 2:cw // 2 + x.shape[3] * s[1]]
            return y
        if cls == "BatchNormalization":
            return F.batch_norm(x, self.get(n, "moving_mean:0").data, self.get(n, "moving_variance:0").data,
                                self.get(n, "gamma:0"), self.get(n, "beta:0"), training=training,
                                momentum=1 - c.get("momentum", 0.99), eps=c.get("epsilon", 1e-3))
        if cls == "LayerNormalization":
            y = x.permute(0, 2, 3, 1) if x.dim() == 4 else x
            y = F.layer_norm(y, (x.shape[1],), self.get(n, "gamma:0"), self.get(n, "beta:0"), c.get("epsilon", 1e-3))
            return y.permute(0, 3, 1, 2) if x.dim() == 4 else y
        if "InstanceNormalization" in cls or "GroupNormalization" in cls:
            groups = x.shape[1] if "Instance" in cls or c.get("groups", 32) == -1 else c["groups"]
            return F.group_norm(x, groups, self.get(n, "gamma:0"), self.get(n, "beta:0"), c.get("epsilon", 1e-3))
        if cls == "ReLU":
            return self.piecewise(n, x, c.get("threshold", 0.0), c.get("negative_slope", 0.0), c.get("max_value"))
        if cls == "LeakyReLU":
            return self.piecewise(n, x, 0.0, c.get("alpha", 0.3))
        if cls in ("MaxPooling2D", "AveragePooling2D"):
            p = pair(c.get("pool_size", 2))
            st = pair(c.get("strides") or p)
            pads = window_pad(x, c, p, st)
            if cls == "MaxPooling2D":
                return self.max_pool(n, x, p, st, pads)
            ones = torch.ones_like(x[:1, :1])  # TensorFlow's average: the taps inside the image
            return F.avg_pool2d(F.pad(x, pads), p, st) / F.avg_pool2d(F.pad(ones, pads), p, st)
        if cls == "GlobalAveragePooling2D":
            return x.mean(dim=(2, 3))
        if cls == "GlobalMaxPooling2D":
            return x.amax(dim=(2, 3))
        if cls == "Flatten":
            return x if x.dim() == 2 else x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # Keras's (h, w, c)
        if cls == "Reshape":
            return x  # of a channel vector: (1, 1, C) and (C,) are the same vector here
        if cls == "Dense":
            if x.dim() == 4:
                return F.conv2d(x, self.get(n, "kernel:0").t()[:, :, None, None], self.get(n, "bias:0"))
            y = x @ self.get(n, "kernel:0")
            return y + self.get(n, "bias:0") if self.get(n, "bias:0") is not None else y
        if cls == "Dropout":
            if training and c.get("rate", 0) > 0:
                raise ValueError("the test trains with dropout rates 0")
            return x
        if cls == "Add":
            return sum(ins[1:], ins[0])
        if cls == "Multiply":
            a, b = ins
            if a.dim() != b.dim():
                a, b = (a, b[:, :, None, None]) if a.dim() == 4 else (a[:, :, None, None], b)
            return a * b
        if cls == "Concatenate":
            return torch.cat(ins, dim=1)
        if cls == "ZeroPadding2D" or cls == "Cropping2D":
            v = c.get("padding" if cls == "ZeroPadding2D" else "cropping", 1)
            (t, b), (lf, r) = ((v, v), (v, v)) if isinstance(v, int) else \
                tuple(tuple(a) if isinstance(a, list) else (a, a) for a in v)
            if cls == "ZeroPadding2D":
                return F.pad(x, (lf, r, t, b))
            return x[:, :, t:x.shape[2] - b, lf:x.shape[3] - r]
        if cls == "UpSampling2D":
            mode = c.get("interpolation", "nearest")
            return F.interpolate(x, scale_factor=pair(c.get("size", 2)), mode=mode,
                                 **({"align_corners": False} if mode == "bilinear" else {}))
        if cls in ("Activation", "Softmax"):
            return x
        raise ValueError(f"class {cls}")


def probabilities(logits):
    return torch.sigmoid(logits) if logits.shape[1] == 1 else torch.softmax(logits, dim=1)


def draw_weights(model, shape, rng):
    """Keras-layout float32 weights per layer name, drawn layer by layer on a forward of
    zeros of `shape` (N, C, H, W) that tells each layer its input's channels."""
    m = KerasTorch(model, rng=rng)
    with torch.no_grad():
        m.forward(torch.zeros(shape, dtype=torch.float64), training=False)
    return m.keras


def write_model_save(path, model, weights):
    """A Keras 2 model.save() file: the JSON as the model_config attribute, the weights
    under /model_weights (names with '/' become nested groups, as Keras made them)."""
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = np.bytes_(model.get("keras_version", "2.1.6"))
        f.attrs["backend"] = np.bytes_("tensorflow")
        f.attrs["model_config"] = np.bytes_(json.dumps(model))
        g = f.create_group("model_weights")
        names = [l["config"]["name"] for l in layers_of(model)]
        g.attrs["layer_names"] = np.array([n.encode() for n in names])
        g.attrs["backend"] = np.bytes_("tensorflow")
        g.attrs["keras_version"] = np.bytes_(model.get("keras_version", "2.1.6"))
        for n in names:
            lg = g.require_group(n)
            ws = weights.get(n, [])
            lg.attrs["weight_names"] = np.array([f"{n}/{w}".encode() for w, _ in ws])
            for w, v in ws:
                lg.create_dataset(f"{n}/{w}", data=v)
