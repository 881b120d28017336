"""``build_cache``: the deterministic part of a dataset's transform computed once and stored, without a loader.

The entry is the one :func:`gpufeed.accelerate` would open for the same dataset and pipeline: a folder whose
recipe starts with RandomResizedCrop gets accelerate's pixel store (through the same stages: request, probe,
plan, materialise), anything else the cached part's output, read sample by sample or from the dataset's arrays,
at ``path`` or under the cache root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..cache import entry_path
from ..errors import CacheWriteError, ConfigError
from ..options import BatchOptions, ReadOptions
from ..read.fingerprint import cache_key
from ..store.entry import Cache, open_cache
from .entries import describe_source, load_or_ingest
from .materialise import materialise
from .plan import plan
from .probe import probe
from .request import DATASET, request

__all__ = ["build_cache"]


def build_cache(
    dataset: Any,
    path: str | Path | None = None,
    *,
    transform: Any = DATASET,
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
    root_or_true = Path(root).expanduser() if root is not None else True
    options = ReadOptions(
        cache=root_or_true, store="pixels", cache_lambda=cache_lambda, num_workers=num_workers, progress=progress,
        lock_timeout=lock_timeout,
    )  # fmt: skip
    req = request(dataset, BatchOptions(batch_size=1), options, transform=transform, device="cpu")
    if req.unbatchable is not None:
        raise req.unbatchable
    dataset = req.dataset  # a Subset / ConcatDataset: the samples and transform of what it wraps
    probed = probe(dataset, req.transforms, cache_lambda)
    split = probed.split
    key = cache_key(dataset, split.cached)
    if key is None:
        raise ConfigError(
            f"{type(dataset).__name__} with cached ops {list(split.cached)} cannot be fingerprinted (unknown source "
            "or an opaque transform such as a Lambda), so a cache on disk could later be matched to other data; "
            "use gpufeed.accelerate(..., cache=False) to keep it in memory instead"
        )
    decided = plan(req, probed)
    if decided.route == "folder":
        # A folder of photos with a recipe that starts with RandomResizedCrop: its entry is the pixel store
        # accelerate opens (each image as it is), named by the files and the recipe, so it goes under the root.
        if path is not None:
            raise ConfigError(
                f"path={str(path)!r}: a folder whose recipe starts with RandomResizedCrop is stored as accelerate "
                "stores it, under the cache root by its files and recipe (so accelerate finds it); pass root= instead"
            )
        src = materialise(req, probed, decided)
        if src.cache_path is None:
            raise CacheWriteError(f"the folder's store could not be written ({'; '.join(src.notes)})")
        return open_cache(src.cache_path, verify=False)  # verified as it was opened
    target = Path(path).expanduser() if path is not None else entry_path(type(dataset).__name__, key, root)
    meta = {"source": describe_source(dataset), "pipeline": {"cached": [repr(op) for op in split.cached]}}
    cache, _ = load_or_ingest(
        dataset, split, target, key, lambda data: True, options.num_workers, progress, lock_timeout, meta=meta
    )
    assert cache is not None
    return cache
