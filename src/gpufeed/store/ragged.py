"""Images of different sizes as one batch: a flat buffer, each image's start and (C, H, W).

An ``ImageFolder`` of photos holds images of many sizes; stacking them would need a resize first,
which the training recipe (``RandomResizedCrop`` first) does per sample with its own box. A
:class:`Ragged` batch keeps every image as it is, in one buffer, so that op can crop and resize
the whole batch into one ``(N, C, S, S)`` tensor; every op after it sees ordinary batches.

The metadata (starts, shapes) stays on the CPU, where the per-sample box sizes are drawn; only the
pixels move to the device.

Layout: each image is packed channels-last (``H, W, C``: what decoders produce, and what the CPU's
uint8 antialiased resize runs fastest on, about 3x its speed on ``C, H, W``), or channels-first
(``hwc=False``: what a GPU decoder's list of ``C, H, W`` images packs into with one concatenation).
Either way :meth:`Ragged.image` serves a ``(C, H, W)`` view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import DataError
from .base import Store, need
from .dense import pinned

__all__ = ["Ragged", "check_index", "check_ragged", "sizes"]


@dataclass(frozen=True)
class Ragged(Store):
    """``N`` images of different sizes: image ``i`` is ``data[starts[i]:][:H*W*C].view(H, W, C)`` (``hwc``),
    or ``.view(C, H, W)``; :meth:`image` gives it as ``(C, H, W)`` either way.

    Example:
        >>> r = Ragged.stack([torch.zeros(3, 2, 4, dtype=torch.uint8), torch.ones(3, 5, 1, dtype=torch.uint8)])
        >>> len(r), r.shapes.tolist(), tuple(r.image(1).shape)
        (2, [[3, 2, 4], [3, 5, 1]], (3, 5, 1))
    """

    data: torch.Tensor  # (total,) pixels, uint8 or float, on the storage device
    starts: torch.Tensor  # (N,) int64 offsets into data, on the CPU
    shapes: torch.Tensor  # (N, 3) int64 (C, H, W), on the CPU
    hwc: bool = True  # each image packed channels-last

    kind = "pixels"
    ragged = True

    @classmethod
    def stack(cls, images: Sequence[torch.Tensor], hwc: bool = True) -> Ragged:
        """One buffer holding ``images`` (each ``(C, H, W)``, one dtype and channel count)."""
        if not images:
            raise DataError("a ragged batch needs at least one image")
        first = images[0]
        for i, im in enumerate(images):
            if im.dim() != 3 or im.dtype != first.dtype or im.shape[0] != first.shape[0]:
                raise DataError(
                    f"image {i} is {tuple(im.shape)} {im.dtype}; every image must be (C, H, W) with C="
                    f"{first.shape[0]} and dtype {first.dtype}"
                )
        sizes = torch.tensor([im.numel() for im in images], dtype=torch.int64)
        starts = torch.cumsum(sizes, 0) - sizes
        shapes = torch.tensor([list(im.shape) for im in images], dtype=torch.int64)
        flat = [(im.permute(1, 2, 0) if hwc else im).reshape(-1) for im in images]
        return cls(torch.cat(flat), starts, shapes, hwc)

    def __len__(self) -> int:
        return self.starts.shape[0]

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.starts.nbytes + self.shapes.nbytes

    @property
    def sample_bytes(self) -> float:
        return self.data.nbytes / len(self)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return (len(self), int(self.shapes[0, 0])) if len(self) else (0, 0)

    def image(self, i: int) -> torch.Tensor:
        """Image ``i`` as a ``(C, H, W)`` view of the buffer (no copy)."""
        c, h, w = (int(v) for v in self.shapes[i])
        start = int(self.starts[i])
        flat = self.data[start : start + c * h * w]
        return flat.view(h, w, c).permute(2, 0, 1) if self.hwc else flat.view(c, h, w)

    def select(self, idx: torch.Tensor) -> Ragged:
        """The images at ``idx`` (CPU indices), as views of the same buffer: nothing is copied."""
        idx = idx.cpu()
        return Ragged(self.data, self.starts.index_select(0, idx), self.shapes.index_select(0, idx), self.hwc)

    def compact(self) -> Ragged:
        """A new buffer holding only these images, in order (after :meth:`select`, to free the rest)."""
        return Ragged.stack([self.image(i) for i in range(len(self))], self.hwc)

    def to(self, device: torch.device, non_blocking: bool = False) -> Ragged:
        return Ragged(self.data.to(device, non_blocking=non_blocking), self.starts, self.shapes, self.hwc)

    def placed(self, storage: str, device: torch.device) -> Ragged:
        if storage == "device":
            return self.to(device)
        if storage == "pinned" and device.type == "cuda":
            return replace(self, data=pinned(self.data))  # its packing (hwc) kept
        return self

    def batch(self, idx: torch.Tensor, device: torch.device) -> Ragged:
        x = self.select(idx)
        if x.device != device:  # a host tier: the chunk's images, packed and copied over
            x = x.compact().to(device)
        return x

    def fingerprint(self, idx: torch.Tensor) -> list[torch.Tensor]:
        picked = self.select(idx)
        return [self.shapes, *(picked.image(i).contiguous() for i in range(len(picked)))]

    def describe(self) -> str:
        return f"ragged: {len(self):,} images of {int(self.shapes[0, 0])} channel(s), {sizes(self.shapes)}"

    def arrays(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        arrays = {"pixels": self.data, "starts": self.starts, "shapes": self.shapes}
        return arrays, {"store": self.kind, "hwc": self.hwc}

    @classmethod
    def from_arrays(cls, arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> Ragged:
        data, starts, shapes = need(arrays, "pixels"), need(arrays, "starts"), need(arrays, "shapes")
        check_index(data, starts, shapes.prod(1) if shapes.dim() == 2 else shapes, shapes, len(need(arrays, "labels")))
        return cls(data, starts, shapes, bool(meta.get("hwc", True)))

    def check(self) -> None:
        check_ragged(len(self), self.dtype, self.shapes)


def check_index(data: torch.Tensor, starts: torch.Tensor, sizes: torch.Tensor, shapes: torch.Tensor, n: int) -> None:
    """An entry's index arrays (each image's start, size and (C, H, W)) against its ``n`` labels and its buffer."""
    ok = starts.shape == (n,) and shapes.shape == (n, 3) and sizes.shape == (n,)
    if ok and n:
        ok = bool((starts >= 0).all() and (sizes >= 0).all() and int((starts + sizes).max()) <= data.numel())
    if not ok:
        raise ValueError(f"its index arrays do not fit its {data.numel():,}-element buffer")


def sizes(shapes: torch.Tensor) -> str:
    """The range of heights and widths of images of ``shapes`` ``(N, 3)`` (C, H, W), as the plan says it."""
    h, w = shapes[:, 1], shapes[:, 2]
    return f"heights {int(h.min())}-{int(h.max())}, widths {int(w.min())}-{int(w.max())}"


def check_ragged(n: int, dtype: torch.dtype, shapes: torch.Tensor) -> None:
    """``n`` images of different sizes (``shapes``: each one's (C, H, W)) can be served: at least one, uint8 or
    float, no axis of 0 (served silently as empty images otherwise), one channel count."""
    if n == 0 or not (dtype == torch.uint8 or dtype.is_floating_point):
        raise DataError(f"images: {n} ragged images of {dtype}; need at least one, uint8 or float")
    empty = (shapes == 0).any(dim=1).nonzero().flatten()
    if empty.numel():
        i = int(empty[0])
        raise DataError(
            f"images: ragged image {i} has shape {tuple(shapes[i].tolist())} (C, H, W), an axis of 0; "
            "every image needs at least one channel and one pixel: remove or fix that sample"
        )
    channels = shapes[:, 0].unique().tolist()
    if len(channels) != 1:
        raise DataError(
            f"images: ragged images with {channels} channels; every image needs one channel count "
            "(convert them all to RGB, as ImageFolder's loader does)"
        )
