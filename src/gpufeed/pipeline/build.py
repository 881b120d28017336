"""``build_cache``: the deterministic part of a dataset's transform computed once and stored, without a loader.

The entry is the one :func:`gpufeed.accelerate` would open for the same dataset and pipeline: a folder whose
recipe starts with RandomResizedCrop gets accelerate's pixel store (through the same stages: request, probe,
plan, materialise); anything else the cached part's output, read sample by sample or from the dataset's arrays,
at ``path`` or under the cache root. Unlike ``accelerate``, nothing else is probed: only the stored part is
computed here, and a batched part gpufeed could not run does not stop it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..augment.transforms import takes_ragged
from ..cache import entry_path
from ..errors import CacheWriteError, ConfigError
from ..options import BatchOptions, ReadOptions
from ..read.files import has_image_files
from ..read.fingerprint import cache_key
from ..read.wrappers import unwrap
from ..store.entry import Cache, open_cache
from ..validate import as_workers, check_dataset
from .entries import describe_source, load_or_ingest
from .materialise import materialise
from .plan import plan
from .probe import probe
from .request import DATASET, request
from .translate import build_batched, split_transform

__all__ = ["build_cache"]

_RGB = (torch.uint8, (64, 64), True)  # a folder's files as the RGB PIL images torchvision's loader gives


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
    check_dataset(dataset)
    num_workers = None if num_workers is None else as_workers(num_workers)  # a typo must not start 10**6 workers
    # a Subset / ConcatDataset: the samples and transform of what it wraps (transform= replaces its transforms)
    dataset = unwrap(dataset, own_transforms=transform is DATASET)
    transform = getattr(dataset, "transform", None) if transform is DATASET else transform
    split = split_transform(transform, cache_lambda)
    key = cache_key(dataset, split.cached)
    if key is None:
        raise ConfigError(
            f"{type(dataset).__name__} with cached ops {list(split.cached)} cannot be fingerprinted (unknown source "
            "or an opaque transform such as a Lambda), so a cache on disk could later be matched to other data; "
            "use gpufeed.accelerate(..., cache=False) to keep it in memory instead"
        )
    if not split.cached and has_image_files(dataset) and takes_ragged(build_batched(split.device, *_RGB)):
        # A folder of photos with a recipe that starts with RandomResizedCrop: its entry is the pixel store
        # accelerate opens (each image as it is), named by the files and the recipe, so it goes under the root.
        if path is not None:
            raise ConfigError(
                f"path={str(path)!r}: a folder whose recipe starts with RandomResizedCrop is stored as accelerate "
                "stores it, under the cache root by its files and recipe (so accelerate finds it); pass root= instead"
            )
        return _folder_entry(dataset, transform, cache_lambda, num_workers, progress, root, lock_timeout)
    target = Path(path).expanduser() if path is not None else entry_path(type(dataset).__name__, key, root)
    meta = {"source": describe_source(dataset), "pipeline": {"cached": [repr(op) for op in split.cached]}}
    cache, _ = load_or_ingest(
        dataset, split, target, key, lambda data: True, num_workers, progress, lock_timeout, meta=meta
    )
    assert cache is not None
    return cache


def _folder_entry(
    dataset: Any,
    transform: Any,
    cache_lambda: bool,
    num_workers: int | None,
    progress: bool,
    root: str | Path | None,
    lock_timeout: float | None,
) -> Cache:
    """The folder's pixel store, through accelerate's stages (request, probe, plan, materialise), without a loader."""
    options = ReadOptions(
        cache=Path(root).expanduser() if root is not None else True, store="pixels", cache_lambda=cache_lambda,
        num_workers=num_workers, progress=progress, lock_timeout=lock_timeout,
    )  # fmt: skip
    req = request(dataset, BatchOptions(batch_size=1), options, transform=transform, device="cpu")
    probed = probe(req.dataset, req.transforms, cache_lambda)
    src = materialise(req, probed, plan(req, probed))
    if src.cache_path is None:
        raise CacheWriteError(f"the folder's store could not be written ({'; '.join(src.notes)})")
    return open_cache(src.cache_path, verify=False)  # verified as it was opened
