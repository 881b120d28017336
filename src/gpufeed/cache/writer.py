"""Write a cache atomically: a temporary directory, flushed, manifest last, then one rename.

NOTE [ Cache write order ]
0. The target must be absent or gpufeed's own entry (:func:`check_target`); anything else at that
   path is an error and is never touched. The caller holds the entry's build lock (or writes into a
   private directory), so no other build of it runs: its leftovers beside it are removed.
1. Arrays are written into ``.<name>.building-<pid>-<rand>`` next to the target and fsynced.
2. The manifest is written last (to a temporary name, fsynced, renamed), so a directory with a
   manifest has complete arrays.
3. An old entry is moved aside to ``.<name>.old-<pid>-<rand>``, the new one renamed onto the
   target, and the old one removed; if the second rename fails, the old entry is put back. A build
   killed at any point leaves only ``.building`` / ``.old`` directories, which no reader opens and
   the next build removes (:func:`gpufeed.cache.manage.is_leftover` checks what they hold).

A failure to write (disk full, no permission, read-only file system) removes what this build
wrote and raises :class:`~gpufeed.errors.CacheWriteError` with the path, the bytes and the remedy.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from ..errors import CacheWriteError
from .format import MANIFEST, ArraySpec, Manifest, block_hashes, dtype_code, is_gpufeed_entry
from .manage import leftovers, unproven

__all__ = ["check_target", "fsync_dir", "write_cache"]

_MANIFEST_ALLOWANCE = 1 << 20  # bytes kept free beyond the arrays, for the manifest and directory entries


def _checkpoint(phase: str) -> None:
    """A seam between the phases of a write; the fault-injection tests end the process here."""


def check_target(target: Path) -> None:
    """Refuse a target path gpufeed did not create: it may be absent or a gpufeed entry, nothing else.

    A refusal is a CacheWriteError (the cache cannot be written there): ``build_cache`` raises it,
    ``accelerate`` keeps the data in memory and warns.
    """
    try:
        present = target.exists() or target.is_symlink()
        names = {p.name for p in target.iterdir()} if present and target.is_dir() and not target.is_symlink() else None
    except OSError as e:  # a location this process may not even look into
        raise CacheWriteError(
            f"cannot look at {target} ({e.strerror or e}): the cache location is not accessible; choose another "
            "(GPUFEED_CACHE_DIR / --cache-dir / accelerate(..., cache=ROOT)), or accelerate(..., cache=False)"
        ) from None
    if not present or is_gpufeed_entry(target):
        return
    if names is None:
        raise CacheWriteError(
            f"{target} exists and is not a directory gpufeed created; gpufeed never replaces it: choose a path that "
            "does not exist yet for the cache"
        )
    raise CacheWriteError(f"{target} {unproven(target, names)}")


def fsync_dir(path: Path) -> None:
    """Make a directory's new or renamed entries durable (what a rename into it needs after a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def _write_error(target: Path, needed: int, e: OSError | None) -> CacheWriteError:
    free = _free_bytes(target.parent)
    have = f", {free:,} are free there" if free is not None else ""
    remedy = (
        "choose a writable location (build_cache(dataset, path), accelerate(..., cache=ROOT), --cache-dir, or "
        "GPUFEED_CACHE_DIR), or keep the data in memory with accelerate(..., cache=False)"
    )
    if e is None or e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        cause = "not enough disk space" if e is None else f"{e.strerror or e}"
        remedy = "free disk space, or " + remedy
    else:
        unwritable = e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        cause = f"{e.strerror or e}" + (" (the location is not writable)" if unwritable else "")
    return CacheWriteError(
        f"cannot write the cache {target}: {cause}; it needs {needed:,} bytes{have}; nothing partial was left. {remedy}"
    )


def write_cache(
    target: Path,
    key: str,
    arrays: dict[str, torch.Tensor],
    meta: dict[str, Any],
    adopt: dict[str, Path] | None = None,
) -> Manifest:
    """Write ``arrays`` (CPU tensors) and their manifest to the directory ``target``, atomically.

    ``adopt``: arrays whose bytes are already in a file beside ``target`` (uint8, the whole file: a
    resumable build's, :mod:`gpufeed.cache.partial`), moved into the entry rather than written again,
    so that the entry takes no second copy's room; their hashes are computed from ``arrays``.

    Raises CacheError if ``target`` exists and is not a gpufeed entry, CacheWriteError if the disk
    is full or the location not writable (nothing is left behind then).
    """
    target = Path(target)
    check_target(target)
    views = {name: t.detach().cpu().contiguous().numpy() for name, t in arrays.items()}
    adopt = dict(adopt or {})
    for name, file in adopt.items():
        if views[name].dtype.itemsize != 1 or file.stat().st_size != views[name].nbytes:
            raise ValueError(f"adopt={name}: {file} must hold exactly the uint8 bytes of arrays[{name!r}]")
    needed = sum(a.nbytes for n, a in views.items() if n not in adopt) + _MANIFEST_ALLOWANCE
    free = _free_bytes(target.parent)
    if free is not None and free < needed:
        raise _write_error(target, needed, None)
    tmp = target.parent / f".{target.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in leftovers(target):  # the caller holds the build lock: their builds are dead
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        manifest = _write_arrays(tmp, key, views, meta, adopt)
        _checkpoint("wrote manifest")
        _swap_in(tmp, target)
        return manifest
    except OSError as e:
        raise _write_error(target, needed, e) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a rename; else what this build wrote


def _write_arrays(tmp: Path, key: str, views: dict[str, Any], meta: dict[str, Any], adopt: dict[str, Path]) -> Manifest:
    specs = {}
    for name, array in views.items():
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)  # the format is little-endian
        file = f"{name}.bin"
        if name in adopt:  # flushed by its builder; the mapping of it stays valid across the rename
            os.replace(adopt[name], tmp / file)
        else:
            with open(tmp / file, "wb") as f:
                f.write(memoryview(array).cast("B"))
                f.flush()
                os.fsync(f.fileno())
        specs[name] = ArraySpec(file, dtype_code(array.dtype), tuple(array.shape), array.nbytes, block_hashes(array))
        _checkpoint(f"wrote {file}")
    manifest = Manifest(key, specs, meta)
    staged = tmp / f"{MANIFEST}.tmp"
    with open(staged, "w") as f:
        f.write(manifest.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, tmp / MANIFEST)
    fsync_dir(tmp)
    return manifest


def _swap_in(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` onto ``target``; an old entry there (checked to be gpufeed's) is moved aside, then removed."""
    old = None
    if target.exists():
        check_target(target)  # again: it may have appeared while the arrays were written
        old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
    try:
        _checkpoint("moved the old entry aside")
        os.replace(tmp, target)
    except BaseException:
        if old is not None:  # put the old entry back: a failed rebuild must not lose what was there
            os.replace(old, target)
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
