"""The models the benchmarks train, in the YAML spelling of SPEC section 3, and the same
model as a torch.nn.Sequential (stride-1 'same' convolutions, Keras-style batch norm)."""

# configs/demo.yaml's layers.
DEMO = [
    dict(type="conv2d", filters=8, kernel=3, padding="same", bias=False),
    dict(type="batch_norm", momentum=0.9),
    dict(type="relu"),
    dict(type="max_pool2d", pool=4),
    dict(type="conv2d", filters=16, kernel=3, padding="same", bias=False),
    dict(type="batch_norm", momentum=0.9),
    dict(type="relu"),
    dict(type="max_pool2d", pool=2),
    dict(type="conv2d", filters=16, kernel=3, padding="same"),
    dict(type="relu"),
    dict(type="global_avg_pool"),
    dict(type="dense", units=2),
]


def _seed_block(filters):
    return [dict(type="conv2d", filters=filters, kernel=3, padding="same", bias=False),
            dict(type="batch_norm"), dict(type="relu"), dict(type="max_pool2d", pool=2)]


# configs/seed-k80.yaml's layers.
SEED = (_seed_block(12) + _seed_block(16) + _seed_block(32) + _seed_block(64) + _seed_block(128) +
        [dict(type="conv2d", filters=128, kernel=3, padding="same"), dict(type="relu"),
         dict(type="global_avg_pool"), dict(type="dense", units=2)])


# The speed benchmark's model: three 3x3 convs of 16-32 channels at full resolution.
CONV3 = [dict(type="conv2d", filters=16, kernel=3, padding="same"), dict(type="relu"),
         dict(type="conv2d", filters=32, kernel=3, padding="same"), dict(type="relu"),
         dict(type="conv2d", filters=32, kernel=3, padding="same"), dict(type="relu"),
         dict(type="global_avg_pool"), dict(type="dense", units=2)]

# ResNet's pattern without its pools: conv, batch norm, ReLU, conv (the batch norm + ReLU
# chains that bench/fusion.py times), 16-32 channels at full resolution.
def _bn_block(filters):
    return [dict(type="conv2d", filters=filters, kernel=3, padding="same", bias=False),
            dict(type="batch_norm"), dict(type="relu")]


CONV_BN = (_bn_block(16) + _bn_block(32) + _bn_block(32) +
           [dict(type="global_avg_pool"), dict(type="dense", units=2)])

MODELS = {"demo": DEMO, "seed": SEED, "conv3": CONV3, "conv_bn": CONV_BN}


def conv_shapes(layers, h, w, channels=1):
    """(cin, cout, kernel, height, width, first) of every conv, at the size it runs at, and
    the (cin, units) of every dense layer."""
    convs, dense, c = [], [], channels
    for l in layers:
        t = l["type"]
        if t == "conv2d":
            convs.append((c, l["filters"], l["kernel"], h, w, not convs))
            c = l["filters"]
        elif t == "max_pool2d":
            h, w = h // l["pool"], w // l["pool"]
        elif t == "global_avg_pool":
            h = w = 1
        elif t == "dense":
            dense.append((c, l["units"]))
            c = l["units"]
    return convs, dense


def train_flops(layers, h, w, channels=1):
    """Counted flops of one training step per image: 2 x multiply-adds of every conv and
    dense layer in forward, backward data (not of the image) and backward weights. The
    pointwise layers (BN, ReLU, pools) are not counted, as is usual."""
    convs, dense = conv_shapes(layers, h, w, channels)
    total = sum(2 * k * k * cin * cout * ch * cw * (2 if first else 3) for cin, cout, k, ch, cw, first in convs)
    return total + sum(2 * cin * units * 3 for cin, units in dense)


def torch_sequential(layers, channels=1):
    import torch.nn as nn
    mods, c = [], channels
    for l in layers:
        t = l["type"]
        if t == "conv2d":
            assert l["kernel"] % 2 == 1 and l["padding"] == "same"  # stride 1: symmetric
            mods.append(nn.Conv2d(c, l["filters"], l["kernel"], padding=l["kernel"] // 2, bias=l.get("bias", True)))
            c = l["filters"]
        elif t == "batch_norm":
            mods.append(nn.BatchNorm2d(c, eps=1e-3, momentum=1 - l.get("momentum", 0.99)))
        elif t == "relu":
            mods.append(nn.ReLU())
        elif t == "max_pool2d":
            mods.append(nn.MaxPool2d(l["pool"]))
        elif t == "global_avg_pool":
            mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        elif t == "dense":
            mods.append(nn.Linear(c, l["units"]))
            c = l["units"]
        else:
            raise ValueError(f"bench/models.py: no torch equivalent for layer type {t}")
    return nn.Sequential(*mods)
