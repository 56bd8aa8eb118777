#!/usr/bin/python3
"""`halotrain import` of ONNX files from torch.onnx.export (SPEC section 9), end to end.

- torchvision's resnet18 (one input channel, 2 classes) and a small U-Net written here
  (max pool, bilinear and nearest Resize, Concat, ConvTranspose with output_padding,
  a depthwise conv, Pad, LeakyRelu, Tanh, a final Sigmoid folded into the loss) are exported
  in training mode (batch norm kept), imported, and trained 3 steps sharded 2x2 from the
  imported weights; every weight and batch-norm statistic equals the same PyTorch model
  trained in float64 on the whole image (|a - r| <= 1e-5 + 1e-4 |r|). The halotrain layer
  of each torch tensor is found by its initial values, not by name.
- every unsupported op or attribute exits 1 naming the node, its op and the attribute.

usage: onnx_import_test.py HALOTRAIN WORKDIR
"""
import os
import shutil
import subprocess
import sys
import warnings

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import oracle  # noqa: E402  (data order, memory check, tolerances)
import torchvision_resnet18  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
FAILED = []
warnings.filterwarnings("ignore")


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    if not ok:
        FAILED.append(name)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1 = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.mid = nn.Conv2d(4, 4, 3, padding=1)
        self.dw = nn.Conv2d(4, 8, 3, padding=1, groups=4)
        self.up = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1)
        self.pad = nn.ZeroPad2d((1, 1, 2, 0))  # left, right, top, bottom
        self.out = nn.Conv2d(4 + 8 + 4 + 2, 1, 3)  # valid: back to the input size after the pad

    def forward(self, x):
        a = torch.tanh(self.bn(self.e1(x)))
        d = F.max_pool2d(a, 2)
        m = F.leaky_relu(self.mid(d), 0.1)
        b = F.interpolate(m, scale_factor=2, mode="bilinear", align_corners=False)
        n = F.interpolate(m, scale_factor=2, mode="nearest")
        t = self.up(m)
        y = torch.cat([self.dw(b), t, n, x], dim=1)
        return torch.sigmoid(self.out(self.pad(y)))


def keras_of(name, t):
    """A torch parameter or buffer in the Keras layout of its halotrain weight."""
    v = t.detach().double().numpy()
    if v.ndim == 4:
        return v.transpose(2, 3, 1, 0)
    if v.ndim == 2:
        return v.T
    return v


def export(module, shape, path):
    module.train()
    torch.onnx.export(module, torch.zeros(*shape), path, opset_version=13, do_constant_folding=True,
                      training=torch.onnx.TrainingMode.TRAINING)


def match_weights(init_path, module):
    """halotrain (layer, weight) -> the torch tensor with the same initial values."""
    named = list(module.named_parameters()) + [(n, b) for n, b in module.named_buffers() if b.dtype.is_floating_point]
    out = {}
    with h5py.File(init_path, "r") as f:
        for layer in f.attrs["layer_names"]:
            layer = layer.decode()
            for w in f[layer].attrs["weight_names"]:
                w = w.decode().split("/")[-1]
                v = np.asarray(f[layer][layer][w], dtype=np.float64)
                hits = [(n, t) for n, t in named if keras_of(n, t).shape == v.shape and np.array_equal(keras_of(n, t), v)]
                if w == "depthwise_kernel:0":  # [cin * m][1][k][k] -> (k, k, cin, m)
                    hits = [(n, t) for n, t in named if t.dim() == 4 and t.shape[1] == 1 and np.array_equal(
                        t.detach().double().numpy()[:, 0].transpose(1, 2, 0).reshape(v.shape), v)]
                out[(layer, w)] = hits[0][0] if len(hits) == 1 else None
    return out


def case(tag, module, shape, targets, loss_fn):
    work = os.path.join(WORK, tag)
    os.makedirs(work)
    path = os.path.join(work, f"{tag}.onnx")
    export(module, shape, path)
    r = subprocess.run([BIN, "import", path], capture_output=True, text=True, timeout=300)
    cfg, init = os.path.join(work, f"{tag}.yaml"), os.path.join(work, f"{tag}-init.h5")
    check(f"{tag}: import exits 0 and writes the config and the weights",
          r.returncode == 0 and os.path.exists(cfg) and os.path.exists(init), r.stdout + r.stderr[-3000:])
    if r.returncode != 0:
        return
    mapping = match_weights(init, module)
    missing = [k for k, v in mapping.items() if v is None]
    check(f"{tag}: every imported weight is a torch tensor's initial value ({len(mapping)} tensors)", not missing,
          f"unmatched {missing[:5]}")
    if missing:
        return
    # Data, and the reference: the module itself in float64 on the whole image.
    rng = np.random.default_rng(12)
    n, c, h, w = oracle.COUNT, shape[1], shape[2], shape[3]
    images = rng.uniform(0, 1, (n, h, w, c)).astype(np.float32)
    data = os.path.join(work, "data.h5")
    with h5py.File(data, "w") as f:
        f.create_dataset("images", data=images)
        if targets == "labels":
            y = rng.integers(0, 2, n).astype(np.int32)
        else:
            y = (rng.uniform(0, 1, (n, h, w, 1)) > 0.6).astype(np.uint8)
        f.create_dataset(targets, data=y)
    ref = module.double().train()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-4)
    x_all = torch.tensor(images, dtype=torch.float64).permute(0, 3, 1, 2)
    for step in range(oracle.STEPS):
        idx = oracle.samples_of_step(step, n)
        opt.zero_grad()
        t = torch.tensor(y[idx], dtype=torch.int64) if targets == "labels" else \
            torch.tensor(y[idx], dtype=torch.float64).permute(0, 3, 1, 2)
        loss_fn(ref(x_all[idx]), t).backward()
        opt.step()
    run_dir = os.path.join(work, "run")
    sets = [f"data.train={data}", f"data.targets={targets}", "data.synthesize=null", f"seed={oracle.SEED}",
            f"training.batch_size={oracle.BATCH}", f"training.steps={oracle.STEPS}", "training.optimizer.lr=0.001",
            "training.optimizer.epsilon=0.0001", "parallel.grid=[2,2]", "parallel.device_memory=4GiB",
            f"run_dir={run_dir}", "checkpoint.every_steps=0"]
    r = subprocess.run([BIN, "train", cfg] + [a for s in sets for a in ("--set", s)], capture_output=True, text=True,
                       timeout=600, cwd=work)
    ck = os.path.join(run_dir, "checkpoints", f"ckpt-{oracle.STEPS}.h5")
    check(f"{tag}: trains 3 steps sharded 2x2 from the imported weights", r.returncode == 0 and os.path.exists(ck),
          r.stderr[-3000:])
    if r.returncode != 0:
        return
    worst, bad = 0.0, []
    # Module.double() replaced the buffers: read every tensor by name now.
    tensors = dict(ref.named_parameters()) | dict(ref.named_buffers())
    with h5py.File(ck, "r") as f:
        for (layer, wname), tname in mapping.items():
            tensor = tensors[tname]
            got = np.asarray(f[layer][layer][wname], dtype=np.float64)
            if wname == "depthwise_kernel:0":
                want = tensor.detach().numpy()[:, 0].transpose(1, 2, 0).reshape(got.shape)
            else:
                want = keras_of(tname, tensor)
            ratio = np.abs(got - want) / (oracle.ATOL + oracle.RTOL * np.abs(want))
            worst = max(worst, float(ratio.max()))
            if (ratio > 1).any():
                bad.append(f"{layer}/{wname} ({tname})")
    mem, line = oracle.check_memory(run_dir)
    check(f"{tag}: every weight equals PyTorch float64 after 3 steps (worst {worst:.3g} of the tolerance); {line}",
          not bad and not mem, f"{bad[:5]} {mem}")


def refused(tag, module, shape, want):
    path = os.path.join(WORK, "bad", f"{tag}.onnx")
    try:
        export(module, shape, path)
    except Exception as e:  # noqa: BLE001
        check(f"refused: {tag}: exported", False, str(e))
        return
    r = subprocess.run([BIN, "import", path, "-o", os.path.join(WORK, "bad", f"{tag}.yaml")], capture_output=True,
                       text=True, timeout=120)
    text = r.stdout + r.stderr
    check(f"refused: {tag} (exit 1, names the node, op and attribute, lists what is supported)",
          r.returncode == 1 and want in text and "halotrain imports" in text and "Conv" in text,
          f"exit {r.returncode}: {text[-500:]}")


class Lambda(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def untrusted():
    """Model files are untrusted input: an initializer whose dims disagree with its data, and
    one that claims 2^40 values, exit 1 naming the initializer; nothing is allocated first."""
    import onnx
    path = os.path.join(WORK, "bad", "base.onnx")
    export(Wrap(nn.ReLU()), (1, 1, 8, 8), path)
    for tag, dims, want in (("dims disagree", [4, 1, 3, 2], "holds 36 values but its shape [4, 1, 3, 2] says 24"),
                            ("2^40 values", [1 << 40, 1, 3, 3], "holds more than")):
        m = onnx.load(path)
        w = next(i for i in m.graph.initializer if len(i.dims) == 4)
        del w.dims[:]
        w.dims.extend(dims)
        bad = os.path.join(WORK, "bad", f"{tag}.onnx")
        onnx.save(m, bad)
        r = subprocess.run([BIN, "import", bad, "-o", bad + ".yaml"], capture_output=True, text=True, timeout=60)
        text = r.stdout + r.stderr
        check(f"untrusted: {tag} (exit 1, names the initializer)",
              r.returncode == 1 and want in text and f"initializer '{w.name}'" in text, f"exit {r.returncode}: {text[-400:]}")


class Wrap(nn.Module):
    def __init__(self, f, conv=None):
        super().__init__()
        self.f, self.conv = f, conv or nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        return self.f(self.conv(x))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "bad"))
    torch.manual_seed(1)
    case("resnet18", torchvision_resnet18.torchvision_model(), (1, 1, 71, 57), "labels", F.cross_entropy)
    torch.manual_seed(2)
    case("unet", UNet(), (1, 2, 28, 24), "masks", lambda out, t: F.binary_cross_entropy(out, t))

    refused("elu", Wrap(nn.ELU()), (1, 1, 8, 8), "is not an op halotrain has")
    refused("reflect pad", Wrap(nn.ReflectionPad2d(1)), (1, 1, 8, 8), "mode reflect")
    refused("dilated pool", Wrap(nn.MaxPool2d(3, 1, padding=1, dilation=2)), (1, 1, 8, 8), "dilations [2, 2]")
    refused("align_corners", Wrap(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)), (1, 1, 8, 8),
            "coordinate_transformation_mode align_corners")
    refused("softmax inside", Wrap(nn.Sequential(nn.Softmax(dim=1), nn.Conv2d(4, 1, 1))), (1, 1, 8, 8),
            "before the output")
    refused("scalar product", Wrap(Lambda(lambda x: x * 3.0)), (1, 1, 8, 8), "by a constant of shape []")
    refused("transpose", Wrap(Lambda(lambda x: x.permute(0, 1, 3, 2))), (1, 1, 8, 8), "perm [0, 1, 3, 2]")
    refused("channel mean", Wrap(Lambda(lambda x: x.mean(dim=1, keepdim=True))), (1, 1, 8, 8), "reduces axes [1]")
    untrusted()
    print(f"{len(FAILED)} failed" if FAILED else "all passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
