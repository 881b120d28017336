"""Training CIFAR-sized models fast: models, loaders to compare, and the loop (AMP, channels_last, CUDA graphs).

The loop (and with it torchvision and the datasets) is imported when first named, not with the package: the
command line's parser reads :mod:`.models` and :mod:`.kinds` alone (``gpufeed --help`` imports no torchvision).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import EpochRecord, TrainConfig, train
    from .models import MODELS, build_model

__all__ = ["MODELS", "EpochRecord", "TrainConfig", "build_model", "train"]

_WHERE = {"EpochRecord": "loop", "TrainConfig": "loop", "train": "loop", "MODELS": "models", "build_model": "models"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
