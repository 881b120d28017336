"""Checks of what a caller hands a loader: typed errors that name the argument or sample and the fix."""

from __future__ import annotations

import inspect
import numbers
import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from .errors import ConfigError, DataError

__all__ = [
    "Guarded",
    "SampleFailure",
    "UnbatchableError",
    "as_flag",
    "as_batch_size",
    "as_epoch",
    "as_int",
    "as_seed",
    "as_tensor",
    "as_workers",
    "check_dataset",
    "check_epoch",
    "check_images",
    "check_label",
    "check_labels",
    "check_transform",
    "dataset_length",
    "label_tensor",
]

# Workers (processes or threads) per usable core that a caller may ask for: past a few per core they only compete
# for it, and a typo (num_workers=10**6) would start processes until the machine stops.
WORKERS_PER_CORE = 4


class UnbatchableError(DataError):
    """Samples a DataLoader could still collate but gpufeed cannot store as one tensor (their sizes, the
    type of their labels or images, their structure); ``fallback="prefetch"`` runs them per sample."""


def as_flag(value: Any, name: str) -> bool:
    """``value`` if it is a bool (numpy's too); a string such as ``"no"`` or ``"False"`` is an error, not True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{name}={value!r} must be True or False (a {type(value).__name__} is not a flag)")


def as_int(value: Any, name: str, minimum: int | None = None) -> int:
    """``value`` as an int (numpy and torch integers accepted); bools, floats and strings are errors."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.is_floating_point()):
        raise ConfigError(f"{name}={value!r} must be an int")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name}={value!r} must be an int, not a {type(value).__name__}") from None
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name}={number} must be >= {minimum}")
    return number


# NOTE [ Seeds, epochs and batch sizes: one range at every entry ]
# A seed is an int in [0, 2**64): torch.Generator.manual_seed takes that range, and takes a negative seed only by
# wrapping it (-1 is 2**64 - 1's stream), as gpufeed's seed mixing (derive_seed, 64 bits) would too: two spellings
# of one stream. Every entry (DeviceLoader, gf.accelerate, gf.stream, KeyedDraws, the CLI's --seed) refuses what lies
# outside, by this one check. An epoch is an int in [0, 2**63), the int64 torch counts in (a state's epoch=10**30
# would be mixed into the same streams as another epoch). A batch size is an int in [1, 2**63): torch indexes
# samples with int64; a batch larger than the data is served short, as DataLoader's (drop_last=False).
MAX_SEED = 2**64
MAX_EPOCH = 2**63
MAX_BATCH = 2**63


def as_seed(value: Any, name: str = "seed") -> int:
    """A seed (NOTE [ Seeds, epochs and batch sizes: one range at every entry ]): an int in [0, 2**64).

    Example:
        >>> as_seed(2**64 - 1) == 2**64 - 1
        True
    """
    seed = as_int(value, name)
    if not 0 <= seed < MAX_SEED:
        raise ConfigError(
            f"{name}={seed} must be in [0, 2**64): torch.Generator.manual_seed takes a negative seed only by "
            f"wrapping it ({name}=-1 would be the stream of 2**64 - 1); give a seed >= 0"
        )
    return seed


def as_epoch(value: Any, name: str = "epoch") -> int:
    """An epoch (NOTE [ Seeds, epochs and batch sizes: one range at every entry ]): an int in [0, 2**63)."""
    epoch = as_int(value, name)
    if not 0 <= epoch < MAX_EPOCH:
        raise ConfigError(f"{name}={epoch} must be an epoch in [0, 2**63) (the int64 torch counts in)")
    return epoch


def as_batch_size(value: Any, name: str = "batch_size") -> int:
    """A batch size (NOTE [ Seeds, epochs and batch sizes: one range at every entry ]): an int in [1, 2**63)."""
    size = as_int(value, name, 1)
    if size >= MAX_BATCH:
        raise ConfigError(
            f"{name}={size} must be < 2**63: torch indexes samples with int64; a batch larger than the dataset is "
            "served whole (one short batch), so give at most the dataset's size"
        )
    return size


MAX_VIEWS = 64  # views per sample: DINO draws 12; a million is a typo that would run for minutes
MAX_WORLD = 1 << 20  # ranks: well above any cluster, below what a rank table of that size costs to allocate
_ORDER_BYTES = 8  # an epoch's order holds one int64 per sample


def as_views(value: Any) -> int:
    """``views=`` as a count: an int in [1, :data:`MAX_VIEWS`].

    Example:
        >>> as_views(2)
        2
    """
    views = as_int(value, "views", 1)
    if views > MAX_VIEWS:
        raise ConfigError(
            f"views={views:,} draws that many augmented copies of every sample; gpufeed serves at most {MAX_VIEWS} "
            "(DINO's recipe draws 12): pass a smaller count, or one pipeline per view"
        )
    return views


def as_world(rank: Any, world_size: Any) -> tuple[int | None, int | None]:
    """``rank`` and ``world_size`` as given (None: read from torch.distributed later), checked: ints, ``world_size``
    in [1, :data:`MAX_WORLD`], ``rank`` in [0, world_size) when both are given."""
    world = None if world_size is None else as_int(world_size, "world_size", 1)
    if world is not None and world > MAX_WORLD:
        raise ConfigError(f"world_size={world:,} is more ranks than gpufeed shares data to (at most {MAX_WORLD:,})")
    r = None if rank is None else as_int(rank, "rank", 0)
    if r is not None and world is not None and r >= world:
        raise ConfigError(f"rank={r} must be in [0, world_size={world})")
    return r, world


def as_seconds(value: Any, name: str, unbounded: bool = False) -> float | None:
    """A time in seconds: None, or a finite real number >= 0 (a bool, a string, NaN, a negative, and inf unless
    ``unbounded`` (no limit) is an error that names ``name``)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name}={value!r} must be a number of seconds (or None), not a {type(value).__name__}")
    seconds = float(value)
    if np.isnan(seconds) or seconds < 0 or (np.isinf(seconds) and not unbounded):
        limit = " (or inf: no limit)" if unbounded else ""
        raise ConfigError(f"{name}={value!r} must be a finite number of seconds >= 0{limit}")
    return seconds


def check_length(n: Any, what: str) -> int:
    """``len(dataset)``: an int >= 0 whose epoch order (8 bytes a sample) fits this machine's memory; a
    ``__len__`` of 10**12 is an error naming it, not an allocator's failure mid-way."""
    length = as_int(n, f"len({what})", 0)
    import psutil

    total = psutil.virtual_memory().total
    if length * _ORDER_BYTES > total:
        raise ConfigError(
            f"len({what}) = {length:,}: an epoch's order alone would take {length * _ORDER_BYTES / 2**30:,.0f} GiB, "
            f"more than this machine's {total / 2**30:,.0f} GiB; check the dataset's __len__, or stream data of that "
            "size with gf.stream"
        )
    return length


def as_batch_keys(value: Any) -> tuple[str, ...] | None:
    """``accelerate(batch_keys=...)``: None, or one or two distinct non-empty strings (images, then labels).

    Example:
        >>> as_batch_keys(["pixel_values", "labels"])
        ('pixel_values', 'labels')
    """
    if value is None:
        return None
    keys = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
    if keys is None or not 1 <= len(keys) <= 2 or not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(
            f"batch_keys={value!r} must name the batch's parts: two strings (images, labels), such as "
            "('pixel_values', 'labels'), or one for images without labels"
        )
    if len(set(keys)) != len(keys):
        raise ConfigError(f"batch_keys={value!r} names one key twice")
    return keys


def as_workers(value: Any, name: str = "num_workers") -> int:
    """``value`` as a count of workers (an int >= 0), capped at :data:`WORKERS_PER_CORE` per usable core with a
    warning that names the cap.

    Example:
        >>> as_workers(2)
        2
    """
    from .device import usable_cores

    number = as_int(value, name, 0)
    cap = WORKERS_PER_CORE * usable_cores()
    if number > cap:
        warnings.warn(
            f"{name}={number} is more than {WORKERS_PER_CORE} per usable core ({usable_cores()} cores here): "
            f"using {cap}; more would only compete for the cores (pass {name} <= {cap} to silence this)",
            stacklevel=3,
        )
        return cap
    return number


def check_epoch(
    n: int, batch_size: int, drop_last: bool, world_size: int = 1, even: bool | str = True, local: bool = False
) -> None:
    """An epoch of zero batches (``drop_last`` with ``batch_size`` over the samples) is an error, not a silent no-op.

    Under ``even=False`` (evaluation) a rank may have no batch while others do; only an epoch with
    no batch on any rank is refused.
    """
    if not drop_last:
        return
    if not even:
        batches = n // batch_size
    else:  # every rank the same number of full batches
        batches = (n // world_size) // batch_size if local else (n // batch_size) // world_size
    if batches == 0:
        across = f" across {world_size} ranks (each rank needs a full batch)" if world_size > 1 and even else ""
        largest = n // world_size if world_size > 1 and even else n
        raise ConfigError(
            f"batch_size={batch_size} with drop_last=True gives an epoch of zero batches: {n} samples{across}; "
            f"use batch_size <= {largest} or drop_last=False"
        )


def check_dataset(dataset: Any) -> None:
    """A map-style dataset (``len()`` and ``[i]``), or a DataError that says what to pass instead."""
    map_style = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    if isinstance(dataset, IterableDataset) or not map_style or isinstance(dataset, (str, bytes)):
        raise DataError(
            f"dataset is a {type(dataset).__name__}, not a map-style dataset with len() and [i]; gpufeed reads "
            "torchvision datasets, TensorDataset or any class with __len__ and __getitem__ returning (image, label). "
            "For an iterable or generator, collect it (a list of pairs) or keep your DataLoader and use "
            "gpufeed.prefetch(loader)"
        )
    dataset_length(dataset)


def dataset_length(dataset: Any) -> int:
    """``len(dataset)``; a ``__len__`` that returns no count (2.5, -1, None) is a DataError that names it."""
    try:
        return len(dataset)
    except (TypeError, ValueError, OverflowError) as e:  # what len() raises for a float, a negative or a huge value
        try:
            got = type(dataset).__len__(dataset)
        except Exception:
            raise e from None  # __len__ itself raised: the user's own error, as it was
        raise DataError(
            f"len(dataset) is {got!r} ({type(dataset).__name__}.__len__ returned a {type(got).__name__}): __len__ "
            "must return the number of samples, an int >= 0; fix the dataset's __len__"
        ) from None


def label_tensor(labels: Sequence[Any] | np.ndarray | torch.Tensor, source: str) -> torch.Tensor:
    """Labels as a tensor (integers as int64); ``None``, strings or ragged labels name the first bad sample."""
    if labels is None or isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
        raise DataError(
            f"{source} is {labels!r}; labels must be a tensor, array or list with one label per image (for images "
            "without labels, pass placeholders such as torch.zeros(len(images), dtype=torch.long))"
        )
    if isinstance(labels, torch.Tensor):
        check_not_meta(labels, source)
        t = labels
    else:
        array = None
        try:
            array = np.asarray(labels)
        except ValueError:  # ragged: numpy refuses to build the array
            pass
        if array is None or array.dtype.kind not in "biuf":
            for i, label in enumerate(labels):
                check_label(label, source, i)
            raise UnbatchableError(f"the labels of {source} have different shapes; every label must have one shape")
        t = torch.from_numpy(np.ascontiguousarray(array))
    return t if t.is_floating_point() else t.long()  # bool class labels too, as before


def check_label(label: Any, source: str, i: int) -> None:
    """A label gpufeed can hold in a tensor: a number or a numeric array, else an error naming the sample."""
    if not _is_number(label):
        raise UnbatchableError(
            f"{source}[{i}] has label {label!r} ({type(label).__name__}); labels must be class indices (int) or "
            "numeric targets of one shape: map names to indices (e.g. with a target_transform), or pass "
            "fallback='prefetch' to collate them as a DataLoader does"
        )


def _is_number(label: Any) -> bool:
    if isinstance(label, (torch.Tensor, np.ndarray)):
        return label.dtype != object and (label.dtype.kind in "biuf" if isinstance(label, np.ndarray) else True)
    return isinstance(label, numbers.Number)


@dataclass(frozen=True)
class SampleFailure:
    """What ``dataset[i]`` raised, carried in place of the sample (picklable: it crosses DataLoader workers)."""

    index: int
    source: str
    error: str
    length: int
    index_error: bool
    file: str | None = None  # the file the sample comes from, when the dataset lists them

    def exception(self) -> DataError:
        hint = (
            f" (len() says {self.length} samples: does __len__ count samples __getitem__ cannot serve?)"
            if self.index_error
            else ""
        )
        return DataError(
            f"{self.source}[{self.index}]{f' ({self.file})' if self.file else ''} raised {self.error}{hint}; the error "
            "comes from reading that sample or "
            "from its transform: fix the one or the other"
        )


class Guarded(Dataset):
    """``convert(dataset[i])``, or a :class:`SampleFailure` naming ``i`` and ``source`` where that raised.

    ``convert`` (a module-level function, so workers can unpickle it) runs inside the guard too.
    """

    def __init__(self, dataset: Any, source: str, convert: Callable[[Any], Any] | None = None) -> None:
        self.dataset, self.source, self.length, self.convert = dataset, source, len(dataset), convert

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        try:
            item = self.dataset[i]
            return item if self.convert is None else self.convert(item)
        except Exception as e:  # any failure of the user's code is reported with its sample (and file)
            samples = getattr(self.dataset, "samples", None)  # ImageFolder and friends: the file it read
            known = isinstance(samples, list) and 0 <= i < len(samples) and isinstance(samples[i], (tuple, list))
            file = str(samples[i][0]) if known else None  # type: ignore[index]
            error = f"{type(e).__name__}: {e}"
            return SampleFailure(i, self.source, error, self.length, isinstance(e, IndexError), file)


def check_not_meta(value: Any, name: str) -> None:
    """A meta tensor (``torch.device("meta")``) has a shape and no data: nothing a loader can serve."""
    if isinstance(value, torch.Tensor) and value.is_meta:
        raise DataError(
            f"{name} is a meta tensor (shape {tuple(value.shape)}, no data): build it on the CPU or a GPU, or load "
            "its values (tensor.to_empty(device=...), then fill it) before giving it to gpufeed"
        )


def as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        check_not_meta(value, name)
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (list, tuple)):
        return torch.as_tensor(value)
    raise DataError(f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}")


def check_images(images: torch.Tensor) -> None:
    """Shape, dtype and finiteness of an image tensor; floats outside [0, 1] get a one-time warning."""
    if images.dim() != 4:
        fix = "; add the channel axis with images.unsqueeze(1)" if images.dim() == 3 else ""
        raise DataError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}{fix}")
    if images.shape[0] == 0:
        raise DataError("images is empty (N=0); a loader needs at least one sample")
    if 0 in images.shape[1:]:  # would be served as batches of empty images, silently
        axis = ("channels", "height", "width")[list(images.shape[1:]).index(0)]
        raise DataError(
            f"images has shape {tuple(images.shape)} (N, C, H, W): a {axis} of 0; every image needs at least one "
            "channel and one pixel: check how the images were read or cropped"
        )
    if images.dtype != torch.uint8 and not images.dtype.is_floating_point:
        raise DataError(f"images has dtype={images.dtype}; use uint8 (preferred: 4x smaller) or a floating dtype")
    if images.dtype.is_floating_point:
        step = 4096  # in slices, so a memory-mapped array is not materialised at once
        low, high = float("inf"), float("-inf")
        for start in range(0, images.shape[0], step):
            part = images[start : start + step]
            bad = ~torch.isfinite(part).flatten(1).all(dim=1)
            if bool(bad.any()):
                first = start + int(bad.nonzero()[0, 0])
                raise DataError(f"images[{first}] contains NaN or inf; clean the data or drop the sample")
            low, high = min(low, float(part.min())), max(high, float(part.max()))
        if low < 0 or high > 1:
            warnings.warn(
                f"float images hold values in [{low:g}, {high:g}], but float images are expected in [0, 1] (as "
                "ToTensor gives): Normalize, ColorJitter and the fill of crops assume that range. Divide by 255 (or "
                "pass the uint8 images, 4x smaller) unless the data is already normalised on purpose",
                stacklevel=3,
            )


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
    if num_classes is None:  # any integers, as a DataLoader serves them (-100: CrossEntropyLoss's ignore_index)
        return
    bad = ((labels < 0) | (labels >= num_classes)).reshape(n, -1).any(dim=1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        limit = f"[0, {num_classes})"
        raise DataError(
            f"labels[{i}]={labels[i].tolist()} is out of range {limit}: num_classes={num_classes} says labels are "
            f"class indices in {limit}; fix the label, or give num_classes=None for labels that are not"
        )


def check_transform(transform: Callable[..., Any]) -> None:
    if not callable(transform):
        raise ConfigError(f"transform={transform!r} is not callable")
    if type(transform).__module__.startswith(("torchvision.transforms", "timm.data")):
        raise ConfigError(
            f"transform={type(transform).__name__}(...) is a per-sample {type(transform).__module__.split('.')[0]} "
            "transform; DeviceLoader calls transform(batch, generator=g) on whole batches. Use gpufeed.augment's "
            "ops (A.Compose([...])), or give the dataset with this transform to gf.accelerate, which converts it"
        )
    # an nn.Module's __call__ takes anything: its forward says what it takes
    target = transform.forward if isinstance(transform, torch.nn.Module) else transform
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call itself speak
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "generator" not in params and not takes_kwargs:
        raise ConfigError(
            f"transform={transform!r} does not accept generator=; DeviceLoader calls transform(batch, generator=g) "
            "on whole batches. Use gpufeed.augment ops, or add a generator keyword to your callable"
        )
