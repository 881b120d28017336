"""Finding and removing cache entries (what ``gpufeed cache info|verify|clear`` act on)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import CacheError
from .format import FORMAT, MANIFEST

__all__ = ["is_leftover", "list_entries", "remove_entry"]


def is_leftover(path: Path) -> bool:
    """A directory a killed or interrupted build left behind (never a valid cache)."""
    return path.is_dir() and path.name.startswith(".") and (".building-" in path.name or ".old-" in path.name)


def _is_entry(path: Path) -> bool:
    try:
        return json.loads((path / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def list_entries(root: Path) -> list[Path]:
    """Directories under ``root`` that have a gpufeed manifest (valid or not), sorted."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).is_file())


def remove_entry(path: Path) -> None:
    """Delete a cache entry or a build leftover; refuse any other directory."""
    if not path.exists():
        raise CacheError(f"{path} does not exist")
    if not (_is_entry(path) or is_leftover(path)):
        raise CacheError(f"{path} is not a gpufeed cache entry (no gpufeed manifest.json); not deleting it")
    shutil.rmtree(path)
