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
import copy
import os
import shutil
import subprocess
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_cases  # noqa: E402
import torchvision_resnet18  # noqa: E402
import torchvision  # noqa: E402
from onnx_cases import FAILED, case, check, export, predict_case, randomize  # noqa: E402

BIN, WORK = sys.argv[1], sys.argv[2]
onnx_cases.BIN, onnx_cases.WORK = BIN, WORK
warnings.filterwarnings("ignore")


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


def refused(tag, module, shape, want, lists=True):
    path = os.path.join(WORK, "bad", f"{tag}.onnx")
    try:
        export(module, shape, path)
    except Exception as e:  # noqa: BLE001
        check(f"refused: {tag}: exported", False, str(e))
        return
    r = subprocess.run([BIN, "import", path, "-o", os.path.join(WORK, "bad", f"{tag}.yaml")], capture_output=True,
                       text=True, timeout=120)
    text = r.stdout + r.stderr
    check(f"refused: {tag} (exit 1, names the node, op and attribute{', lists what is supported' if lists else ''})",
          r.returncode == 1 and want in text and (not lists or ("halotrain imports" in text and "Conv" in text)),
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


def channels_refused():
    """--channels where the image is not read by one first convolution names what reads it."""
    path = os.path.join(WORK, "bad", "unet.onnx")
    export(UNet(), (1, 2, 28, 24), path)
    r = subprocess.run([BIN, "import", path, "--channels", "1", "-o", os.path.join(WORK, "bad", "unet.yaml")],
                       capture_output=True, text=True, timeout=300)
    check("--channels 1 on a model whose image feeds two layers: exit 1 naming them",
          r.returncode == 1 and "--channels 1" in r.stderr and "'input' is read by 2 layers" in r.stderr
          and not os.path.exists(os.path.join(WORK, "bad", "unet.yaml")), r.stderr[-1000:])


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "bad"))
    torch.manual_seed(1)
    case("resnet18", torchvision_resnet18.torchvision_model(), (1, 1, 71, 57), "labels", F.cross_entropy)
    torch.manual_seed(2)
    case("unet", UNet(), (1, 2, 28, 24), "masks", lambda out, t: F.binary_cross_entropy(out, t))

    # --channels (SPEC section 14): an ImageNet model's RGB stem takes gray images, or four channels.
    rgb = randomize(torchvision.models.resnet18(num_classes=2), 9)
    predict_case("resnet18-gray", copy.deepcopy(rgb), (2, 3, 64, 48), channels=1)
    predict_case("resnet18-four", rgb, (2, 3, 64, 48), channels=4)
    channels_refused()

    refused("elu", Wrap(nn.ELU()), (1, 1, 8, 8), "is not an op halotrain has")
    refused("instance norm with running statistics", Wrap(nn.InstanceNorm2d(4, affine=True, track_running_stats=True)),
            (2, 1, 8, 8), "InstanceNorm2d(track_running_stats=True)", lists=False)
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
