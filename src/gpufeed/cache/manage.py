"""Finding and removing cache entries (what ``gpufeed cache info|verify|clear`` act on)."""

from __future__ import annotations

import glob
import re
import shutil
from pathlib import Path

from ..errors import CacheError
from .format import MANIFEST, is_gpufeed_entry

__all__ = ["BUILD_FILES", "is_leftover", "leftover_target", "leftovers", "list_entries", "remove_entry", "unproven"]

# How the writer names its temporary siblings (NOTE [ Cache write order ]); gpufeed 0.1 wrote
# ``.old-<rand>`` without a pid.
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>building|old)-(?:(?P<pid>\d+)-)?[0-9a-f]{8}$")
# Dense entries hold images and labels; ragged ones pixels (or the files' bytes), starts, shapes, ...
# and a folder's entry the names of its files and the hashes of their bytes (``cache verify --data``).
ARRAY_FILES = ("images", "labels", "pixels", "bytes", "starts", "lengths", "shapes", "jpeg", "digests", "names")
BUILD_FILES = frozenset({*(f"{name}.bin" for name in ARRAY_FILES), MANIFEST, f"{MANIFEST}.tmp"})


def is_leftover(path: Path, files: frozenset[str] = BUILD_FILES) -> bool:
    """Whether ``path`` is a temporary sibling gpufeed made: named as the writer names them and holding
    nothing but the files it writes there (``files``); an ``.old-*`` must hold a gpufeed manifest; a
    ``.partial`` (a resumable build's progress, :mod:`gpufeed.cache.partial`) its own record.

    The name alone proves nothing (``.vim.old-20240101`` matches it), so the contents decide. Whether
    its build still runs is not decided here: that is what the entry's build lock says.
    """
    from .partial import is_partial

    if is_partial(path):
        return True
    m = _LEFTOVER.match(path.name)
    if m is None or path.is_symlink() or not path.is_dir() or (m["kind"] == "building" and m["pid"] is None):
        return False
    try:
        children = list(path.iterdir())
    except OSError:
        return False
    if any(c.is_symlink() or not c.is_file() or c.name not in files for c in children):
        return False
    return m["kind"] == "building" or is_gpufeed_entry(path)


def leftover_target(path: Path) -> Path:
    """The entry a leftover belongs to (whose build lock guards it)."""
    from .partial import partial_target

    if (target := partial_target(path)) is not None:
        return target
    m = _LEFTOVER.match(path.name)
    assert m is not None, path
    return path.parent / m["name"]


def leftovers(target: Path, files: frozenset[str] = BUILD_FILES) -> list[Path]:
    """The leftovers of writes of ``target`` (not a resumable build's progress, which its build removes once
    the entry is written). Call it holding ``target``'s build lock: then none is running."""
    siblings = target.parent.glob(f".{glob.escape(target.name)}.*")
    return sorted(
        p for p in siblings if _LEFTOVER.match(p.name) and is_leftover(p, files) and leftover_target(p) == target
    )


def unproven(target: Path, names: set[str]) -> str:
    """Why ``target`` (a directory holding ``names``) is not gpufeed's to replace, and what to do."""
    if names and names <= BUILD_FILES:
        return (
            f"holds only files named as a gpufeed cache's ({', '.join(sorted(names))}) but no manifest that parses "
            "as gpufeed's, so gpufeed cannot prove it made it and will not delete it. If it is a damaged gpufeed "
            f"entry, delete it yourself (rm -r {target}); else choose another path"
        )
    contents = "is empty" if not names else "holds files gpufeed did not write"
    return (
        f"exists, {contents} and has no gpufeed manifest, so it is not a gpufeed cache; gpufeed never replaces or "
        "deletes a directory it did not create: choose a path that does not exist yet (the entry is created there), "
        "or for a gpufeed entry run `gpufeed cache clear PATH` first"
    )


def list_entries(root: Path) -> list[Path]:
    """Directories under ``root`` that have a gpufeed manifest (valid or not), sorted."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).is_file())


def remove_entry(path: Path) -> None:
    """Delete a cache entry or a build leftover; refuse any other directory, and one whose build is running."""
    from .lock import build_lock

    if not (path.exists() or path.is_symlink()):
        raise CacheError(f"{path} does not exist")
    entry = not path.is_symlink() and is_gpufeed_entry(path)
    if not (entry or is_leftover(path)):
        names = {p.name for p in path.iterdir()} if path.is_dir() and not path.is_symlink() else set()
        if names and names <= BUILD_FILES:
            raise CacheError(f"{path} is kept: it {unproven(path, names)}")
        raise CacheError(
            f"{path} is not a gpufeed cache entry (no gpufeed manifest.json in it); gpufeed deletes only what it "
            "created, so it is left as it is"
        )
    target = path if entry else leftover_target(path)
    try:
        with build_lock(target, 0, progress=False):  # 0: a running build is reported, not waited for
            shutil.rmtree(path)
    except CacheError as e:
        raise CacheError(f"{path} is kept: {e}") from None
