"""Batched per-sample augmentation on ``(N, C, H, W)`` tensors: ``from gpufeed import augment as A``."""

from . import functional
from .auto import AugMix, AutoAugment, RandAugment, TrivialAugmentWide
from .color import ColorJitter
from .mix import CutMix, MixChoice, MixUp
from .random_ops import (
    GaussianBlur,
    Grayscale,
    RandomAdjustSharpness,
    RandomAffine,
    RandomApply,
    RandomAutocontrast,
    RandomChoice,
    RandomEqualize,
    RandomGrayscale,
    RandomInvert,
    RandomOrder,
    RandomPerspective,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
)
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
    "AugMix",
    "AutoAugment",
    "BatchTransform",
    "ColorJitter",
    "Compose",
    "ConvertDtype",
    "CutMix",
    "Cutout",
    "GaussianBlur",
    "Grayscale",
    "MixChoice",
    "MixUp",
    "Normalize",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomCrop",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomOrder",
    "RandomPerspective",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomSolarize",
    "RandomVerticalFlip",
    "TrivialAugmentWide",
    "functional",
]
