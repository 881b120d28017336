"""Persistent cache of the deterministic part of a dataset's transform: ``build_cache`` / ``open_cache``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import CacheError, ConfigError
from .fingerprint import cache_key, default_cache_dir
from .lock import build_lock
from .manage import list_entries, remove_entry
from .reader import Cache, open_cache, verify_cache
from .writer import write_cache

__all__ = [
    "Cache",
    "build_cache",
    "build_lock",
    "default_cache_dir",
    "entry_path",
    "list_entries",
    "load_or_ingest",
    "open_cache",
    "remove_entry",
    "store",
    "verify_cache",
]

_DATASET = object()  # sentinel: use the dataset's own transform


def entry_path(dataset: Any, key: str, root: str | Path | None = None) -> Path:
    """Where the entry for ``key`` lives under ``root`` (default: :func:`default_cache_dir`)."""
    return Path(root or default_cache_dir()) / f"{type(dataset).__name__.lower()}-{key[:20]}"


def build_cache(
    dataset: Any,
    path: str | Path | None = None,
    *,
    transform: Any = _DATASET,
    cache_lambda: bool = False,
    num_workers: int | None = None,
    progress: bool = True,
    root: str | Path | None = None,
) -> Cache:
    """Compute the deterministic part of ``dataset``'s transform once and store it, atomically and verified.

    An existing valid entry with the same key is reused; one with another key, or a damaged one,
    is replaced. Returns the opened :class:`Cache`.

    Args:
        dataset: a map-style dataset (torchvision datasets, ``ImageFolder``, ``TensorDataset``, ...).
        path: the entry's directory; ``None`` puts it under ``root`` (default :func:`default_cache_dir`).
        transform: the full transform; by default ``dataset.transform``. Only its deterministic
            prefix (see :mod:`gpufeed.plan`) is computed and stored.
    """
    from ..plan import split_transform

    split = split_transform(getattr(dataset, "transform", None) if transform is _DATASET else transform, cache_lambda)
    key = cache_key(dataset, split.cached)
    if key is None:
        raise ConfigError(
            f"{type(dataset).__name__} with cached ops {list(split.cached)} cannot be fingerprinted (unknown source "
            "or an opaque transform such as a Lambda), so a cache on disk could later be matched to other data; "
            "use gpufeed.accelerate(..., cache=False) to keep it in memory instead"
        )
    target = Path(path) if path is not None else entry_path(dataset, key, root)
    cache, _ = load_or_ingest(dataset, split, target, key, lambda data: True, num_workers, progress)
    assert cache is not None
    return cache


def load_or_ingest(
    dataset: Any,
    split: Any,
    target: Path,
    key: str,
    persist: Callable[[Any], bool],
    num_workers: int | None = None,
    progress: bool = True,
) -> tuple[Cache | None, Any]:
    """The entry at ``target`` if it is valid and has ``key``; else a fresh ingest, stored when ``persist(data)``.

    Returns ``(cache, data)``: ``(entry, None)`` on a hit, ``(entry, data)`` when just written,
    ``(None, data)`` when not persisted. Runs under the entry's build lock, so concurrent callers
    (one per rank) build once; a damaged entry is rebuilt with a warning.
    """
    from ..ingest import ingest

    with build_lock(target):
        try:
            existing = open_cache(target, verify=True)
            if existing.key == key:
                return existing, None
        except CacheError as e:
            if target.exists():
                warnings.warn(f"rebuilding the cache: {e}", stacklevel=3)
        data = ingest(dataset, split.cached_transform(), num_workers=num_workers, progress=progress)
        return (store(target, key, split, data) if persist(data) else None), data


def store(target: Path, key: str, split: Any, data: Any) -> Cache:
    """Write ingested data (:class:`gpufeed.ingest.Ingested`) as the entry ``target`` and open it, verified."""
    meta = {
        "cached": [repr(op) for op in split.cached],
        "ingest": data.path,
        "ingest_seconds": round(data.seconds, 3),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_cache(target, key, {"images": data.images, "labels": data.labels}, meta)
    return open_cache(target, verify=True)
