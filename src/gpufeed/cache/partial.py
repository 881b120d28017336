"""A build's progress kept on disk, so that a build that was killed resumes where it stopped.

Decoding a folder into its pixel store is the long part of building it (minutes to hours for a
large folder), so it runs in chunks into a memory-mapped file beside the entry,
``.<entry>.partial/pixels.bin``; after each chunk the bytes are flushed and ``progress.json`` records
how many images are done (written to a temporary name, flushed, renamed: a record never claims
bytes that are not on disk). A build of the same entry (same key, same sizes) that finds it starts
from there; anything else it finds there is discarded, and so is the progress of the same folder's
earlier builds under other keys (its files changed since). The entry is then written as every entry
is (NOTE [ Cache write order ]), except that the decoded file is moved into it rather than copied
(no second copy's room on disk). Only the build that holds the entry's build lock touches it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

__all__ = ["Partial", "is_partial", "partial_path", "partial_target", "progress_file"]

_FORMAT = "gpufeed-partial"
_DATA, _PROGRESS = "pixels.bin", "progress.json"
_FILES = frozenset({_DATA, _PROGRESS, f"{_PROGRESS}.tmp"})
_SUFFIX = ".partial"


def partial_path(target: Path) -> Path:
    return target.parent / f".{target.name}{_SUFFIX}"


def partial_target(path: Path) -> Path | None:
    """The entry whose build ``path`` records, if it is named as one is; else None."""
    name = path.name
    if not (name.startswith(".") and name.endswith(_SUFFIX)) or len(name) <= 1 + len(_SUFFIX):
        return None
    return path.parent / name[1 : -len(_SUFFIX)]


def _record(path: Path) -> dict | None:
    try:
        record = json.loads((path / _PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == _FORMAT else None


def is_partial(path: Path) -> bool:
    """Whether ``path`` is a build's progress gpufeed wrote: so named, holding only its files and its record."""
    if partial_target(path) is None or path.is_symlink() or not path.is_dir():
        return False
    try:
        children = list(path.iterdir())
    except OSError:
        return False
    if any(c.is_symlink() or not c.is_file() or c.name not in _FILES for c in children):
        return False
    return _record(path) is not None


class Partial:
    """The progress of one build: ``data`` (a uint8 tensor mapped onto the file) and ``done`` (images)."""

    def __init__(self, path: Path, record: dict, data: np.memmap) -> None:
        self.path, self.record, self._map = path, record, data
        self.data = torch.from_numpy(data)
        self.done: int = record["done"]
        self.resumed: int = self.done  # what an earlier build had done
        # images of the done part that did not decode (position -> why): a resumed build still names them
        bad = record.get("bad", {})
        self.bad: dict[int, str] = {int(k): str(v) for k, v in bad.items()} if isinstance(bad, dict) else {}

    @classmethod
    def open(cls, target: Path, key: str, nbytes: int, images: int, source: str = "") -> Partial:
        """The progress of the build of ``target`` with ``key`` if one was left, else a fresh one (a record of
        another build of that entry, or one gpufeed cannot read, is replaced). ``source`` names the data (a
        folder): the progress of its earlier builds under other keys (the files changed since) is removed."""
        from ..errors import CacheWriteError

        path = partial_path(target)
        want = {"format": _FORMAT, "key": key, "bytes": nbytes, "images": images, "source": source}
        record = _record(path) if is_partial(path) else None
        data_file = path / _DATA
        if record is not None and all(record.get(k) == v for k, v in want.items()):
            done = record.get("done")
            if isinstance(done, int) and 0 <= done <= images and _size(data_file) == nbytes:
                return cls(path, record, np.memmap(data_file, dtype=np.uint8, mode="r+", shape=(nbytes,)))
        if is_partial(path):
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():  # named as ours but not ours: never touched
            raise CacheWriteError(
                f"{path} exists and is not a gpufeed build's progress (no record of one in it); it is left as it "
                f"is. If an interrupted gpufeed build left it, delete it (rm -r {path})"
            )
        if source:
            _forget_stale(target, source)
        try:
            path.mkdir()
            record = {**want, "done": 0}
            _write_record(path, record)  # first: from here on the directory is recognisably gpufeed's
            with open(data_file, "wb") as f:
                # Reserved now: a write into a mapped file on a full disk would end the process (SIGBUS).
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(f.fileno(), 0, nbytes)
                else:  # macOS, Windows: sparse, as the writer's files are
                    f.truncate(nbytes)
            partial = cls(path, record, np.memmap(data_file, dtype=np.uint8, mode="r+", shape=(nbytes,)))
        except OSError as e:
            shutil.rmtree(path, ignore_errors=True)
            raise CacheWriteError(
                f"cannot keep a build's progress in {path} ({e.strerror or e}; {nbytes / 2**20:.1f} MiB of decoded "
                "pixels): free the room or choose another cache root (GPUFEED_CACHE_DIR / accelerate(..., cache=ROOT))"
            ) from None
        return partial

    def commit(self, done: int, bad: dict[int, str] | None = None) -> None:
        """Images ``[0, done)`` are in ``data`` (but ``bad``, which did not decode): flush them, then record it."""
        self._map.flush()
        self.done = self.record["done"] = done
        self.bad = dict(bad or {})
        self.record["bad"] = {str(k): v for k, v in self.bad.items()}
        self._write_record()
        _checkpoint(done)

    def _write_record(self) -> None:
        _write_record(self.path, self.record)


def _write_record(path: Path, record: dict) -> None:
    """``progress.json``: written to a temporary name, flushed, renamed (a record is whole or absent)."""
    tmp = path / f"{_PROGRESS}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path / _PROGRESS)


def progress_file(target: Path) -> Path:
    """The decoded pixels' file of ``target``'s build."""
    return partial_path(target) / _DATA


def _size(file: Path) -> int | None:
    try:
        return file.stat().st_size
    except OSError:
        return None


def _forget_stale(target: Path, source: str) -> None:
    """Remove the progress of builds of the same source under other entries (its files have changed since, so
    their keys will not come back), each only while no build of it runs."""
    from ..errors import CacheError
    from .lock import build_lock

    for other in target.parent.glob(".*" + _SUFFIX):
        if other == partial_path(target) or not is_partial(other):
            continue
        record = _record(other)
        owner = partial_target(other)
        if record is None or record.get("source") != source or owner is None:
            continue
        try:
            with build_lock(owner, 0, progress=False):  # 0: a running build keeps its progress
                shutil.rmtree(other, ignore_errors=True)
        except CacheError:
            pass


def _checkpoint(done: int) -> None:
    """A seam after each recorded chunk; the kill-and-resume tests end the process here."""
