"""Batched per-sample augmentation on ``(N, C, H, W)`` tensors: ``from gpufeed import augment as A``."""

from . import functional
from .auto import AugMix, AutoAugment, RandAugment, TrivialAugmentWide
from .color import ColorJitter
from .containers import RandomApply, RandomChoice, RandomOrder
from .crop_flip import RandomCrop, RandomHorizontalFlip, RandomVerticalFlip
from .erasing import Cutout, RandomErasing
from .keyed import KeyedDraws
from .mix import CutMix, MixChoice, MixUp
from .random_geometry import RandomAffine, RandomPerspective, RandomRotation
from .random_ops import (
    GaussianBlur,
    Grayscale,
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomInvert,
    RandomPosterize,
    RandomSolarize,
)
from .resize import RandomResizedCrop
from .transforms import BatchTransform, Compose, ConvertDtype, Normalize

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
    "KeyedDraws",
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
