"""Cache storage: the on-disk format, writing, reading, verifying, locking and listing entries.

Pure storage: nothing here reads a dataset, plans a transform or knows what the arrays mean as images
(:mod:`gpufeed.store.entry` opens an entry as its store: the public ``gpufeed.open_cache``). Filling an entry
from a dataset (``build_cache``, and the open-or-build ``accelerate`` uses) lives in
:mod:`gpufeed.pipeline.entries`, so data flows one way: dataset -> ingest -> cache -> loader.

:mod:`.usage` marks the entries in use and their last use, and removes superseded entries and those
over ``GPUFEED_CACHE_LIMIT``; :mod:`.content` compares a folder's entry with the folder's files.
"""

from __future__ import annotations

from .format import Manifest, is_gpufeed_entry
from .location import default_cache_dir, entry_path
from .lock import build_lock
from .manage import list_entries, remove_entry
from .reader import Entry, open_entry, verify_entry
from .writer import check_target, write_cache

__all__ = [
    "Entry",
    "Manifest",
    "build_lock",
    "check_target",
    "default_cache_dir",
    "entry_path",
    "is_gpufeed_entry",
    "list_entries",
    "open_entry",
    "remove_entry",
    "verify_entry",
    "write_cache",
]
