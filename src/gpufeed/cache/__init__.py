"""Cache storage: the on-disk format, writing, reading, verifying, locking and listing entries.

Pure storage: nothing here reads a dataset or plans a transform. Filling an entry from a dataset
(``build_cache``, and the open-or-build ``accelerate`` uses) lives in :mod:`gpufeed.caching`, so
data flows one way: dataset -> ingest -> cache -> loader.

:mod:`.usage` marks the entries in use and their last use, and removes superseded entries and those
over ``GPUFEED_CACHE_LIMIT``; :mod:`.content` compares a folder's entry with the folder's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .fingerprint import cache_key, default_cache_dir
from .format import Manifest, is_gpufeed_entry
from .lock import build_lock
from .manage import list_entries, remove_entry
from .reader import Cache, open_cache, verify_cache
from .writer import check_target, write_cache

__all__ = [
    "Cache",
    "Manifest",
    "build_lock",
    "cache_key",
    "check_target",
    "default_cache_dir",
    "entry_path",
    "is_gpufeed_entry",
    "list_entries",
    "open_cache",
    "remove_entry",
    "verify_cache",
    "write_cache",
]


def entry_path(dataset: Any, key: str, root: str | Path | None = None) -> Path:
    """Where the entry for ``key`` lives under ``root`` (default: :func:`default_cache_dir`)."""
    return Path(root or default_cache_dir()).expanduser() / f"{type(dataset).__name__.lower()}-{key[:20]}"
