"""What a loader state belongs to: a cheap fingerprint of the data and a readable one of the pipeline.

NOTE [ What a state belongs to ]
A position (epoch, batch) means something only for the data and the pipeline it was counted on: a
state of another dataset of the same length, or of another transform (another crop size, no flip,
another dtype), would otherwise load and resume into different batches without a word. So
``state_dict()`` records, under ``"fingerprint"``:

- the data, cheaply (no pass over it): the stored images' count, per-sample shape and dtype, a digest
  of 16 samples spread over the dataset (first and last included), and a digest of every label;
- the pipeline, readably: the batched transform's ``repr`` (gpufeed's ops print their parameters)
  with memory addresses removed (they differ between runs), the output dtype and layout. ``mix``
  and ``views`` are recorded beside it, as they were before.

``load_state_dict`` compares the keys both sides have (a state saved before a key existed, or with
no fingerprint at all, still loads) and names every one that differs. ``strict=False`` (or
``loader.strict_state = False``, for a trainer that calls ``load_state_dict(state)`` itself) loads
the position anyway, for those who changed the transform on purpose. The sampled digest misses a
change confined to unsampled images; it is a guard against the wrong dataset, not a checksum.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import torch

__all__ = ["data_identity", "describe", "differences", "digest"]

_SAMPLES = 16  # images hashed per dataset: enough to tell datasets apart, cheap on every storage tier
_ADDRESS = re.compile(r"\s+at\s+0x[0-9a-fA-F]+")  # "<function f at 0x7f...>": differs from run to run


def digest(*parts: Any) -> str:
    """A short hex digest of ``parts``: tensors by dtype, shape and bytes, anything else by its ``repr``."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, torch.Tensor):
            t = part.detach().cpu().contiguous()
            h.update(f"{t.dtype} {tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()


def describe(obj: Any) -> str:
    """``repr(obj)`` on one line, without memory addresses.

    Example:
        >>> describe(None), describe(lambda x: x).startswith("<function <lambda>")
        ('None', True)
    """
    return " ".join(_ADDRESS.sub("", repr(obj)).split())


def data_identity(images: Any, labels: torch.Tensor) -> dict[str, str]:
    """The data part of a fingerprint: ``images`` a ``(N, ...)`` tensor, or a ``Ragged`` / ``Encoded`` store."""
    dense = isinstance(images, torch.Tensor)
    n = images.shape[0] if dense else len(images)
    idx = torch.linspace(0, max(n - 1, 0), steps=min(n, _SAMPLES)).round().long().unique()
    if dense:
        what = f"{n} images of {tuple(images.shape[1:])} {images.dtype}"
        sampled = digest(images.index_select(0, idx.to(images.device)))
    else:  # each image's shape is metadata (cheap to hash in full); the bytes only for the sampled images
        what = f"{n} {type(images).__name__.lower()} images of {images.dtype}"
        sampled = digest(images.shapes, images.select(idx).compact().data)
    return {"images": what, "pixels": sampled, "labels": digest(labels)}


def _excerpt(a: str, b: str, width: int = 100) -> tuple[str, str]:
    """``a`` and ``b`` cut to about ``width`` characters around the place where they first differ."""
    if len(a) <= width and len(b) <= width:
        return a, b
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, at - width // 3)

    def cut(s: str) -> str:
        return ("..." if start else "") + s[start : start + width] + ("..." if start + width < len(s) else "")

    return cut(a), cut(b)


def differences(saved: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    """``"saved with key=..., but this loader has key=..."`` for each key both have and they disagree on."""
    found = []
    for key, value in mine.items():
        if key in saved and saved[key] != value:
            a, b = (saved[key], value)
            if isinstance(a, str) and isinstance(b, str):
                a, b = _excerpt(a, b)
            found.append(f"saved with {key}={a!r}, but this loader has {key}={b!r}")
    return found
