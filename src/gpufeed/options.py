"""The arguments of :func:`gpufeed.accelerate` and the loaders, checked once, in one place.

Two frozen records, each checking itself as it is made (a bad argument must not cost a read of the dataset):

- :class:`BatchOptions`: what every loader takes (:class:`~gpufeed.DeviceLoader`, the per-sample
  :class:`~gpufeed.FallbackLoader`, and ``accelerate``, which hands them on): the batches, their order and
  their share per rank.
- :class:`ReadOptions`: how ``accelerate`` reads and keeps the data (cache, store, workers, fallback, ...).

Example:
    >>> BatchOptions(batch_size=64, even="pad").even
    'pad'
    >>> ReadOptions(store="jpeg", cache="~/scratch").cache.name
    'scratch'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError
from .sampling import Even, as_even
from .validate import as_batch_size, as_flag, as_int, as_seconds, as_seed, as_workers, as_world

__all__ = ["FALLBACKS", "ON_ERROR", "SHARD_MODES", "STORES", "BatchOptions", "ReadOptions", "cache_option"]

STORES = ("auto", "pixels", "jpeg")
ON_ERROR = ("error", "skip")
FALLBACKS = ("error", "prefetch")
SHARD_MODES = ("full", "local")


@dataclass(frozen=True)
class BatchOptions:
    """What fixes a loader's batches, checked: sizes and flags of the right type, ``even`` and ``shard`` among
    their modes, ``dtype`` one a batch can have. ``rank``/``world_size`` stay as given (``None``: read from
    ``torch.distributed`` when the loader is made)."""

    batch_size: int = 256
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 0
    dtype: torch.dtype | None = None
    channels_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    even: Even = True
    shard: str = "full"

    def __post_init__(self) -> None:
        drop_last = as_flag(self.drop_last, "drop_last")
        if self.shard not in SHARD_MODES:
            raise ConfigError(f"shard={self.shard!r} must be one of {SHARD_MODES}")
        rank, world_size = as_world(self.rank, self.world_size)
        checked: dict[str, Any] = {
            "rank": rank,
            "world_size": world_size,
            "batch_size": as_batch_size(self.batch_size),
            "seed": as_seed(self.seed),
            "shuffle": as_flag(self.shuffle, "shuffle"),
            "drop_last": drop_last,
            "channels_last": as_flag(self.channels_last, "channels_last"),
            "even": as_even(self.even, drop_last, self.shard),
        }
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):  # "float32" has no .is_floating_point
            raise ConfigError(f"dtype={self.dtype!r} must be a torch.dtype (e.g. torch.float32), torch.uint8 or None")
        if self.dtype is not None and self.dtype != torch.uint8 and not self.dtype.is_floating_point:
            raise ConfigError(f"dtype={self.dtype} must be None, torch.uint8 or a floating dtype")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def explicit_world(self) -> bool:
        """Both ``rank`` and ``world_size`` given (checked against a process group that says otherwise)."""
        return self.rank is not None and self.world_size is not None


@dataclass(frozen=True)
class ReadOptions:
    """How :func:`gpufeed.accelerate` reads the dataset and keeps it.

    Attributes:
        cache: ``"auto"`` stores the computed prefix on disk when it was expensive to compute (read sample by
            sample) or when the data must be memory-mapped; ``True`` always, ``False`` never; a path is the cache
            root to use (``~`` expanded; default ``$GPUFEED_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpufeed``). A
            cache on disk is built by one process per node; the others wait for it and reuse it. A cache that
            cannot be written (disk full, read-only) is not an error: the data stays in memory, with one warning.
        store: for images of different sizes (a folder of photos) with a recipe that starts with
            RandomResizedCrop: ``"pixels"`` decodes every image once and keeps the pixels (fast, large),
            ``"jpeg"`` keeps the files' bytes and decodes each batch (compact; an ``ImageFolder``,
            ``DatasetFolder`` or ``Food101`` read by torchvision's PIL loader), ``"auto"`` the pixels when they
            fit ``memory_budget``, else the bytes.
        max_side: downscale the pixel store's images whose longer side exceeds it, once, as they are decoded
            (torchvision's ``Resize(size=None, max_size=max_side)``, antialiased): a change to what the model
            sees, stated in ``loader.plan``; off by default.
        fallback: ``"error"`` (default) raises for an op gpufeed cannot batch or images of different sizes;
            ``"prefetch"`` runs the original per-sample pipeline, unchanged, in DataLoader workers behind
            :func:`gpufeed.prefetch` (with a warning), for anything a ``DataLoader`` could run.
        on_error: files of a folder that cannot be read or decoded (truncated, garbled, a header that claims
            more than the file holds) are all found while the store is built: ``"error"`` (default) names every
            one in one DataError; ``"skip"`` leaves them out, with one warning that lists them and a line in
            ``loader.plan`` (labels stay with their images).
        cache_lambda: treat ``Lambda`` ops in the deterministic prefix as deterministic.
        num_workers: workers for reading sample by sample (and the fallback); default from the cores, at most
            4 per core.
        progress: show progress bars while the data is read.
        lock_timeout: seconds to wait while another process builds the same cache entry (default
            ``$GPUFEED_LOCK_TIMEOUT``, else an hour); then a CacheError names that process.
        memory_budget: bytes the stored data may take on the device (default: half its free memory; on the CPU
            half the host's available memory).
    """

    cache: bool | str | Path = "auto"
    store: str = "auto"
    max_side: int | None = None
    fallback: str = "error"
    on_error: str = "error"
    cache_lambda: bool = False
    num_workers: int | None = None
    progress: bool = True
    lock_timeout: float | None = None
    memory_budget: int | None = None

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ConfigError(f"store={self.store!r} must be one of {STORES}")
        max_side = None if self.max_side is None else as_int(self.max_side, "max_side", 1)
        if max_side is not None and self.store == "jpeg":
            raise ConfigError(
                "max_side shrinks a pixel store as it is decoded; store='jpeg' keeps the files as they are"
            )
        if self.fallback not in FALLBACKS:
            raise ConfigError(f"fallback={self.fallback!r} must be 'error' or 'prefetch'")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error={self.on_error!r} must be one of {ON_ERROR}")
        budget = self.memory_budget
        checked = {
            "max_side": max_side,
            "cache": cache_option(self.cache),
            "memory_budget": None if budget is None else as_int(budget, "memory_budget (bytes)", 0),
            "num_workers": None if self.num_workers is None else as_workers(self.num_workers),
            "cache_lambda": as_flag(self.cache_lambda, "cache_lambda"),
            "progress": as_flag(self.progress, "progress"),
            "lock_timeout": as_seconds(self.lock_timeout, "lock_timeout", unbounded=True),  # inf: no limit
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)


_FLAG_WORDS = {"", "no", "false", "off", "none", "0", "yes", "true", "on", "1"}


def cache_option(cache: Any) -> bool | str | Path:
    """``True``, ``False``, ``"auto"``, or a cache root directory (``~`` expanded); anything else is an error."""
    if isinstance(cache, bool) or cache == "auto":
        return cache
    if not isinstance(cache, (str, os.PathLike)):
        raise ConfigError(f"cache={cache!r} must be True, False, 'auto' or a directory (the cache root)")
    if str(cache).strip().lower() in _FLAG_WORDS:
        raise ConfigError(f"cache={cache!r} reads as a flag, not a directory: pass cache=True, False or 'auto'")
    root = Path(cache).expanduser()
    try:
        is_file = root.exists() and not root.is_dir()
    except OSError:  # under a directory this process may not enter (or a loop of links): a location that cannot be
        return root  # written, which the write names (CacheWriteError): accelerate keeps the data in memory then
    if is_file:
        raise ConfigError(f"cache={str(cache)!r} is a file; pass a directory, the root gpufeed's entries go under")
    return root
