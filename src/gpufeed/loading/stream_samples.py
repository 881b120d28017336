"""SampleOps: the deterministic start of an evaluation recipe (``Resize``, ``CenterCrop``, ...) run on each streamed
sample exactly as torchvision runs it, on threads.

A training recipe starts with ``RandomResizedCrop``, which the batched path runs on images of any size. An
evaluation recipe starts with a resize and a crop that make every image one size: an image folder computes them
once and caches the result, a stream cannot (nothing is kept), so they run per sample on the reader's side, on the
PIL image the user's ``StreamingDataset`` would have made (``Image.open(f).convert("RGB")``), with the user's own
torchvision ops: the pixels are torchvision's by construction. What follows them (``ToTensor``, ``Normalize``) runs
batched on the device, as for a folder.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..device import usable_cores
from ..errors import DataError
from ..read.samples import to_chw
from ..store.ragged import Ragged

__all__ = ["SampleOps"]


class SampleOps:
    """``ops`` (torchvision transforms, applied in order) on each sample's decoded RGB image; :meth:`batch` does a
    batch on threads (PIL's decoders and resizes release the GIL).

    Example:
        >>> import torchvision.transforms as T
        >>> ops = SampleOps([T.Resize(8), T.CenterCrop(8)])
        >>> from PIL import Image; import io
        >>> f = io.BytesIO(); Image.new("RGB", (20, 10)).save(f, "PNG")
        >>> tuple(ops(f.getvalue(), "sample 0").shape)
        (3, 8, 8)
    """

    def __init__(self, ops: Sequence[Any]) -> None:
        self.ops = tuple(ops)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SampleOps([{', '.join(repr(op) for op in self.ops)}])"

    def __getstate__(self) -> dict[str, Any]:
        return {"ops": self.ops}  # a pool and a lock do not pickle

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["ops"])  # type: ignore[misc]

    def __call__(self, data: bytes, name: str) -> torch.Tensor:
        """One sample's file ``data`` as the ``(C, H, W)`` uint8 tensor the ops make of it; errors name ``name``."""
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                image: Any = im.convert("RGB")
        except Exception as e:  # what PIL raises for a damaged file varies (OSError, SyntaxError, ValueError, ...)
            raise DataError(f"{name} cannot be decoded ({type(e).__name__}: {e}); remove or fix it") from e
        for op in self.ops:
            image = op(image)
        return to_chw(image)

    def batch(self, files: Sequence[bytes], ids: np.ndarray, ragged: bool) -> torch.Tensor | Ragged:
        """The samples made one batch: stacked ``(N, C, H, W)``, or, when they differ in size and ``ragged`` (the
        batched ops that follow take images of different sizes), a :class:`Ragged` batch."""
        names = [f"sample {int(i)}" for i in ids]
        workers = min(usable_cores(), len(files))
        if workers > 1:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(usable_cores(), thread_name_prefix="gpufeed-stream-samples")
            images = list(self._pool.map(self, files, names))
        else:
            images = [self(f, n) for f, n in zip(files, names, strict=True)]
        shapes = {tuple(im.shape) for im in images}
        if len(shapes) == 1:
            return torch.stack(images)
        if ragged:
            return Ragged.stack(images)
        first = images[0].shape
        other = next(j for j, im in enumerate(images) if im.shape != first)
        raise DataError(
            f"after {self!r} the images differ in size ({names[0]}: {tuple(first)}, {names[other]}: "
            f"{tuple(images[other].shape)}) and nothing after makes them one size: end the per-sample part with a "
            "crop to one size (CenterCrop), as an evaluation recipe does"
        )
