"""Which entries are in use, when each was last used, and which may go: superseded ones and those over the limit.

NOTE [ Entries in use ]
A process that opens an entry holds a shared ``flock`` on its ``manifest.json`` for as long as any
array it mapped from the entry lives (:func:`hold`, registered on the arrays by the reader). Removing
an entry (superseded, or over ``GPUFEED_CACHE_LIMIT``) takes, without waiting, the entry's build lock
and an exclusive ``flock`` on the same manifest: if another process builds or reads it, it is kept.
``flock`` needs no write permission, so an entry in a read-only location can be held; the kernel
drops the lock when its holder exits, however it exits, so a killed reader never pins an entry.

Last use is the manifest's mtime, set to now by every open (``os.utime``; the manifest's bytes and
digest are untouched). An entry its user may not write keeps its build time as its last use.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sys
import warnings
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from ..device import fmt_bytes
from ..errors import CacheError, ConfigError
from .format import MANIFEST, Manifest, is_gpufeed_entry

__all__ = [
    "LIMIT_ENV",
    "cache_limit",
    "enforce_limit",
    "entry_bytes",
    "hold",
    "in_use",
    "last_use",
    "parse_size",
    "remove_superseded",
]

LIMIT_ENV = "GPUFEED_CACHE_LIMIT"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str = LIMIT_ENV) -> int:
    """Bytes from ``"20G"``, ``"500M"``, ``"1.5T"``, ``"20GiB"``, ``"20GB"`` or a plain count (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if m is None:
        raise ConfigError(f"{what}={text!r} must be a size in bytes, e.g. 20G, 500M, 1.5T or 1000000 (powers of 1024)")
    return int(float(m[1]) * _UNITS[m[2].upper()])


def cache_limit() -> int | None:
    """``$GPUFEED_CACHE_LIMIT`` in bytes (read at call time); ``None``: no limit."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    return parse_size(text) if text else None


_unmarked: set[str] = set()  # entries opened without the in-use mark (said once per process)


class _Hold:
    """An open manifest with a shared flock on it; closing it (when the last array that needs it dies)
    releases the lock."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f

    def __del__(self) -> None:
        self.f.close()


def _keep_alive(hold: _Hold) -> None:
    """A finalizer's callback: it only holds ``hold`` until the array it watches is gone."""


def hold(path: Path, arrays: list[Any], record_use: bool = True) -> None:
    """Mark the entry ``path`` in use for as long as any of ``arrays`` lives (NOTE [ Entries in use ]), and
    record its last use (unless ``record_use=False``). Nothing is marked where the manifest cannot be opened:
    the open fails right after."""
    manifest = path / MANIFEST
    try:
        f = open(manifest, "rb")
    except OSError:
        return
    try:
        fcntl.flock(f, fcntl.LOCK_SH)  # waits only while a remover holds it (the length of an rmtree)
    except OSError as e:  # a file system without flock (Lustre mounted without it): the entry is still usable
        f.close()
        if not _unmarked:
            warnings.warn(
                f"gpufeed: cannot mark the cache entry {path} in use ({e}: this file system has no flock), so another "
                "process's GPUFEED_CACHE_LIMIT or rebuild may remove it while it is read; put the cache root "
                "(GPUFEED_CACHE_DIR) on a local disk to avoid that",
                stacklevel=3,
            )
        _unmarked.add(str(path))
        return
    h = _Hold(f)
    for array in arrays:
        weakref.finalize(array, _keep_alive, h)
    if not record_use:
        return
    try:
        os.utime(manifest)  # last use (NOTE [ Entries in use ])
    except OSError:  # a read-only entry: its last use stays its build time, which only makes it go sooner
        pass


def last_use(path: Path) -> float:
    """When the entry was last opened (seconds since the epoch); its build time if never, 0 if unknown."""
    try:
        return (path / MANIFEST).stat().st_mtime
    except OSError:
        return 0.0


def entry_bytes(path: Path) -> int:
    """Bytes the entry's files take (their sizes)."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return 0


@contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Hold the entry's build lock and an exclusive flock on its manifest for the ``with`` block, without
    waiting; yields whether both were had (False: another process builds or reads it)."""
    from .lock import build_lock

    with ExitStack() as stack:
        try:
            stack.enter_context(build_lock(path, 0, progress=False))
            f = stack.enter_context(open(path / MANIFEST, "rb"))
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except (CacheError, OSError):  # held (BlockingIOError is an OSError), or the entry is gone already
            free = False
        yield free


def in_use(path: Path) -> bool:
    """Whether another process reads or builds the entry now."""
    with _exclusive(path) as free:
        return not free


def _remove(path: Path, why: str) -> str | None:
    """Remove the entry if no other process reads or builds it; the line that says so, else None."""
    size, source = entry_bytes(path), describe(path)
    with _exclusive(path) as free:
        if not free:
            return None
        shutil.rmtree(path, ignore_errors=True)
    line = f"gpufeed: removed the cache entry {path} ({fmt_bytes(size)}, {source}): {why}"
    print(line, file=sys.stderr, flush=True)
    return line


def describe(path: Path) -> str:
    """The data an entry holds, as a person names it: its folder, or its dataset class and split."""
    try:
        source = Manifest.read(path).meta.get("source")
    except CacheError:
        return "unknown source"
    if not isinstance(source, dict):
        return "unknown source (built before gpufeed recorded it)"
    name = str(source.get("class", "?")).rsplit(".", 1)[-1]
    where = f" {source['root']}" if source.get("root") else ""
    split = "".join(f" {k}={source[k]}" for k in ("train", "split") if k in source)
    part = f" (part {source['selection']})" if source.get("selection") else ""  # a Subset / random_split part
    return f"{name}{where}{split}{part}"


def remove_superseded(target: Path, manifest: Manifest) -> list[str]:
    """Remove the entries beside ``target`` of the same source and pipeline under another key (the files
    changed since, or gpufeed, torchvision or Pillow did): they will never be opened again. Each goes only
    when no other process reads or builds it. Returns the lines printed."""
    source, pipeline = manifest.meta.get("source"), manifest.meta.get("pipeline")
    # Only a source with a place (a folder, a dataset's root) is known to be the same data: two TensorDatasets
    # with the same pipeline are two datasets, each with its own entry.
    if not isinstance(source, dict) or not source.get("root") or pipeline is None:
        return []
    from .manage import list_entries

    lines = []
    for other in list_entries(target.parent):
        if other == target or other.is_symlink():
            continue
        try:
            m = Manifest.read(other)
        except CacheError:
            continue
        if m.key != manifest.key and _same(m.meta.get("source"), source) and _same(m.meta.get("pipeline"), pipeline):
            line = _remove(other, f"superseded by {target.name}, a newer build of the same data and pipeline")
            lines += [line] if line else []
    return lines


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def enforce_limit(root: Path, keep: Path, limit: int | None = None) -> list[str]:
    """Remove the least recently used entries under ``root`` until they take at most ``limit`` bytes (default
    ``$GPUFEED_CACHE_LIMIT``; none: nothing is removed). Never ``keep`` (the one just built) nor one another
    process reads or builds. Returns the lines printed."""
    from .manage import list_entries

    limit = cache_limit() if limit is None else limit
    if limit is None:
        return []
    # only gpufeed's own entries (NOTE [ Cache write order ]): a directory with a manifest of another format, or a
    # link to one, is not counted and never removed
    ours = [p for p in list_entries(root) if not p.is_symlink() and is_gpufeed_entry(p)]
    entries = [(last_use(p), entry_bytes(p), p) for p in ours]
    total = sum(size for _, size, _ in entries)
    lines = []
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if path == keep:
            continue
        line = _remove(path, f"least recently used, and the cache root is over {LIMIT_ENV}={fmt_bytes(limit)}")
        if line:
            lines.append(line)
            total -= size
    if total > limit:
        line = (
            f"gpufeed: the cache root {root} holds {fmt_bytes(total)}, over {LIMIT_ENV}={fmt_bytes(limit)}: "
            "what is left is the entry just built or entries other processes use; raise the limit or clear entries"
        )
        print(line, file=sys.stderr, flush=True)
        lines.append(line)
    return lines
