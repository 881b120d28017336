"""torch's dataset wrappers seen through: ``Subset`` (and ``random_split``'s parts) and ``ConcatDataset``.

A wrapper has no ``transform`` of its own: the random transform runs inside the dataset it wraps. Read
through the wrapper as it is, every sample would come out augmented once and be stored that way, so
each epoch would serve the same "random" image. :func:`unwrap` returns a dataset that yields the same
samples in the same order with the inner dataset's ``transform`` exposed, so the planner can split it:

- over torchvision's and torch's own datasets (arrays: CIFAR, MNIST, SVHN, ``TensorDataset``; files:
  ``ImageFolder``, ``DatasetFolder``, ``Food101``) it is a copy of the inner dataset restricted to the
  wrapper's indices (or their parts joined), so the arrays are read in one step, the files' headers and
  bytes serve the JPEG store, and the cache key covers exactly those samples;
- over any other dataset it is a view (:class:`IndexedView`, :class:`ConcatView`) whose ``transform``
  is the inner one; gpufeed strips it through the view as it strips a dataset's own.

The caller's objects are never modified. Which datasets a view holds, and whether any of them still
runs a random transform inside (an unknown wrapper), is what :func:`hidden_transforms` tells the probe.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

from ..errors import DataError
from ..validate import UnbatchableError

__all__ = ["ConcatView", "IndexedView", "SourceWatch", "hidden_transforms", "selection", "unwrap"]

# Set on the copies :func:`unwrap` makes: which part of the inner dataset(s) a copy holds. Two parts of one folder
# (``random_split``'s train and validation) share its class and root, so without it each part's cache entry would
# pass for a superseded build of the other (gpufeed.cache.usage.remove_superseded) and be removed.
_SELECTION = "_gpufeed_selection"


def selection(dataset: Any) -> str | None:
    """For a copy :func:`unwrap` made of a part of a dataset (or of several joined): which part, as a digest of
    the wrappers' indices and parts; ``None`` for a dataset that holds all of its own samples."""
    value = getattr(dataset, _SELECTION, None)
    return value if isinstance(value, str) else None


def _selected(out: Any, *parts: Any) -> Any:
    """``out`` tagged with the digest of ``parts`` (indices, and the selections and roots of what it holds)."""
    from .fingerprint import digest

    setattr(out, _SELECTION, digest(*parts))
    return out


class IndexedView(Dataset):
    """``dataset[indices[i]]``, with ``dataset.transform`` as its own (a Subset gpufeed can strip)."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, [int(i) for i in indices]

    @property
    def transform(self) -> Any:
        return getattr(self.dataset, "transform", None)

    def parts(self) -> list[Any]:
        return [self.dataset]

    def replace_parts(self, parts: list[Any]) -> IndexedView:
        return IndexedView(parts[0], self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.indices[i]]


class ConcatView(Dataset):
    """The parts one after another, with their shared ``transform`` as its own (a ConcatDataset gpufeed can strip)."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        self.datasets = list(datasets)
        self._ends = np.cumsum([len(d) for d in self.datasets]).tolist()

    @property
    def transform(self) -> Any:
        return getattr(self.datasets[0], "transform", None)

    def parts(self) -> list[Any]:
        return list(self.datasets)

    def replace_parts(self, parts: list[Any]) -> ConcatView:
        return ConcatView(parts)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i: int) -> Any:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for a dataset of {len(self)} samples")
        i = i % len(self) if len(self) else i
        part = int(np.searchsorted(self._ends, i, side="right"))
        return self.datasets[part][i - (self._ends[part - 1] if part else 0)]


def _pipeline_id(transform: Any) -> str:
    """What makes two parts' transforms the same pipeline: the same object, or the same parameters."""
    return repr(transform)


def _standard(dataset: Any) -> bool:
    from .fingerprint import standard_getitem

    return standard_getitem(dataset)


def _take(values: Any, indices: list[int]) -> Any:
    """``values`` (a list, array or tensor) at ``indices``, of the same kind."""
    if isinstance(values, torch.Tensor):
        return values[torch.as_tensor(indices, dtype=torch.long)]
    if isinstance(values, np.ndarray):
        return values[np.asarray(indices, dtype=np.int64)]
    return [values[i] for i in indices]


def _join(values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat(values)
    if all(isinstance(v, np.ndarray) for v in values):
        return np.concatenate(values)
    return [x for v in values for x in (v.tolist() if isinstance(v, (np.ndarray, torch.Tensor)) else v)]


# The sample-holding attributes of torchvision's and torch's own datasets, in the order __getitem__ reads them.
def _fields(dataset: Any) -> list[str] | None:
    """The attributes that hold one entry per sample (restricting them all restricts the dataset), or None."""
    from torchvision.datasets import DatasetFolder, Food101

    if not _standard(dataset) or isinstance(dataset, (Subset, ConcatDataset)):
        return None
    if isinstance(dataset, TensorDataset):
        return ["tensors"]
    if isinstance(dataset, DatasetFolder) and isinstance(getattr(dataset, "samples", None), list):
        return [f for f in ("samples", "imgs", "targets") if isinstance(getattr(dataset, f, None), list)]
    if isinstance(dataset, Food101):
        return ["_image_files", "_labels"]
    data = getattr(dataset, "data", None)
    name = "targets" if hasattr(dataset, "targets") else "labels"
    labels = getattr(dataset, name, None)
    if isinstance(data, (np.ndarray, torch.Tensor)) and labels is not None and len(labels) == len(data):
        return ["data", name]
    return None


def _restricted(dataset: Any, fields: list[str], indices: list[int]) -> Any:
    if fields == ["tensors"]:
        return TensorDataset(*(_take(t, indices) for t in dataset.tensors))
    out = copy.copy(dataset)
    imgs_alias = getattr(dataset, "imgs", None) is getattr(dataset, "samples", object())
    for f in fields:
        setattr(out, f, _take(getattr(dataset, f), indices))
    if imgs_alias:  # ImageFolder's imgs is samples itself
        out.imgs = out.samples
    return out


def _joined(parts: list[Any], fields: list[str]) -> Any:
    if fields == ["tensors"]:
        return TensorDataset(*(torch.cat(ts) for ts in zip(*(p.tensors for p in parts), strict=True)))
    out = copy.copy(parts[0])
    imgs_alias = getattr(parts[0], "imgs", None) is getattr(parts[0], "samples", object())
    for f in fields:
        setattr(out, f, _join([getattr(p, f) for p in parts]))
    if imgs_alias:
        out.imgs = out.samples
    return out


def _same_kind(parts: list[Any], fields: list[str]) -> bool:
    """Whether the parts can be one dataset of the first one's class: the same class, the same transforms,
    file loader and classes, arrays of one shape past the first axis."""
    first = parts[0]
    for p in parts[1:]:
        if type(p) is not type(first) or _fields(p) != fields:
            return False
        for attr in ("transform", "target_transform", "loader", "classes", "class_to_idx"):
            a, b = getattr(first, attr, None), getattr(p, attr, None)
            if a is not b and _pipeline_id(a) != _pipeline_id(b):
                return False
        if fields == ["tensors"]:
            if len(p.tensors) != len(first.tensors) or any(
                x.shape[1:] != y.shape[1:] or x.dtype != y.dtype for x, y in zip(p.tensors, first.tensors, strict=True)
            ):
                return False
        elif "data" in fields:
            if type(p.data) is not type(first.data) or p.data.shape[1:] != first.data.shape[1:]:
                return False
            if p.data.dtype != first.data.dtype:
                return False
    return True


def unwrap(dataset: Any, own_transforms: bool = True) -> Any:
    """A dataset that yields what ``dataset`` yields, with torch's wrappers seen through (see the module's doc).

    ``own_transforms=False``: the caller replaces every inner transform (``accelerate(..., transform=)``), so
    the parts of a ``ConcatDataset`` need not share one.

    Example:
        >>> from torch.utils.data import Subset
        >>> ds = TensorDataset(torch.arange(12).view(6, 1, 1, 2).to(torch.uint8), torch.arange(6))
        >>> inner = unwrap(Subset(ds, [4, 1]))
        >>> type(inner).__name__, inner.tensors[1].tolist()
        ('TensorDataset', [4, 1])
    """
    if isinstance(dataset, Subset):
        inner = unwrap(dataset.dataset, own_transforms)
        indices = [int(i) for i in dataset.indices]
        n = len(inner)
        bad = next((i for i in indices if not -n <= i < n), None)
        if bad is not None:
            # bad input, not a pipeline the batched path cannot run: no loader could serve it (not the fallback either)
            raise DataError(
                f"Subset index {bad} is out of range for its dataset of {n} samples (Subset.indices must be in "
                f"[-{n}, {n})); fix the Subset's indices"
            )
        indices = [i % n for i in indices]
        fields = _fields(inner)
        if fields is None:
            return IndexedView(inner, indices)
        return _selected(_restricted(inner, fields, indices), "subset", selection(inner), torch.tensor(indices))
    if isinstance(dataset, ConcatDataset):
        parts = [unwrap(d, own_transforms) for d in dataset.datasets]
        transforms = {_pipeline_id(getattr(p, "transform", None)) for p in parts}
        if own_transforms and len(transforms) > 1:
            raise UnbatchableError(
                f"the ConcatDataset's {len(parts)} parts have different transforms ({', '.join(sorted(transforms))}); "
                "gpufeed runs one pipeline for the whole dataset: give the parts one transform, or pass "
                "fallback='prefetch' to run each part's own per sample"
            )
        fields = _fields(parts[0])
        if fields is not None and _same_kind(parts, fields):
            # each part's folder by its name (not its mount: a job resumed elsewhere reads it from another path)
            where = [(os.path.basename(str(getattr(p, "root", ""))), len(p), selection(p)) for p in parts]
            return _selected(_joined(parts, fields), "concat", where)
        return ConcatView(parts)
    return dataset


def map_parts(dataset: Any, fn: Callable[[Any], Any]) -> Any:
    """A view with ``fn`` applied to each dataset it holds (how a transform is replaced through it)."""
    return dataset.replace_parts([fn(p) for p in dataset.parts()])


def _nested(obj: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, dataset) of every dataset held in ``obj``'s attributes (a wrapper of any kind), depth first."""
    if depth > 4:
        return
    values = vars(obj).items() if hasattr(obj, "__dict__") else ()
    for name, value in values:
        found = [value] if isinstance(value, Dataset) else []
        if isinstance(value, (list, tuple)) and len(value) <= 64:
            found = [v for v in value if isinstance(v, Dataset)]
        for d in found:
            yield name, d
            yield from ((f"{name}.{sub}", dd) for sub, dd in _nested(d, depth + 1))


def hidden_transforms(dataset: Any) -> list[tuple[str, Any]]:
    """(where, transform) of each transform that runs inside ``dataset[i]`` but is not ``dataset.transform``:
    the transforms of datasets wrapped by a wrapper gpufeed does not know. They cannot be stripped, so
    whatever random ops they hold would be read once and frozen."""
    if isinstance(dataset, (IndexedView, ConcatView)):
        return [hit for part in dataset.parts() for hit in hidden_transforms(part)]
    found = [
        (f"{type(dataset).__name__}.{path}", t)
        for path, inner in _nested(dataset)
        if (t := getattr(inner, "transform", None)) is not None
    ]
    # A VisionDataset's joint ``transforms`` (image and target together) is not its ``transform``: gpufeed
    # replaces only torchvision's StandardTransform, which merely calls the two.
    joint = getattr(dataset, "transforms", None)
    if joint is not None and type(joint).__name__ != "StandardTransform":
        found.append((f"{type(dataset).__name__}.transforms", joint))
    return found


_READ_ONCE = ("transform", "target_transform", "transforms", "targets", "samples", "data", "labels", "tensors")


class SourceWatch:
    """What ``accelerate`` read from the user's dataset objects (and those its wrappers hold), by identity: a
    transform or labels replaced afterwards (progressive resizing, pseudo-labels) would be served stale by a
    loader that read them once, so the next epoch is refused instead. Holds weak references and ids only, so it
    keeps nothing alive; copied into another process (pickled) it watches nothing."""

    def __init__(self, dataset: Any, transform_given: bool) -> None:
        import weakref

        names = [n for n in _READ_ONCE if not (transform_given and n in ("transform", "transforms"))]
        self._watched: list[tuple[Any, str, str, int]] = []
        for d in _wrapped(dataset):
            try:
                ref = weakref.ref(d)
            except TypeError:  # an object that takes no weak reference: not watched
                continue
            self._watched += [(ref, type(d).__name__, n, id(getattr(d, n))) for n in names if hasattr(d, n)]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (SourceWatch, (None, True))

    def check(self) -> None:
        for ref, name, attr, seen in self._watched:
            d = ref()
            if d is not None and id(getattr(d, attr, None)) != seen:
                raise DataError(
                    f"{name}.{attr} was replaced after gpufeed.accelerate() read the dataset: this loader serves what "
                    f"it read then, not the new {attr}. Call gf.accelerate(dataset, ...) again to serve it (it reads "
                    "and caches the dataset anew), or restore the old one"
                )


def _wrapped(dataset: Any) -> list[Any]:
    """``dataset`` and every dataset torch's wrappers inside it hold."""
    if dataset is None:
        return []
    if isinstance(dataset, Subset):
        return [dataset, *_wrapped(dataset.dataset)]
    if isinstance(dataset, ConcatDataset):
        return [dataset, *(d for part in dataset.datasets for d in _wrapped(part))]
    return [dataset]
