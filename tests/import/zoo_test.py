#!/usr/bin/python3
"""The convolutional models of torchvision 0.14, exported as a user would (opset 13, and
some at 11 and 17; training mode, constant folding; torch.onnx.export in torch 1.13 cannot write stochastic
depth in training mode, so its rate is 0), imported, and predicted on a 2x2 grid equal to
torch's eval forward in float64. Models whose width or depth is a parameter of their class
run narrow and shallow, VGG and AlexNet at reduced width (their dense layers are 100M+
weights at full width), so that the test stays within minutes; every op and attribute of
the full models is in them. Three (MobileNetV3 with squeeze-excitation, ConvNeXt, and a
LRASPP segmentation model) also train 3 steps sharded, equal to torch in float64.

Every parameter and statistic is first made distinct (onnx_cases.randomize), so that
each imported weight is checked.

usage: zoo_test.py HALOTRAIN WORKDIR [MODEL...]
"""
import os
import shutil
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models import convnext, densenet, efficientnet, mobilenetv3, resnet, shufflenetv2
from torchvision.models.segmentation import deeplabv3, fcn, lraspp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_cases  # noqa: E402
from onnx_cases import FAILED, case, predict_case, randomize  # noqa: E402

warnings.filterwarnings("ignore")


def vgg11_bn_narrow():
    cfg = [8, "M", 8, "M", 16, 16, "M", 16, 16, "M", 16, 16, "M"]
    features = torchvision.models.vgg.make_layers(cfg, batch_norm=True)
    m = torchvision.models.VGG(features, num_classes=2, dropout=0.5)
    m.classifier = nn.Sequential(nn.Linear(16 * 7 * 7, 32), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(32, 32),
                                 nn.ReLU(True), nn.Dropout(0.5), nn.Linear(32, 2))
    return m


class AlexNetNarrow(nn.Module):
    """torchvision's AlexNet with 1/8 of its channels and units."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(8, 24, kernel_size=5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(24, 48, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(48, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, kernel_size=3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(32 * 36, 64), nn.ReLU(inplace=True),
                                        nn.Dropout(0.5), nn.Linear(64, 64), nn.ReLU(inplace=True), nn.Linear(64, 2))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class NnUNetNorms(nn.Module):
    """A 2D nnU-Net-style network with every normalisation torch exports: InstanceNorm2d with
    and without affine weights, GroupNorm of one group, of two and of one channel per group."""

    def __init__(self):
        super().__init__()
        act = lambda: nn.LeakyReLU(0.01)  # noqa: E731
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True), act(),
                                 nn.Conv2d(8, 8, 3, padding=1), nn.InstanceNorm2d(8), act())
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.GroupNorm(2, 16), act(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.GroupNorm(1, 16), act())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.GroupNorm(8, 8), act(), nn.Conv2d(8, 2, 1))

    def forward(self, x):
        e = self.enc(x)
        return self.dec(torch.cat([self.up(self.down(e)), e], dim=1))


def efficientnet_b0_narrow():
    setting, last = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.3)
    return efficientnet.EfficientNet(setting, 0.2, stochastic_depth_prob=0.0, last_channel=last, num_classes=2)


def convnext_narrow():
    blocks = [convnext.CNBlockConfig(8, 16, 1), convnext.CNBlockConfig(16, 24, 2), convnext.CNBlockConfig(24, None, 1)]
    return convnext.ConvNeXt(blocks, stochastic_depth_prob=0.0, num_classes=2)


def mobilenet_v3_backbone():
    return mobilenetv3.mobilenet_v3_large(width_mult=0.25, dilated=True)


def fcn_narrow():
    backbone = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], width_per_group=4,
                             replace_stride_with_dilation=[False, True, True])
    return fcn._fcn_resnet(backbone, 2, aux=False)


# name -> (builder, input size)
MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=2), 64),
    "resnet50": (lambda: resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], width_per_group=8, num_classes=2), 64),
    "wide_resnet50_2": (lambda: resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], width_per_group=16, num_classes=2), 64),
    "resnext50_32x4d": (lambda: resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=2,
                                               num_classes=2), 64),
    "regnet_x_400mf": (lambda: torchvision.models.regnet_x_400mf(num_classes=2), 64),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=2, width_mult=0.25), 64),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=2, width_mult=0.25), 64),
    "efficientnet_b0": (efficientnet_b0_narrow, 64),
    "convnext_tiny": (convnext_narrow, 64),
    "densenet121": (lambda: densenet.DenseNet(8, (2, 2, 2), 16, num_classes=2), 64),
    "squeezenet1_1": (lambda: torchvision.models.squeezenet1_1(num_classes=2), 64),
    "googlenet": (lambda: torchvision.models.googlenet(num_classes=2, aux_logits=False, init_weights=True), 64),
    "mnasnet0_5": (lambda: torchvision.models.mnasnet0_5(num_classes=2), 64),
    "vgg11_bn": (vgg11_bn_narrow, 224),
    "alexnet": (AlexNetNarrow, 224),
    "shufflenet_v2": (lambda: shufflenetv2.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=2), 64),
    "lraspp_mobilenet_v3": (lambda: lraspp._lraspp_mobilenetv3(mobilenet_v3_backbone(), 2), 64),
    "deeplabv3_mobilenet_v3": (lambda: deeplabv3._deeplabv3_mobilenetv3(mobilenet_v3_backbone(), 2, aux=False), 64),
    "fcn_resnet50": (fcn_narrow, 64),
    "nnunet_norms": (NnUNetNorms, 48),  # SPEC section 11's instance and group norm, as torch exports them
}

# Exported again at other opsets: Clip's bounds as inputs and Split's sizes as an attribute
# at 11, HardSwish an op from 14 on, LayerNormalization an op at 17.
OPSETS = [("mobilenet_v2", 11), ("shufflenet_v2", 11), ("deeplabv3_mobilenet_v3", 11), ("mobilenet_v3_small", 17),
          ("convnext_tiny", 17), ("efficientnet_b0", 17)]

# Trained 3 steps sharded 2x2 against torch: squeeze-excitation, ConvNeXt, a segmentation model.
TRAINED = {
    "mobilenet_v3_small": ("labels", F.cross_entropy),
    "convnext_tiny": ("labels", F.cross_entropy),
    "lraspp_mobilenet_v3": ("masks", lambda out, t: F.cross_entropy(out["out"], t[:, 0].long())),
    "nnunet_norms": ("masks", lambda out, t: F.cross_entropy(out, t[:, 0].long())),
}


def calibrate(m, size):
    """Batch-norm statistics taken from a batch of images and the last linear or conv layer
    scaled and centred so that the logits spread by about 2 across images: in eval mode the output then
    depends on the image (random weights with arbitrary statistics wash it out), the
    probabilities neither sit at 1/2 nor saturate, and a wrong layer shows in them."""
    x = torch.rand(8, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    norms = [mod for mod in m.modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        m.double().train()
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average: after one batch, that batch's statistics
        m(x)
        for bn in norms:
            bn.momentum = 0.1
        last = [mod for mod in m.modules() if isinstance(mod, (nn.Linear, nn.Conv2d))][-1]
        y = m.eval()(x)
        y = y["out"] if isinstance(y, dict) else y
        spread = y - y.mean(dim=0, keepdim=True)  # across images, per class (and pixel)
        factor = min(max(2.0 / max(float(spread.std()), 1e-12), 1.0), 1e4)
        last.weight.mul_(factor)
        if last.bias is not None:  # centred: the scaled logits of each class average 0
            mean = y.mean(dim=tuple(d for d in range(y.dim()) if d != 1))
            last.bias.copy_(factor * (last.bias - mean))
        for t in list(m.parameters()) + list(m.buffers()):
            if t.dtype.is_floating_point:
                t.copy_(t.float())
    return m.float()


def no_dropout(m):
    for mod in m.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
    return m


def main():
    onnx_cases.BIN, onnx_cases.WORK = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(MODELS)
    shutil.rmtree(onnx_cases.WORK, ignore_errors=True)
    os.makedirs(onnx_cases.WORK)
    # Seeds are the model's place in MODELS (TRAINED for training), not in this run, so that
    # a model's case is the same alone or among the rest. Training is chaotic at some
    # seeds: nnunet_norms at 119 / 319 lands on the other side of a kink in float32 on
    # grids 1x1, 1x2 and 2x2 alike (5.7 times the tolerance; 0.01-0.04 on 2x1, 3x3 and at
    # eight other seeds), a flip and not a sharding error.
    for name in names:
        build, size = MODELS[name]
        i = list(MODELS).index(name)
        torch.manual_seed(100 + i)
        predict_case(name, calibrate(randomize(build(), 200 + i), size), (2, 3, size, size))
        if name in TRAINED:
            i = list(TRAINED).index(name)
            torch.manual_seed(100 + i)
            targets, loss = TRAINED[name]
            case(f"{name}-train", no_dropout(randomize(build(), 300 + i)), (2, 3, size, size), targets, loss)
    for name, opset in OPSETS:
        if name in names:
            build, size = MODELS[name]
            torch.manual_seed(opset)
            predict_case(f"{name}-opset{opset}", calibrate(randomize(build(), opset), size), (2, 3, size, size),
                         opset=opset)
    print(f"{len(FAILED)} failed" if FAILED else "all passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
