"""Finding and removing cache entries (what ``gpufeed cache info|verify|clear`` act on)."""

from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path

from ..errors import CacheError
from .format import MANIFEST, is_gpufeed_entry

__all__ = ["is_leftover", "leftovers", "list_entries", "remove_entry"]

# What the writer names its temporary siblings (NOTE [ Cache write order ]); gpufeed 0.1 wrote
# ``.old-<rand>`` without a pid.
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:building|old)-(?:(?P<pid>\d+)-)?[0-9a-f]{8}$")


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def is_leftover(path: Path) -> bool:
    """A ``.building-*`` / ``.old-*`` directory of a build that is no longer running (never a valid cache)."""
    m = _LEFTOVER.match(path.name)
    if m is None or path.is_symlink() or not path.is_dir():
        return False
    return m["pid"] is None or not _running(int(m["pid"]))


def leftovers(target: Path) -> list[Path]:
    """The leftovers of dead builds of the entry ``target`` (its siblings; safe to delete)."""
    siblings = target.parent.glob(f".{glob.escape(target.name)}.*")
    return sorted(p for p in siblings if is_leftover(p) and _LEFTOVER.match(p.name)["name"] == target.name)  # type: ignore[index]


def list_entries(root: Path) -> list[Path]:
    """Directories under ``root`` that have a gpufeed manifest (valid or not), sorted."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).is_file())


def remove_entry(path: Path) -> None:
    """Delete a cache entry or a build leftover; refuse any other directory."""
    if not path.exists():
        raise CacheError(f"{path} does not exist")
    if path.is_symlink() or not (is_gpufeed_entry(path) or is_leftover(path)):
        raise CacheError(
            f"{path} is not a gpufeed cache entry (no gpufeed manifest.json in it); gpufeed deletes only what it "
            "created, so it is left as it is"
        )
    shutil.rmtree(path)
