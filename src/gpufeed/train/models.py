"""The models ``gpufeed train`` and ``bench`` train.

On CIFAR-10 (32x32): VGG16 (the benchmark model), ResNet-18 and ResNet-9 in their CIFAR variants, and
a small CNN for CPUs. On image folders (``--image-size``, 224 by default): torchvision's own ResNet-18,
ResNet-50, EfficientNet-B0 and ViT-B/16, randomly initialised (nothing is downloaded), and the same
small CNN (its global pooling takes any size).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import ConfigError

__all__ = ["FOLDER_MODELS", "MODELS", "build_model"]


def _conv_bn(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def vgg16(num_classes: int = 10) -> nn.Module:
    """VGG16 with batch norm, CIFAR variant: 13 conv layers, five 2x2 pools down to 1x1, one linear layer."""
    layers: list[nn.Module] = []
    cin = 3
    plan: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    for v in plan:
        if isinstance(v, str):  # "M": a 2x2 max pool
            layers.append(nn.MaxPool2d(2))
        else:
            layers += _conv_bn(cin, v)
            cin = v
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, num_classes))


class _Basic(nn.Module):
    """ResNet basic block: two 3x3 convs and a (projected, when the shape changes) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(cin, cout, stride), nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
        )
        self.short = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        )
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.body(x) + self.short(x))


def resnet18(num_classes: int = 10) -> nn.Module:
    """ResNet-18 for 32x32 inputs: a 3x3 stem without pooling, four stages of two basic blocks."""
    blocks: list[nn.Module] = [*_conv_bn(3, 64)]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        blocks += [_Basic(cin, cout, stride), _Basic(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(channels, channels), *_conv_bn(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class _Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def resnet9(num_classes: int = 10) -> nn.Module:
    """The ResNet-9 of the fast CIFAR-10 training family (DAWNBench): 64-128-256-512 with two residuals."""
    return nn.Sequential(
        *_conv_bn(3, 64),
        *_conv_bn(64, 128),
        nn.MaxPool2d(2),
        _Residual(128),
        *_conv_bn(128, 256),
        nn.MaxPool2d(2),
        *_conv_bn(256, 512),
        nn.MaxPool2d(2),
        _Residual(512),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(512, num_classes, bias=False),
        _Scale(0.125),  # keeps the initial logits small, as that family does
    )


def small(num_classes: int = 10) -> nn.Module:
    """Three conv layers (32-64-128): trains in seconds on a CPU, for tests and CPU benchmarks."""
    return nn.Sequential(
        *_conv_bn(3, 32),
        nn.MaxPool2d(2),
        *_conv_bn(32, 64),
        nn.MaxPool2d(2),
        *_conv_bn(64, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


MODELS: dict[str, Callable[[int], nn.Module]] = {
    "vgg16": vgg16,
    "resnet18": resnet18,
    "resnet9": resnet9,
    "small": small,
}


FOLDER_MODELS = ("small", "resnet18", "resnet50", "efficientnet_b0", "vit_b_16")


def build_model(name: str, num_classes: int = 10, image_size: int | None = None) -> nn.Module:
    """A fresh model by name: a CIFAR model (``image_size=None``), else one of :data:`FOLDER_MODELS` for
    images of ``image_size`` (torchvision's architectures, random weights)."""
    if image_size is None:
        if name not in MODELS:
            raise ConfigError(f"model={name!r} is not one of {sorted(MODELS)} (the CIFAR-10 models)")
        return MODELS[name](num_classes)
    if name not in FOLDER_MODELS:
        raise ConfigError(f"model={name!r} is not one of {list(FOLDER_MODELS)} (the models for image folders)")
    if name == "small":
        return small(num_classes)
    import torchvision

    if name == "vit_b_16":
        if image_size % 16:
            raise ConfigError(
                f"vit_b_16 cuts images into 16x16 patches: image_size={image_size} must be a multiple of 16"
            )
        return torchvision.models.vit_b_16(weights=None, num_classes=num_classes, image_size=image_size)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
