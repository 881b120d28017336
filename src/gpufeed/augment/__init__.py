"""Batched per-sample augmentation on ``(N, C, H, W)`` tensors: ``from gpufeed import augment as A``."""

from . import functional
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
    "BatchTransform",
    "ColorJitter",
    "Compose",
    "ConvertDtype",
    "Cutout",
    "Normalize",
    "RandomCrop",
    "RandomErasing",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "functional",
]
