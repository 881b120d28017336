"""Cache: an opened cache entry as its store and labels (the public ``gpufeed.open_cache``).

:mod:`gpufeed.cache` maps and checks an entry's arrays (pure storage); this gives them their meaning as images:
the store of the entry's kind (:func:`gpufeed.store.from_arrays`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cache.format import Manifest
from ..cache.reader import open_entry, remedy
from ..errors import CacheError
from . import from_arrays
from .base import Store

__all__ = ["Cache", "open_cache", "verify_cache"]


@dataclass(frozen=True)
class Cache:
    """An opened cache: its memory-mapped ``store`` and ``labels``, and its manifest.

    ``images`` is the ``(N, C, H, W)`` tensor of a dense entry, the Ragged / Encoded store of a folder's.
    """

    path: Path
    manifest: Manifest
    store: Store
    labels: torch.Tensor

    @property
    def images(self) -> Any:
        return self.store.images

    @property
    def key(self) -> str:
        return self.manifest.key

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.manifest.arrays.values())


def open_cache(path: str | Path, verify: bool = True, record_use: bool = True) -> Cache:
    """Open the cache directory ``path``; with ``verify`` every byte is checked against its hash first.

    Sizes are always checked. Hashing costs one read of the files (about 1 GB/s per core, blocks
    hashed in parallel); ``verify=False`` skips it for trusted storage. The entry is marked in use for
    as long as its arrays live, and its last use recorded (NOTE [ Entries in use ] in :mod:`gpufeed.cache.usage`)
    unless ``record_use=False`` (a check is not a use: ``gpufeed cache verify`` must not reorder what
    ``GPUFEED_CACHE_LIMIT`` removes first).

    Raises:
        CacheError: the entry is missing, damaged, or not one gpufeed wrote.
    """
    entry = open_entry(path, verify, record_use)
    try:
        store = from_arrays(entry.kind, entry.arrays, entry.manifest.meta)
    except (KeyError, ValueError) as e:
        message = e.args[0] if e.args else str(e)
        raise CacheError(f"{entry.path}: {message}; {remedy(entry.path)}") from None
    return Cache(entry.path, entry.manifest, store, entry.labels)


def verify_cache(path: str | Path) -> Cache:
    """Open with every hash checked; raises :class:`~gpufeed.errors.CacheError` on the first fault. The entry's
    last use is left as it was."""
    return open_cache(path, verify=True, record_use=False)
