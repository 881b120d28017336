"""Shared-memory hygiene for the engine: a run's hold on its local directory, and the stale blocks it may remove.

NOTE [ Stale shared memory from a killed run ]
A ``StreamingDataset`` creates blocks ``/dev/shm/NNNNNN_<name>`` (``NNNNNN`` the first free prefix; the
``NNNNNN_locals`` block lists its local directories). A run killed with its whole process group (a job
scheduler's kill, the out-of-memory killer) takes Python's resource tracker with it, so nothing unlinks them; the
next run with the same remote and local then fails with "Reused local directory" (when the dead run never
downloaded) or burns a prefix for good. The engine's ``clean_stale_shared_memory()`` is no remedy: it stops at
the first clean prefix (missing later leaks) and unlinks without asking whether the blocks are in use (breaking a
live run). gpufeed never calls it. Instead:
1. every gpufeed run holds an ``flock`` on a lock file named by its local directory, under gpufeed's cache
   directory, for its whole life (the kernel releases it however the process ends);
2. the process that finds that lock free (no gpufeed run uses the directory) removes the blocks whose ``locals``
   name that directory, and only those no living process has mapped (``/proc/*/maps``: a user's own
   ``StreamingDataset`` on the same directory, outside gpufeed, is left alone);
3. then it shares the lock with the other ranks of its node, which skip the cleaning.
The engine's ``/tmp/NNNNNN_*_filelock`` files are left alone (they name no directory); ``TMPDIR`` moves them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..cache.location import default_cache_dir
from . import engine

__all__ = ["SHM_DIR", "RunLock", "blocks_naming", "clean_stale", "hold", "lock_path", "mapped_blocks"]

SHM_DIR = Path("/dev/shm")
_BLOCK = re.compile(r"^(\d{6})_([a-z_]+)$")


def _engine_names() -> tuple[str, ...]:
    """The suffixes of the engine's blocks (``locals``, ``barrier``, ``next_epoch``, ...)."""
    engine.streaming()
    from streaming.base.constant import SHM_TO_CLEAN

    return tuple(SHM_TO_CLEAN)


def _same_dir(path: str, local: str) -> bool:
    return os.path.abspath(path) == os.path.abspath(local) or os.path.realpath(path) == os.path.realpath(local)


def _locals_of(block: Path) -> list[str]:
    """The local directories a ``NNNNNN_locals`` block lists: an int32 size, then ``dir\\0dir\\0...\\0prefix``
    (a closed dataset zeroes the size)."""
    try:
        data = block.read_bytes()
    except OSError:
        return []
    size = int.from_bytes(data[:4], "little", signed=True)
    if size <= 4 or size > len(data):
        return []
    try:
        return data[4:size].decode("utf-8").split("\0")[:-1]
    except UnicodeDecodeError:
        return []


def blocks_naming(local: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Prefix -> the names of its blocks in :data:`SHM_DIR`, for each prefix whose ``locals`` name ``local``
    (blocks of this user only)."""
    if not SHM_DIR.is_dir():
        return {}
    names = set(_engine_names())
    uid = os.getuid()
    found: dict[str, list[str]] = {}
    listing = sorted(p for p in SHM_DIR.iterdir() if _BLOCK.match(p.name))
    for block in listing:
        prefix, name = _BLOCK.match(block.name).groups()  # type: ignore[union-attr]
        if name != "locals" or not any(_same_dir(d, os.fspath(local)) for d in _locals_of(block)):
            continue
        try:
            if block.stat().st_uid != uid:
                continue
        except OSError:
            continue
        found[prefix] = [p.name for p in listing if p.name.startswith(prefix + "_") and p.name[7:] in names]
    return found


def mapped_blocks() -> set[str]:
    """Names of :data:`SHM_DIR` files some living process of this user has mapped (``/proc/*/maps``).

    The engine creates its blocks readable by their owner only, so only this user's processes (and root's) can map
    them; a process whose maps cannot be read (a protected one, e.g. a container's init) is not seen.
    """
    uid = os.getuid()
    mapped: set[str] = set()
    prefix = f"{SHM_DIR}/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            text = (proc / "maps").read_text()
        except OSError:
            continue  # it ended meanwhile, or it is protected
        for line in text.splitlines():
            at = line.find(prefix)
            if at >= 0:
                mapped.add(line[at + len(prefix) :].split(" ")[0])
    return mapped


def clean_stale(local: str | os.PathLike[str]) -> list[str]:
    """Unlink the engine's blocks that name ``local`` and that no living process maps; the names unlinked.

    Call it only while holding ``local``'s lock exclusively (:func:`hold` does): a gpufeed run that has not yet
    created its blocks is protected by that lock, every other user of them by their mappings.
    """
    candidates = blocks_naming(local)
    if not candidates:
        return []
    live = mapped_blocks()
    gone = []
    for names in candidates.values():
        if any(name in live for name in names):
            continue  # a living process uses this prefix
        for name in names:
            try:
                (SHM_DIR / name).unlink()
                gone.append(name)
            except FileNotFoundError:
                pass
    return gone


def lock_path(local: str | os.PathLike[str]) -> Path:
    """The lock file of a local directory: ``<gpufeed cache>/stream-locks/<sha1 of its real path>.lock``."""
    key = hashlib.sha1(os.path.realpath(os.fspath(local)).encode()).hexdigest()[:20]
    return default_cache_dir() / "stream-locks" / f"{key}.lock"


@dataclass
class RunLock:
    """A run's hold on a local directory (NOTE [ Stale shared memory from a killed run ]).

    ``first``: this process found no gpufeed run using the directory; ``cleaned``: the stale blocks it removed.
    """

    local: str
    path: Path | None
    first: bool
    cleaned: list[str] = field(default_factory=list)
    _fd: int | None = None

    def release(self) -> None:
        """Give the directory up (closing the file drops the flock); idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold(local: str | os.PathLike[str]) -> RunLock:
    """Hold ``local`` for this run; the first holder cleans its stale blocks. Release it when the run ends.

    Example::

        with hold("/scratch/cache") as lock:
            ...  # construct the StreamingDataset, read; lock.cleaned lists what a killed run had left
    """
    local = os.path.abspath(os.fspath(local))
    path = lock_path(local)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        warnings.warn(
            f"cannot create the lock file {path} ({e}); shared memory left by a killed run on {local} will not be "
            "cleaned: set GPUFEED_CACHE_DIR to a writable directory",
            stacklevel=2,
        )
        return RunLock(local, None, first=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first = True
    except BlockingIOError:
        first = False
    cleaned: list[str] = []
    try:
        if first:
            os.ftruncate(fd, 0)
            os.write(fd, local.encode() + b"\n")  # for a person listing the lock directory
            cleaned = clean_stale(local)
        # shared from here: the node's other ranks join; a first holder elsewhere waits (it would clean)
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(local, path, first, cleaned, fd)
