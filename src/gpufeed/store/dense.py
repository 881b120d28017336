"""Dense: images of one size as one ``(N, C, H, W)`` tensor (uint8 preferred), the fast and common case.

A chunk is one ``index_select``. On the device the indices are already there (an epoch's order is sent once);
a host store serving a GPU gathers each chunk straight into pinned memory (:func:`pinned_gather`), which the
loader copies ahead on a side stream (:func:`gpufeed.loading.prefetch.prefetch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..validate import check_images
from .base import Store, need

__all__ = ["Dense", "pinned", "pinned_gather"]


@dataclass(frozen=True)
class Dense(Store):
    """``N`` images of one size in ``tensor`` (``(N, C, H, W)``), on any device or memory-mapped.

    Example:
        >>> d = Dense(torch.arange(24, dtype=torch.uint8).view(2, 3, 2, 2))
        >>> len(d), d.sample_bytes, d.select(torch.tensor([1])).tensor[0, 0].tolist()
        (2, 12, [[12, 13], [14, 15]])
    """

    tensor: torch.Tensor

    kind = "dense"
    ragged = False

    def __len__(self) -> int:
        return self.tensor.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes

    @property
    def sample_bytes(self) -> float:
        return self.tensor[0].nbytes

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def images(self) -> torch.Tensor:
        return self.tensor

    def select(self, idx: torch.Tensor) -> Dense:
        return Dense(self.tensor.index_select(0, idx.to(self.tensor.device)))

    def compact(self) -> Dense:
        return self  # a selection is already a copy

    def placed(self, storage: str, device: torch.device) -> Dense:
        if storage == "device":
            return Dense(self.tensor.to(device))
        if storage == "pinned" and device.type == "cuda":
            return Dense(pinned(self.tensor))
        return self

    def batch(self, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        return self.tensor.index_select(0, idx.to(self.tensor.device)).to(device)

    def pinned_batch(self, idx: torch.Tensor) -> torch.Tensor:
        return pinned_gather(self.tensor, idx)

    def fingerprint(self, idx: torch.Tensor) -> list[torch.Tensor]:
        return [self.tensor.index_select(0, idx.to(self.tensor.device))]

    def arrays(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {"images": self.tensor}, {"store": self.kind}

    @classmethod
    def from_arrays(cls, arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> Dense:
        images, labels = need(arrays, "images"), need(arrays, "labels")
        if images.dim() != 4 or labels.shape[:1] != images.shape[:1]:
            raise ValueError(f"images {tuple(images.shape)} and labels {tuple(labels.shape)} do not form a dataset")
        return cls(images)

    def check(self) -> None:
        check_images(self.tensor)


def pinned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in page-locked host memory (itself when it is already)."""
    return t if t.is_pinned() else t.pin_memory()


def pinned_gather(source: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``source[idx]`` (rows of a host tensor) gathered straight into a new pinned buffer: one pass, no staging copy."""
    out = torch.empty((idx.shape[0], *source.shape[1:]), dtype=source.dtype, pin_memory=True)
    return torch.index_select(source, 0, idx, out=out)
