"""Filling the cache from a dataset: ``build_cache``, and the open-or-build that ``accelerate`` uses.

The entry holds the deterministic part of a dataset's transform, computed once by
:mod:`gpufeed.read.samples` and stored by :mod:`gpufeed.cache` (pure storage).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ..cache import Cache, Manifest, check_target, entry_path, is_gpufeed_entry, open_cache, write_cache
from ..cache.lock import build_lock
from ..cache.lock import lock_timeout as resolve_lock_timeout
from ..errors import CacheError, CacheWriteError, ConfigError
from ..read.fingerprint import cache_key

__all__ = ["build_cache", "check_outside_dataset", "load_or_ingest", "store"]

_DATASET = object()  # sentinel: use the dataset's own transform


_RGB = (torch.uint8, (64, 64), True)  # a folder's files as the RGB PIL images torchvision's loader gives


def build_cache(
    dataset: Any,
    path: str | Path | None = None,
    *,
    transform: Any = _DATASET,
    cache_lambda: bool = False,
    num_workers: int | None = None,
    progress: bool = True,
    root: str | Path | None = None,
    lock_timeout: float | None = None,
) -> Cache:
    """Compute the deterministic part of ``dataset``'s transform once and store it, atomically and verified.

    An existing valid entry with the same key is reused; a gpufeed entry with another key, or a
    damaged one, is replaced (with a warning). A path that exists but is not a gpufeed entry (your
    dataset folder, an empty directory, a file) is refused with a CacheError and left untouched.
    Returns the opened :class:`Cache`.

    Args:
        dataset: a map-style dataset (torchvision datasets, ``ImageFolder``, ``TensorDataset``, ...).
        path: the entry's directory (created; must not exist yet unless it is a gpufeed entry);
            ``None`` puts it under ``root`` (default :func:`default_cache_dir`).
        transform: the full transform; by default ``dataset.transform``. Only its deterministic
            prefix (see :mod:`gpufeed.pipeline.translate`) is computed and stored.
        lock_timeout: seconds to wait while another process builds the same entry (default
            ``$GPUFEED_LOCK_TIMEOUT``, else an hour); then a CacheError names that process.

    Raises:
        CacheError: ``path`` is not a gpufeed entry, or the lock wait timed out.
        CacheWriteError: the disk is full or the location not writable (nothing partial is left).
    """
    from ..read.wrappers import unwrap
    from ..validate import as_workers, check_dataset
    from .translate import split_transform

    check_dataset(dataset)
    num_workers = None if num_workers is None else as_workers(num_workers)  # a typo must not start 10**6 workers
    # a Subset / ConcatDataset: the samples and transform of what it wraps (transform= replaces its transforms)
    dataset = unwrap(dataset, own_transforms=transform is _DATASET)
    split = split_transform(getattr(dataset, "transform", None) if transform is _DATASET else transform, cache_lambda)
    key = cache_key(dataset, split.cached)
    if key is None:
        raise ConfigError(
            f"{type(dataset).__name__} with cached ops {list(split.cached)} cannot be fingerprinted (unknown source "
            "or an opaque transform such as a Lambda), so a cache on disk could later be matched to other data; "
            "use gpufeed.accelerate(..., cache=False) to keep it in memory instead"
        )
    from ..read.files import file_samples
    from .materialise import describe_source, takes_ragged
    from .translate import build_batched

    if not split.cached and file_samples(dataset) is not None and takes_ragged(build_batched(split.device, *_RGB)):
        # A folder of photos with a recipe that starts with RandomResizedCrop: its entry is the pixel store
        # accelerate opens (each image as it is), named by the files and the recipe, so it goes under the root.
        if path is not None:
            raise ConfigError(
                f"path={str(path)!r}: a folder whose recipe starts with RandomResizedCrop is stored as accelerate "
                "stores it, under the cache root by its files and recipe (so accelerate finds it); pass root= instead"
            )
        from .accelerate import accelerate

        loader = accelerate(
            dataset,
            batch_size=1,
            device="cpu",
            transform=transform if transform is not _DATASET else getattr(dataset, "transform", None),
            cache=Path(root).expanduser() if root is not None else True,
            store="pixels",
            num_workers=num_workers,
            progress=progress,
            lock_timeout=lock_timeout,
        )
        if loader.plan.cache_path is None:
            raise CacheWriteError(f"the folder's store could not be written ({'; '.join(loader.plan.notes)})")
        return open_cache(Path(loader.plan.cache_path), verify=False)  # verified as accelerate opened it
    target = Path(path).expanduser() if path is not None else entry_path(type(dataset).__name__, key, root)
    meta = {"source": describe_source(dataset), "pipeline": {"cached": [repr(op) for op in split.cached]}}
    cache, _ = load_or_ingest(
        dataset, split, target, key, lambda data: True, num_workers, progress, lock_timeout, meta=meta
    )
    assert cache is not None
    return cache


def _current(target: Path, key: str, announce: bool) -> Cache | None:
    """The valid entry at ``target`` if it has ``key``; ``announce``: warn about what will be rebuilt.

    The key is read from the manifest first, so an entry of other data is not hashed just to be
    replaced.
    """
    try:
        if Manifest.read(target).key != key:
            if announce:
                warnings.warn(
                    f"replacing the cache at {target}: it holds another dataset or another transform",
                    stacklevel=4,
                )
            return None
        return open_cache(target, verify=True)
    except CacheError as e:
        if announce and is_gpufeed_entry(target):
            warnings.warn(f"rebuilding the cache: {e}", stacklevel=4)
        return None


def load_or_ingest(
    dataset: Any,
    split: Any,
    target: Path,
    key: str,
    persist: Callable[[Any], bool],
    num_workers: int | None = None,
    progress: bool = True,
    lock_timeout: float | None = None,
    strict: bool = True,
    read: Callable[[], Any] | None = None,
    resume: Callable[[Path, str], Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> tuple[Cache | None, Any]:
    """The entry at ``target`` if it is valid and has ``key``; else a fresh ingest, stored when ``persist(data)``.

    ``read``: what makes the data (an :class:`~gpufeed.read.samples.Ingested`, whose images may be a Ragged or
    Encoded store); by default the dataset read through the split's cached part. ``resume(target, key)``:
    the same, for a build that will be stored, keeping its progress beside ``target`` so that a killed
    build resumes (:mod:`gpufeed.cache.partial`); called under the build lock.

    Returns ``(cache, data)``: ``(entry, None)`` on a hit, ``(entry, data)`` when just written,
    ``(None, data)`` when not persisted. A valid entry is read without the lock (so a read-only
    cache works); building runs under the entry's build lock, so concurrent callers (one per rank)
    build once. A damaged entry is rebuilt with a warning; a path that is not gpufeed's is refused
    before anything is created beside it. ``strict=False`` (accelerate): a location that cannot be
    written gives ``(None, data)`` and one warning instead of a CacheWriteError.

    ``meta``: what the entry records besides (``"source"``, ``"pipeline"``). Once it is written, the entries
    beside it of the same source and pipeline under another key are removed, then the least recently used
    ones while the root is over ``$GPUFEED_CACHE_LIMIT`` (:mod:`gpufeed.cache.usage`; never one in use).
    """
    from ..cache.usage import cache_limit, enforce_limit, remove_superseded
    from ..read.samples import ingest

    cache_limit()  # a bad limit is an error before anything is read

    lock_timeout = resolve_lock_timeout(lock_timeout)  # a bad value is an error even on a hit
    hit = _current(target, key, announce=False)  # entries appear by one rename: no lock needed to read
    if hit is not None:
        return hit, None

    if read is None:

        def read() -> Any:
            return ingest(dataset, split.cached_transform(), num_workers=num_workers, progress=progress)

    with ExitStack() as stack:
        try:
            check_target(target)  # before the lock file is created beside it
            check_outside_dataset(dataset, target)
            stack.enter_context(build_lock(target, lock_timeout, progress=progress))
        except CacheWriteError as e:
            if strict:
                raise
            data = read()
            if persist(data):
                _in_memory(e)
            return None, data
        hit = _current(target, key, announce=True)  # built by another process while we waited?
        if hit is not None:
            return hit, None
        try:
            data = resume(target, key) if resume is not None else read()
        except CacheWriteError as e:  # no room or no right to keep the build's progress: the data stays in memory
            if strict:
                raise
            _in_memory(e)
            return None, read()
        if not persist(data):
            return None, data
        try:
            # Verified when asked for a cache; accelerate skips the re-read: the bytes were hashed as they
            # were written, and reading them back would hold a second copy of the images in memory.
            cache = store(target, key, split, data, verify=strict, adopt=data.files, meta=meta)
        except CacheWriteError as e:
            _drop_progress(target, resume)  # no room or no right to write: give the room back
            if strict:
                raise
            _in_memory(e)
            return None, data
        _drop_progress(target, resume)
        # Under the new entry's build lock: no other build of it runs. The old ones go only when unused.
        remove_superseded(target, cache.manifest)
        enforce_limit(target.parent, keep=target)
        return cache, data


def _drop_progress(target: Path, resume: Any) -> None:
    """A resumable build's progress, once the entry is written (or cannot be); a store mapped onto it stays
    readable (the file goes when it is unmapped)."""
    from ..cache.partial import is_partial, partial_path

    if resume is not None and is_partial(partial_path(target)):
        shutil.rmtree(partial_path(target), ignore_errors=True)


def _in_memory(e: CacheWriteError) -> None:
    warnings.warn(f"gpufeed: the data stays in memory, not cached on disk: {e}", stacklevel=4)


def check_outside_dataset(dataset: Any, target: Path) -> None:
    """A cache inside an image folder's directory would change the dataset (a new "class" appears).

    Checked for the datasets whose directory *is* their data (``ImageFolder`` and the other
    ``DatasetFolder``s) and those that keep it in ``root/base_folder`` (CIFAR, SVHN, STL10, ...).
    """
    from torchvision.datasets import DatasetFolder

    root, base = getattr(dataset, "root", None), getattr(dataset, "base_folder", None)
    if not isinstance(root, (str, os.PathLike)) or not (isinstance(dataset, DatasetFolder) or isinstance(base, str)):
        return
    data_dir = (Path(root) / base if isinstance(base, str) else Path(root)).resolve()
    if target.resolve().is_relative_to(data_dir):
        raise CacheWriteError(
            f"the cache {target} would be inside {data_dir}, the directory of the dataset "
            f"({type(dataset).__name__}); gpufeed never writes into a dataset's directory: choose a cache location "
            "outside it (build_cache(dataset, path), accelerate(..., cache=ROOT), --cache-dir or GPUFEED_CACHE_DIR)"
        )


def store(
    target: Path,
    key: str,
    split: Any,
    data: Any,
    verify: bool = True,
    adopt: dict[str, Path] | None = None,
    meta: dict[str, Any] | None = None,
) -> Cache:
    """Write ingested data (:class:`gpufeed.read.samples.Ingested`) as the entry ``target`` and open it (``adopt``:
    see :func:`gpufeed.cache.write_cache`; ``meta``: recorded besides). A folder's read
    (:class:`gpufeed.pipeline.materialise.FolderRead`) adds the files it left out and its files' names and hashes."""
    from ..read.files import Encoded
    from ..store.ragged import Ragged

    record: dict[str, Any] = {
        "cached": [repr(op) for op in split.cached],
        "ingest": data.path,
        "ingest_seconds": round(data.seconds, 3),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **(meta or {}),
    }
    skipped = getattr(data, "skipped", ())
    if skipped:
        record["skipped"] = [{"path": p, "why": why} for p, why in skipped]
    images = data.images
    if isinstance(images, Ragged):
        record.update(store="pixels", hwc=images.hwc)
        arrays = {"pixels": images.data, "starts": images.starts, "shapes": images.shapes}
    elif isinstance(images, Encoded):
        record["store"] = "jpeg"
        arrays = {k: getattr(images, k) for k in ("starts", "lengths", "shapes", "jpeg")} | {"bytes": images.data}
    else:
        record["store"] = "dense"
        arrays = {"images": images}
    write_cache(target, key, {**arrays, **getattr(data, "extra", {}), "labels": data.labels}, record, adopt)
    return open_cache(target, verify=verify)
