"""Dataset -> one ``(N, C, H, W)`` tensor of images and one of labels, after the cached part.

Images of different sizes (an ImageFolder of photos) are read into a :class:`~gpufeed.store.ragged.Ragged`
store instead, when the batched part starts with an op that takes them (RandomResizedCrop).

Two paths. Datasets that expose their arrays (``.data`` with ``.targets`` or ``.labels``: CIFAR,
MNIST, SVHN, STL10, ...; ``TensorDataset``) are read in one vectorised step when nothing needs
computing per sample; a spot check against ``dataset[i]`` guards the layout guess. Any other
map-style dataset is read sample by sample, in ``DataLoader`` workers, with a progress bar; every
image must come out of the cached part with one shape.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..errors import DataError
from ..store.ragged import Ragged
from ..validate import Guarded, SampleFailure, UnbatchableError, check_dataset, label_tensor
from ..workers import default_workers, loader_kwargs
from .fingerprint import standard_getitem
from .wrappers import ConcatView, IndexedView, map_parts

__all__ = [
    "Ingested",
    "RaggedError",
    "UnbatchableError",
    "as_pair",
    "exposes_arrays",
    "ingest",
    "ragged_message",
    "stored_labels",
    "to_chw",
    "with_transform",
]


class RaggedError(UnbatchableError):
    """Images of different sizes leave the cached part: they cannot be stacked into one store.

    ``sizes_only``: they differ in height and width only (one channel count and dtype), so a recipe that
    starts with RandomResizedCrop can keep each as it is."""

    def __init__(self, message: str, sizes_only: bool = False) -> None:
        super().__init__(message)
        self.sizes_only = sizes_only


def ragged_message(
    source: str, i: int, shape: tuple[int, ...], dtype: Any, first: tuple[int, ...], first_dtype: Any
) -> str:
    if shape[0] != first[0]:
        fix = "convert every image to one mode first (e.g. PIL's image.convert('RGB'), or Grayscale(3))"
    elif dtype != first_dtype:
        fix = "give every image one dtype"
    else:
        fix = "add a Resize and CenterCrop (or RandomCrop with pad_if_needed) first"
    return (
        f"{source}[{i}] has shape {shape} ({dtype}) but sample 0 has {first} ({first_dtype}); every image must "
        f"leave the cached part with one shape: {fix}, or pass fallback='prefetch' to run the per-sample pipeline "
        "in DataLoader workers"
    )


@dataclass(frozen=True)
class Ingested:
    images: (
        Any  # (N, C, H, W) CPU tensor, uint8 (float32 when the cached part made floats); or a Ragged / Encoded store
    )
    labels: torch.Tensor  # (N,) int64, or the dataset's targets
    path: str  # "arrays" or "per-sample"
    seconds: float
    files: dict[str, Path] | None = None  # arrays whose bytes are already these files (a resumable build's)
    # a per-sample read's PIL modes: (index, mode) of the first sample of each mode met, in order (None: a PIL
    # mode; not a PIL image). An entry records them, so that a hit is checked as a fresh read is (pipeline.entries)
    modes: tuple[tuple[int, str | None], ...] | None = None


def to_chw(image: Any) -> torch.Tensor:
    """A PIL image, numpy array or CHW/HW tensor as a ``(C, H, W)`` tensor (uint8 stays uint8).

    A numpy image is HWC (as PIL, OpenCV and ``ToTensor`` have it), unless its first axis holds the
    channels (1, 3 or 4) and its last does not: then it is already CHW, kept as it is (a
    ``DataLoader`` would stack it that way too).
    """
    if isinstance(image, torch.Tensor):
        return image.unsqueeze(0) if image.dim() == 2 else image
    if isinstance(image, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(image))
        if t.dim() == 2:
            return t.unsqueeze(0)
        chw = t.dim() == 3 and t.shape[0] in (1, 3, 4) and t.shape[-1] not in (1, 3, 4)
        return t if chw else t.permute(2, 0, 1)
    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor

    if isinstance(image, Image.Image):
        return pil_to_tensor(image)
    raise UnbatchableError(f"a sample's image is a {type(image).__name__}; expected a PIL image, numpy array or tensor")


def _arrays(dataset: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Images as (N, C, H, W) and labels straight from the dataset's arrays, or None."""
    if not exposes_arrays(dataset):
        return None
    if isinstance(dataset, TensorDataset):
        images, labels = dataset.tensors
        return (images.unsqueeze(1) if images.dim() == 3 else images), label_tensor(labels, "TensorDataset labels")
    from torchvision.datasets import STL10, SVHN

    name = "targets" if hasattr(dataset, "targets") else "labels"
    labels = getattr(dataset, name)
    images = torch.as_tensor(dataset.data)
    chw = isinstance(dataset, (SVHN, STL10))  # they store .data as (N, C, H, W); the others (N, H, W[, C])
    if images.dim() == 3:
        images = images.unsqueeze(1)
    elif images.dim() == 4 and not chw and images.shape[-1] in (1, 3, 4):
        images = images.permute(0, 3, 1, 2)
    elif images.dim() != 4 or images.shape[1] not in (1, 3, 4):
        return None
    source = type(dataset).__name__
    return images.contiguous(), stored_labels(dataset, labels, f"{source}.{name}", f"{source}.target_transform({name})")


def stored_labels(dataset: Any, targets: Any, what: str, mapped: str | None = None) -> torch.Tensor:
    """The labels a dataset stores (its ``targets``, a folder's class indices) as ``dataset[i]`` gives them: mapped
    by its ``target_transform``, each target as the dataset stores it (a float stays a float). What every read
    that skips ``__getitem__`` (the arrays, a folder's files) must do itself. ``what`` names them in an error
    (``mapped``: when the target_transform made them)."""
    target_transform = getattr(dataset, "target_transform", None)
    if target_transform is None:
        return label_tensor(targets, what)
    raw = targets.tolist() if isinstance(targets, (np.ndarray, torch.Tensor)) else list(targets)
    return label_tensor([target_transform(v) for v in raw], mapped or what)


class _Mapped(Dataset):
    """``(transform(image), label)`` of a dataset that has no ``transform`` attribute of its own."""

    def __init__(self, dataset: Any, transform: Callable[[Any], Any]) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        image, label = self.dataset[i]
        return self.transform(image), label


def exposes_arrays(dataset: Any) -> bool:
    """Whether ``dataset`` holds its samples as arrays gpufeed can read in one step: torchvision's or torch's
    own ``__getitem__`` reads them (a user's ``__getitem__`` may change what they hold), uint8 images."""
    if not standard_getitem(dataset):
        return False
    if isinstance(dataset, TensorDataset):
        return len(dataset.tensors) == 2
    data = getattr(dataset, "data", None)
    labels = getattr(dataset, "targets", getattr(dataset, "labels", None))
    return isinstance(data, (np.ndarray, torch.Tensor)) and labels is not None and data.dtype in (np.uint8, torch.uint8)


def _identity(image: Any) -> Any:
    return image


def with_transform(dataset: Any, transform: Callable[[Any], Any] | None) -> Any:
    """``dataset`` with its per-sample transform replaced by ``transform``; the caller's object is untouched.

    torchvision datasets get a shallow copy with ``.transform`` set; others (``TensorDataset``,
    custom ones) are wrapped so that ``transform`` applies to the image of each ``(image, label)``; a view
    of :mod:`gpufeed.read.wrappers` has the transform of each dataset it holds replaced.
    """
    if isinstance(dataset, (IndexedView, ConcatView)):
        return map_parts(dataset, lambda part: with_transform(part, transform))
    if not hasattr(dataset, "transform"):
        return dataset if transform is None else _Mapped(dataset, transform)
    ds = copy.copy(dataset)
    # No transform is the identity, not None: a custom dataset may call self.transform unconditionally.
    ds.transform = transform if transform is not None else _identity
    if hasattr(ds, "transforms") and type(ds.transforms).__name__ == "StandardTransform":
        from torchvision.datasets.vision import StandardTransform

        ds.transforms = StandardTransform(ds.transform, getattr(ds, "target_transform", None))
    return ds


def as_pair(item: Any) -> tuple[Any, Any]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        got = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
        raise UnbatchableError(
            f"dataset[i] returned {got}; gpufeed reads (image, label) pairs, as torchvision datasets give "
            "(fallback='prefetch' collates anything a DataLoader can)"
        )
    return item[0], item[1]


def _decode(item: Any) -> tuple[torch.Tensor, Any, str | None]:
    # Runs in the workers (inside the guard): decode to tensors there, stack in the parent; a PIL image's mode is
    # what the batched ops were built for (gpufeed.pipeline.translate.modes), checked in the parent.
    image, label = as_pair(item)
    return to_chw(image), label, getattr(image, "mode", None) if not isinstance(image, torch.Tensor) else None


def _collate(items: list[Any]) -> list[Any]:
    return items


def _per_sample(
    dataset: Any,
    source: str,
    num_workers: int | None,
    progress: bool,
    ragged: bool | None = False,
    check_mode: Callable[[int, str | None], None] | None = None,
) -> tuple[torch.Tensor | Ragged, torch.Tensor, tuple[tuple[int, str | None], ...]]:
    """Every sample through the dataset's (cached) transform, in DataLoader workers. ``ragged``: images of
    different sizes are kept as they are, in one Ragged buffer (held as a list until the end: the peak is
    twice the store); ``None``: one tensor while the images have one size, a Ragged buffer from the first that
    differs in height and width only (so that one read serves either). ``check_mode(i, mode)``: raises for a
    sample whose PIL mode (None: not a PIL image) the batched ops were not built for. Returns the images, the
    labels and the first sample of each mode met (:attr:`Ingested.modes`)."""
    dataset = Guarded(dataset, source, _decode)
    n = len(dataset)
    workers = default_workers(n) if num_workers is None else num_workers
    loader = DataLoader(dataset, batch_size=64, shuffle=False, collate_fn=_collate, **loader_kwargs(workers))
    from tqdm.auto import tqdm

    images: torch.Tensor | None = None
    parts: list[torch.Tensor] = []
    labels: list[Any] = []
    modes: dict[str | None, int] = {}  # each mode's first sample
    i = 0
    with tqdm(total=n, desc="gpufeed: reading samples", unit="img", disable=not progress) as bar:
        for batch in loader:
            for item in batch:
                if isinstance(item, SampleFailure):
                    raise item.exception()
                image, label, mode = item
                if check_mode is not None:
                    check_mode(i, mode)
                modes.setdefault(mode, i)
                if images is not None and (image.shape != images.shape[1:] or image.dtype != images.dtype):
                    first = tuple(images.shape[1:])
                    sizes_only = image.shape[0] == first[0] and image.dtype == images.dtype
                    if not (ragged is None and sizes_only):
                        message = ragged_message(source, i, tuple(image.shape), image.dtype, first, images.dtype)
                        raise RaggedError(message, sizes_only)
                    parts, images = list(images[:i]), None  # from here on each image is kept as it is
                if parts or ragged:
                    ref = parts[0] if parts else image
                    if image.shape[0] != ref.shape[0] or image.dtype != ref.dtype:
                        shape, dtype = tuple(image.shape), image.dtype
                        raise RaggedError(ragged_message(source, i, shape, dtype, tuple(ref.shape), ref.dtype))
                    parts.append(image)
                else:
                    if images is None:
                        images = torch.empty((n, *image.shape), dtype=image.dtype)
                    images[i] = image
                labels.append(label)
                i += 1
            bar.update(len(batch))
    met = tuple((first, mode) for mode, first in modes.items())
    if parts:
        return Ragged.stack(parts), label_tensor(labels, source), met
    assert images is not None
    return images, label_tensor(labels, source), met


def ingest(
    dataset: Dataset,
    cached: Callable[[Any], Any] | None = None,
    *,
    num_workers: int | None = None,
    progress: bool = True,
    ragged: bool | None = False,
    check_mode: Callable[[int, str | None], None] | None = None,
) -> Ingested:
    """Read every sample of ``dataset`` through ``cached`` (the deterministic part) into two tensors.

    The dataset's own ``transform`` is replaced by ``cached`` on a copy; the caller's dataset is
    not modified. ``ragged``: the images may differ in height and width; they come back as a
    :class:`~gpufeed.store.ragged.Ragged` store, each as it is. ``None``: one tensor if they all have one size,
    else (when they differ in height and width only) a Ragged store, from one read. ``check_mode(i, mode)``: raises
    for a sample of a PIL mode the batched ops were not built for (the probe's: gpufeed.pipeline.probe.Probed).

    Example:
        >>> ds = TensorDataset(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.arange(4))
        >>> r = ingest(ds, progress=False); (tuple(r.images.shape), r.path)
        ((4, 1, 2, 2), 'arrays')
    """
    t0 = time.perf_counter()
    check_dataset(dataset)
    n = len(dataset)  # type: ignore[arg-type]
    source = type(dataset).__name__
    if n == 0:
        raise DataError(f"the dataset ({source}) is empty (len 0); nothing to load")
    stripped = with_transform(dataset, cached)
    arrays = _arrays(dataset) if cached is None and ragged is not True else None
    if arrays is not None and arrays[0].shape[0] == n and _spot_check(stripped, source, arrays[0]):
        return Ingested(arrays[0], arrays[1], "arrays", time.perf_counter() - t0)
    images, labels, modes = _per_sample(stripped, source, num_workers, progress, ragged, check_mode)
    return Ingested(images, labels, "per-sample", time.perf_counter() - t0, modes=modes)


def _spot_check(stripped: Any, source: str, images: torch.Tensor) -> bool:
    """Compare a few array rows with what ``dataset[i]`` returns, to catch a wrong layout guess."""
    if isinstance(stripped, TensorDataset):
        return True
    n = images.shape[0]
    guarded = Guarded(stripped, source, _decode)
    for i in sorted({0, n // 2, n - 1}):
        item = guarded[i]
        if isinstance(item, SampleFailure):
            raise item.exception()
        if not torch.equal(item[0], images[i]):
            warnings.warn(
                f"{type(stripped).__name__}.data does not match dataset[{i}]; reading sample by sample instead "
                "(slower: one Python call per image)",
                stacklevel=3,
            )
            return False
    return True
