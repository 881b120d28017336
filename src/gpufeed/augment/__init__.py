"""Batched per-sample augmentation on ``(N, C, H, W)`` tensors: ``from gpufeed import augment as A``."""

from . import functional
from .auto import AutoAugment, RandAugment, TrivialAugmentWide
from .color import ColorJitter
from .resize import RandomResizedCrop
from .transforms import (
    BatchTransform,
    Compose,
    ConvertDtype,
    Cutout,
    Normalize,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
    RandomVerticalFlip,
)

__all__ = [
    "AutoAugment",
    "BatchTransform",
    "ColorJitter",
    "Compose",
    "ConvertDtype",
    "Cutout",
    "Normalize",
    "RandAugment",
    "RandomCrop",
    "RandomErasing",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "TrivialAugmentWide",
    "functional",
]
