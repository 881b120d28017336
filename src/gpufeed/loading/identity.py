"""What a loader state belongs to: a cheap fingerprint of the data and a readable one of the pipeline.

NOTE [ What a state belongs to ]
A position (epoch, batch) means something only for the data and the pipeline it was counted on: a
state of another dataset of the same length, or of another transform (another crop size, no flip,
another dtype), would otherwise load and resume into different batches without a word. So
``state_dict()`` records, under ``"fingerprint"``:

- the data, cheaply (no pass over it): the stored images' count, per-sample shape and dtype, a digest
  of 16 samples spread over the dataset (first and last included; a JPEG store's decoded, so that it
  matches the pixel store of the same files), and a digest of every label;
  for the per-sample fallback, which stores nothing, :func:`dataset_identity` (no sample read);
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

import os
import re
from typing import Any

import numpy as np
import torch

from ..read.fingerprint import digest
from ..store import Store, as_store

__all__ = ["data_identity", "dataset_identity", "describe", "differences"]

_SAMPLES = 16  # images hashed per dataset: enough to tell datasets apart, cheap on every storage tier
_ADDRESS = re.compile(r"\s+at\s+0x[0-9a-fA-F]+")  # "<function f at 0x7f...>": differs from run to run


def describe(obj: Any) -> str:
    """``repr(obj)`` on one line, without memory addresses.

    Example:
        >>> describe(None), describe(lambda x: x).startswith("<function <lambda>")
        ('None', True)
    """
    return " ".join(_ADDRESS.sub("", repr(obj)).split())


def data_identity(images: Store | torch.Tensor, labels: torch.Tensor) -> dict[str, str]:
    """The data part of a fingerprint: the images' count, per-sample shape and dtype, a digest of the sampled
    images (:meth:`~gpufeed.store.base.Store.fingerprint`) and one of every label. ``images``: a store, or an
    ``(N, C, H, W)`` tensor."""
    store = as_store(images)
    n = len(store)
    idx = torch.tensor(_spread(n), dtype=torch.long)
    if store.ragged:
        what = f"{n} images of different sizes, {store.dtype}"
    else:
        what = f"{n} images of {store.stored_shape[1:]} {store.dtype}"
    return {"images": what, "pixels": digest(*store.fingerprint(idx)), "labels": digest(labels)}


def _spread(n: int) -> list[int]:
    """Up to ``_SAMPLES`` positions spread over ``n``, first and last included."""
    return torch.linspace(0, max(n - 1, 0), steps=min(n, _SAMPLES)).round().long().unique().tolist()


def _metadata(dataset: Any, depth: int = 0) -> list[Any]:
    """What a dataset holds per sample without reading a sample: the wrappers' indices and parts, the file list
    (sampled), the arrays (sampled rows) and the labels (all), each where the dataset has it."""
    from ..read.wrappers import selection

    if depth > 4:
        return []
    parts: list[Any] = [type(dataset).__qualname__]
    try:
        parts.append(len(dataset))
    except Exception:  # a dataset whose len() fails is refused elsewhere
        pass
    indices: Any = getattr(dataset, "indices", None)
    if isinstance(indices, (list, tuple, range, torch.Tensor, np.ndarray)):
        parts.append(_as_tensor(list(indices)))
    part_of = selection(dataset)  # a copy gpufeed.read.wrappers.unwrap made of a part of the dataset(s)
    if part_of is not None:
        parts.append(part_of)
    samples: Any = getattr(dataset, "samples", None)
    if isinstance(samples, list):  # (path, target): paths relative to the root, so a folder moved still matches
        root = getattr(dataset, "root", None)
        picked = [samples[i] for i in _spread(len(samples))]
        parts.append([_relative(s, root) for s in picked])
    data: Any = getattr(dataset, "data", None)
    if isinstance(data, (torch.Tensor, np.ndarray)):
        parts.append(_as_tensor(data[_spread(len(data))] if data.ndim else data))
    tensors: Any = getattr(dataset, "tensors", None)  # TensorDataset
    if isinstance(tensors, tuple) and all(isinstance(t, torch.Tensor) for t in tensors):
        parts += [t[_spread(len(t))] if t.dim() else t for t in tensors]
    for name in ("targets", "labels"):
        values: Any = getattr(dataset, name, None)
        if isinstance(values, (list, torch.Tensor, np.ndarray)):
            parts.append(_as_tensor(values))
            break
    inner = getattr(dataset, "dataset", None)  # Subset, gpufeed's IndexedView, Guarded...
    if inner is not None and inner is not dataset:
        parts += ["(", *_metadata(inner, depth + 1), ")"]  # flat: digest() hashes tensors by their bytes
    for part in getattr(dataset, "datasets", None) or ():  # ConcatDataset, gpufeed's ConcatView
        parts += ["(", *_metadata(part, depth + 1), ")"]
    return parts


def _relative(sample: Any, root: Any) -> Any:
    """A ``(path, target)`` sample with its path relative to ``root`` (as given, or resolved: a job resumed on
    another machine reads the same folder from another mount)."""
    if not (isinstance(sample, tuple) and sample and isinstance(sample[0], (str, os.PathLike))):
        return sample
    if isinstance(root, (str, os.PathLike)):
        return (os.path.relpath(sample[0], root), *sample[1:])
    return (os.path.basename(sample[0]), *sample[1:])


def _as_tensor(values: Any) -> Any:
    """``values`` as a tensor to digest, or as they are where they hold no numbers (paths, names: by ``repr``)."""
    try:
        return torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError):
        return values.tolist() if isinstance(values, np.ndarray) else list(values)


def dataset_identity(dataset: Any) -> dict[str, str]:
    """The data part of a fingerprint for a dataset gpufeed does not read into a store (the per-sample
    fallback): its class and length, and a digest of what it holds per sample that needs no sample read
    (:func:`_metadata`), so another dataset of the same class and length -- another folder, the other part of
    a ``random_split`` -- is told apart.

    Example:
        >>> from torch.utils.data import Subset, TensorDataset
        >>> ds = TensorDataset(torch.zeros(4, 1))
        >>> dataset_identity(Subset(ds, [0, 1])) != dataset_identity(Subset(ds, [2, 3]))
        True
    """
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    return {"dataset": f"{kind} of {len(dataset)}", "samples": digest(*_metadata(dataset))}


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
