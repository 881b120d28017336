"""What a ``DataLoader`` is, as the record shows it: its dataset, its transform, its sampler, the call that built it.

Example:
    >>> import torch
    >>> from torch.utils.data import Subset, TensorDataset
    >>> dataset_name(Subset(TensorDataset(torch.zeros(4)), [0, 1])), transform_text(TensorDataset(torch.zeros(4)))
    ('Subset of TensorDataset', None)
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import re
import sysconfig
import types
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .record import LoaderRecord
from .unpacked import unpacked_at

__all__ = [
    "Built",
    "batch_samples",
    "batch_size_of",
    "dataset_name",
    "drop_last_of",
    "loader_record",
    "loader_settings",
    "order_sampler",
    "transform_text",
    "where_built",
]

# the frames skipped to find the line of the script that built a loader
_LIBRARIES = {"torch", "torchdata", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "gpufeed"}
_LIBRARIES.add("_gpufeed_watch")  # the hook's own frames, loaded under its private package name


def dataset_name(dataset: Any) -> str:
    """The dataset's class name, through ``Subset``: ``"Subset of ImageFolder"``."""
    inner = getattr(dataset, "dataset", None)
    if type(dataset).__name__ == "Subset" and inner is not None:
        return f"Subset of {dataset_name(inner)}"
    return type(dataset).__name__


def transform_text(dataset: Any) -> str | None:
    """The repr of the dataset's ``transform`` on one line (through ``Subset`` and wrappers), None without one."""
    for _ in range(4):
        transform = getattr(dataset, "transform", None)
        if transform is not None:
            return re.sub(r"\s*\n\s*", " ", _repr(transform))[:2000]
        dataset = getattr(dataset, "dataset", None)  # through Subset and wrappers
        if dataset is None:
            return None
    return None


def _repr(transform: Any) -> str:
    """The transform's repr; an object of the script's own without one (torchvision's classification presets) as
    the transforms it holds: ``ClassificationPresetTrain holding transforms=Compose(...)``."""
    text = repr(transform)
    if not re.fullmatch(r"<[\w.]+ object at 0x[0-9a-fA-F]+>", text):
        return text
    held = [
        (k, v)
        for k, v in getattr(transform, "__dict__", {}).items()
        if type(v).__module__.startswith(("torchvision.transforms", "timm.data"))
    ]
    if not held:
        return text
    return f"{type(transform).__qualname__} holding " + ", ".join(f"{k}={v!r}" for k, v in held)


@dataclass
class Built:
    """Where a loader was built: the script's line (``train.py:42``), the source of its call there, the file's
    absolute path, and the library function that line called when the loader was made inside one
    (``timm.data.loader.create_loader``; None when the script called the loader's class itself)."""

    at: str | None = None
    source: str | None = None
    file: str | None = None
    by: str | None = None
    frame: FrameType | None = field(default=None, repr=False)  # the script's frame (its names); not recorded


def where_built(
    frame: FrameType | None, sources: dict[str, ast.AST | None], notes: list[str], loader: Any = None
) -> Built:
    """The first frame of the user's own code: outside torch, gpufeed and the hook, outside installed packages
    (site-packages, the standard library: timm's ``create_loader``, a Trainer's ``get_train_dataloader``) and
    outside ``loader``'s own ``__init__`` (a script's subclass calling ``super().__init__(...)``); with its call."""
    by = None
    while frame is not None:
        own_init = loader is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is loader
        module = str(frame.f_globals.get("__name__", ""))
        if not own_init and module.split(".")[0] not in _LIBRARIES and not _installed(frame.f_code.co_filename):
            break
        if not own_init and module.split(".")[0] not in _OWN:
            by = f"{module}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"  # the outermost one
        frame = frame.f_back
    if frame is None:
        return Built(by=by)
    filename, line = frame.f_code.co_filename, frame.f_lineno
    source = None
    try:
        source, line = _call_source(sources, frame, filename, line)
    except Exception as e:  # noqa: BLE001 - no source: the report shows no diff
        notes.append(f"the source of a DataLoader's call: {type(e).__name__}: {e}")
    try:
        shown = os.path.relpath(filename)
        shown = filename if shown.startswith("..") else shown
    except ValueError:
        shown = filename
    file = os.path.abspath(filename) if not filename.startswith("<") else None
    return Built(f"{shown}:{line}", source, file, by, frame)


_OWN = {"torch", "gpufeed", "_gpufeed_watch"}  # the loader's own machinery: never "the library that built it"


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths}
    return tuple(sorted(r + os.sep for r in roots))


@functools.cache
def _installed(filename: str) -> bool:
    """Whether ``filename`` belongs to an installed package or the standard library, not to the user's code."""
    if filename.startswith("<frozen"):
        return True
    if filename.startswith("<"):  # python -c, the REPL: the user's own
        return False
    real = os.path.realpath(filename)
    parts = real.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or real.startswith(_installed_roots())


def _call_source(
    sources: dict[str, ast.AST | None], frame: FrameType, filename: str, line: int
) -> tuple[str | None, int]:
    """The whole Call node running in ``frame`` (found by the instruction's position), and its first line."""
    if filename not in sources:
        text = "".join(linecache.getlines(filename))
        sources[filename] = ast.parse(text) if text else None
    tree = sources[filename]
    if tree is None:
        return None, line
    positions = list(frame.f_code.co_positions())
    here = positions[frame.f_lasti // 2] if frame.f_lasti // 2 < len(positions) else (None, None, None, None)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    exact = [n for n in calls if (n.lineno, n.end_lineno, n.col_offset, n.end_col_offset) == tuple(here)]
    if not exact:  # the smallest call on that line
        exact = sorted(calls, key=lambda n: ((n.end_lineno or n.lineno) - n.lineno, -n.col_offset))[:1]
    if not exact:
        return None, line
    text = "".join(linecache.getlines(filename))
    return ast.get_source_segment(text, exact[0]), exact[0].lineno


def loader_record(
    loader: Any, id: int, built: Built, received: tuple[tuple[Any, ...], dict[str, Any]] | None = None
) -> LoaderRecord:
    """A new loader's record: its configuration as found on it (no batches yet), and what the call's ``*args`` /
    ``**kwargs`` held (read in the script's frame; ``received``: the arguments its ``__init__`` got, which are the
    call's own when the script called DataLoader's ``__init__`` itself). A gpufeed loader (the fixed script of
    ``gpufeed diagnose --verify``) has no DataLoader settings: its own are recorded."""
    config = getattr(loader, "config", None)
    if not hasattr(loader, "num_workers") and config is not None:  # gpufeed's EpochLoader
        plan = getattr(loader, "plan", None)
        return LoaderRecord(
            id, type(loader).__name__, built.at, built.source, f"gpufeed ({getattr(plan, 'storage', '?')})", None,
            config.batch_size, int(getattr(plan, "workers", 0) or 0), False, False, None,
            "gpufeed order" + (" (shuffled)" if config.shuffle else ""), bool(config.drop_last),
            init_of=_init_of(type(loader)), shuffle=bool(config.shuffle), built_by=built.by, file=built.file,
        )  # fmt: skip
    batch_size = batch_size_of(loader)
    order = order_sampler(loader)
    init_of = _init_of(type(loader))
    direct = built.by is None and init_of in _DATALOADER_INITS  # the call's arguments are what __init__ received
    return LoaderRecord(
        id=id,
        cls=type(loader).__name__,
        built_at=built.at,
        source=built.source,
        dataset=dataset_name(loader.dataset),
        transform=transform_text(loader.dataset),
        batch_size=batch_size,
        num_workers=int(loader.num_workers),
        pin_memory=bool(loader.pin_memory),
        persistent_workers=bool(loader.persistent_workers),
        prefetch_factor=loader.prefetch_factor,
        sampler=type(order).__name__,
        drop_last=drop_last_of(loader),
        init_of=init_of,
        shuffle=_shuffles(order),
        batch_sampler=None if _auto_batched(loader) else type(loader.batch_sampler).__name__,
        collate_fn=_collate_name(loader.collate_fn),
        built_by=built.by,
        file=built.file,
        unpacked=unpacked_at(built.frame, built.source, received if direct else None),
    )


_DATALOADER_INITS = (
    "torch.utils.data.dataloader.DataLoader",
    "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader",
)


def _shuffles(sampler: Any) -> bool | None:
    """Whether the order is shuffled: a RandomSampler does, a SequentialSampler does not, a DistributedSampler as
    its ``shuffle`` says; None for any other sampler (its own order)."""
    name = type(sampler).__name__
    if name == "RandomSampler":
        return True
    if name == "SequentialSampler":
        return False
    shuffle = getattr(sampler, "shuffle", None)
    return shuffle if isinstance(shuffle, bool) and name == "DistributedSampler" else None


def _auto_batched(loader: Any) -> bool:
    """Whether the DataLoader made its batch sampler itself from ``batch_size`` (no ``batch_sampler=`` given);
    a wrapper's (Accelerate's shard) is followed to the one it wraps."""
    return loader.batch_size is not None or type(_batch_samplers(loader)[-1]).__name__ == "BatchSampler"


def _collate_name(fn: Any) -> str | None:
    """None for torch's default collate (what gf.accelerate's batches are), else the function's name."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    module = getattr(fn, "__module__", "") or ""
    if name == "default_collate" and module.startswith("torch.utils.data"):
        return None
    return f"{module}.{name}" if module else name


def batch_samples(data: Any, tensor: Any) -> int:
    """The first dimension of the first tensor in a batch (a tensor, or nested tuples, lists and dicts)."""
    for _ in range(4):
        if isinstance(data, tensor):
            return int(data.shape[0]) if data.dim() else 0
        if isinstance(data, (list, tuple)) and data:
            data = data[0]
        elif isinstance(data, dict) and data:
            data = next(iter(data.values()))
        else:
            return 0
    return 0


def _batch_samplers(loader: Any) -> list[Any]:
    """The loader's batch sampler and those it wraps, outermost first: Accelerate's ``SkipBatchSampler`` over its
    ``BatchSamplerShard`` over the script's ``BatchSampler`` (a wrapper of a wrapper, never a loop: 4 at most)."""
    found = [getattr(loader, "batch_sampler", None)]
    for _ in range(4):
        inner = getattr(found[-1], "batch_sampler", None)
        if inner is None:
            break
        found.append(inner)
    return found


def order_sampler(loader: Any) -> Any:
    """The sampler that orders the batches: a ``batch_sampler=`` (Accelerate's shards wrap the script's) is followed
    down to the sampler it batches; a plain loader's is its ``sampler``.

    Example:
        >>> import torch
        >>> from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset
        >>> ds = TensorDataset(torch.zeros(8))
        >>> type(order_sampler(DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), 4, False)))).__name__
        'RandomSampler'
    """
    return getattr(_batch_samplers(loader)[-1], "sampler", None) or loader.sampler


def batch_size_of(loader: Any) -> int | None:
    """The samples in each batch this process gets: the loader's ``batch_size``, or, with a ``batch_sampler=``
    (Accelerate's prepared loaders have ``batch_size=None``), the batch sampler's, through the wrappers that keep it
    (``SkipBatchSampler``) and divided by the processes a ``BatchSamplerShard`` with ``split_batches=True`` shares
    each batch with. None when no batch sampler says (one of the script's own that makes batches of any size).

    Example:
        >>> import torch
        >>> from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
        >>> ds = TensorDataset(torch.zeros(8))
        >>> batch_size_of(DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, False)))
        4
    """
    if getattr(loader, "batch_size", None) is not None:
        return int(loader.batch_size)
    split = 1
    for sampler in _batch_samplers(loader):
        if getattr(sampler, "split_batches", False) is True:
            split *= int(getattr(sampler, "num_processes", 1) or 1)
        size = getattr(sampler, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return max(1, size // split)
    return None


def drop_last_of(loader: Any) -> bool:
    """Whether the ragged last batch is dropped: the loader's ``drop_last``, or its batch sampler's (a DataLoader
    given a ``batch_sampler=`` keeps ``drop_last=False`` whatever that sampler does)."""
    if getattr(loader, "batch_size", None) is not None:
        return bool(loader.drop_last)
    return any(getattr(sampler, "drop_last", False) is True for sampler in _batch_samplers(loader))


def _init_of(cls: type) -> str:
    """The class whose ``__init__`` took the call's arguments, as ``module.QualName``: a subclass's own, or
    DataLoader's (the patched ``__init__`` of DataLoader or StatefulDataLoader is defined on them). Qualified: a
    library's subclass may be called ``DataLoader`` too (torch_geometric's, with its own arguments)."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return f"{klass.__module__}.{klass.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


_SETTINGS = (
    "dataset", "batch_size", "batch_sampler", "num_workers", "sampler", "pin_memory", "drop_last", "collate_fn",
    "timeout", "prefetch_factor", "persistent_workers", "worker_init_fn", "multiprocessing_context",
)  # fmt: skip


def loader_settings(loader: Any) -> Any:
    """A DataLoader's dataset and settings as the side measurement reads them when the loader itself is gone (None
    for gpufeed's loaders)."""
    if not hasattr(loader, "num_workers"):
        return None
    return types.SimpleNamespace(**{name: getattr(loader, name, None) for name in _SETTINGS})
