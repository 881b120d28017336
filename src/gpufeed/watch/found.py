"""What a ``DataLoader`` is, as the record shows it: its dataset, its transform, its sampler, the call that built it.

Example:
    >>> import torch
    >>> from torch.utils.data import Subset, TensorDataset
    >>> dataset_name(Subset(TensorDataset(torch.zeros(4)), [0, 1])), transform_text(TensorDataset(torch.zeros(4)))
    ('Subset of TensorDataset', None)
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from types import FrameType
from typing import Any

from .record import LoaderRecord

__all__ = ["batch_samples", "dataset_name", "loader_record", "transform_text", "where_built"]

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
            return re.sub(r"\s*\n\s*", " ", repr(transform))[:2000]
        dataset = getattr(dataset, "dataset", None)  # through Subset and wrappers
        if dataset is None:
            return None
    return None


def where_built(
    frame: FrameType | None, sources: dict[str, ast.AST | None], notes: list[str], loader: Any = None
) -> tuple[str | None, str | None]:
    """``("train.py:42", "DataLoader(ds, batch_size=8)")``: the first frame outside the libraries and outside
    ``loader``'s own ``__init__`` (a script's subclass calling ``super().__init__(...)``), and its call."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", "")).split(".")[0]
        own_init = loader is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is loader
        if module not in _LIBRARIES and not own_init:
            break
        frame = frame.f_back
    if frame is None:
        return None, None
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
    return f"{shown}:{line}", source


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


def loader_record(loader: Any, id: int, built_at: str | None, source: str | None) -> LoaderRecord:
    """A new loader's record: its configuration as found on it (no batches yet)."""
    batch_size = loader.batch_size
    if batch_size is None:
        batch_size = getattr(loader.batch_sampler, "batch_size", None)
    return LoaderRecord(
        id=id,
        cls=type(loader).__name__,
        built_at=built_at,
        source=source,
        dataset=dataset_name(loader.dataset),
        transform=transform_text(loader.dataset),
        batch_size=batch_size,
        num_workers=int(loader.num_workers),
        pin_memory=bool(loader.pin_memory),
        persistent_workers=bool(loader.persistent_workers),
        prefetch_factor=loader.prefetch_factor,
        sampler=type(_order_sampler(loader)).__name__,
        drop_last=bool(loader.drop_last),
        init_of=_init_of(type(loader)),
    )


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


def _order_sampler(loader: Any) -> Any:
    """The sampler that orders the batches: a ``batch_sampler=`` (Accelerate's shards wrap the script's) is followed
    down to the sampler it batches; a plain loader's is its ``sampler``."""
    batches = loader.batch_sampler
    for _ in range(4):  # a wrapper of a wrapper (BatchSamplerShard over BatchSampler), never a loop
        inner = getattr(batches, "batch_sampler", None)
        if inner is None:
            break
        batches = inner
    return getattr(batches, "sampler", None) or loader.sampler


def _init_of(cls: type) -> str:
    """The class whose ``__init__`` took the call's arguments, as ``module.QualName``: a subclass's own, or
    DataLoader's (the patched ``__init__`` of DataLoader or StatefulDataLoader is defined on them). Qualified: a
    library's subclass may be called ``DataLoader`` too (torch_geometric's, with its own arguments)."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return f"{klass.__module__}.{klass.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"
