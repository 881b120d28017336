"""Checks of what a caller hands a loader: typed errors that name the argument or sample and the fix."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .errors import ConfigError, DataError

__all__ = ["as_tensor", "check_images", "check_labels", "check_transform"]


def as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (list, tuple)):
        return torch.as_tensor(value)
    raise DataError(f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}")


def check_images(images: torch.Tensor) -> None:
    if images.dim() != 4:
        fix = "; add the channel axis with images.unsqueeze(1)" if images.dim() == 3 else ""
        raise DataError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}{fix}")
    if images.shape[0] == 0:
        raise DataError("images is empty (N=0); a loader needs at least one sample")
    if images.dtype != torch.uint8 and not images.dtype.is_floating_point:
        raise DataError(f"images has dtype={images.dtype}; use uint8 (preferred: 4x smaller) or a floating dtype")
    if images.dtype.is_floating_point:
        step = 4096  # in slices, so a memory-mapped array is not materialised at once
        for start in range(0, images.shape[0], step):
            bad = ~torch.isfinite(images[start : start + step]).flatten(1).all(dim=1)
            if bool(bad.any()):
                first = start + int(bad.nonzero()[0, 0])
                raise DataError(f"images[{first}] contains NaN or inf; clean the data or drop the sample")


def check_labels(labels: torch.Tensor, n: int, num_classes: int | None) -> None:
    if labels.dim() == 0 or labels.shape[0] != n:
        raise DataError(f"labels has shape {tuple(labels.shape)} but images has {n} samples; they must match")
    if labels.dtype.is_floating_point:
        bad = ~torch.isfinite(labels.reshape(n, -1)).all(dim=1)
        if bool(bad.any()):
            raise DataError(f"labels[{int(bad.nonzero()[0, 0])}] is NaN or inf")
        return
    if labels.dtype == torch.bool or labels.is_complex():
        raise DataError(f"labels has dtype={labels.dtype}; use an integer (class index) or floating dtype")
    low = labels < 0
    high = labels >= num_classes if num_classes is not None else torch.zeros_like(low)
    bad = (low | high).reshape(n, -1).any(dim=1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        limit = f"[0, {num_classes})" if num_classes is not None else ">= 0"
        raise DataError(f"labels[{i}]={labels[i].tolist()} is out of range {limit}; class indices must be {limit}")


def check_transform(transform: Callable[..., Any]) -> None:
    if not callable(transform):
        raise ConfigError(f"transform={transform!r} is not callable")
    try:
        params = inspect.signature(transform).parameters
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call itself speak
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "generator" not in params and not takes_kwargs:
        raise ConfigError(
            f"transform={transform!r} does not accept generator=; DeviceLoader calls transform(batch, generator=g) "
            "on whole batches. Use gpufeed.augment ops, or add a generator keyword to your callable"
        )
