"""Shared-memory hygiene for the engine: a run's hold on its local directory, and the stale blocks it may remove.

NOTE [ Stale shared memory from a killed run ]
A ``StreamingDataset`` creates blocks ``/dev/shm/NNNNNN_<name>`` (``NNNNNN`` the first free prefix; the
``NNNNNN_locals`` block lists its local directories). A run killed with its whole process group (a job
scheduler's kill, the out-of-memory killer) takes Python's resource tracker with it, so nothing unlinks them; the
next run with the same remote and local then fails with "Reused local directory" (when the dead run never
downloaded) or burns a prefix for good. The engine's ``clean_stale_shared_memory()`` is no remedy: it stops at
the first clean prefix (missing later leaks) and unlinks without asking whether the blocks are in use (breaking a
live run). gpufeed never calls it. Instead:
1. every gpufeed run holds an ``flock`` on the claim file in its local directory (``local/.gpufeed-claim``) for
   its whole life (the kernel releases it however the process ends: a dead holder's claim is free again, and the
   next holder rewrites what the file says);
2. the process that finds that lock free (no gpufeed run uses the directory) removes the blocks whose ``locals``
   name that directory, and only those no living process has mapped (``/proc/*/maps``: a user's own
   ``StreamingDataset`` on the same directory, outside gpufeed, is left alone);
3. then it shares the lock with the other ranks of its node, which skip the cleaning.
The engine's ``/tmp/NNNNNN_*_filelock`` files are left alone (they name no directory); ``TMPDIR`` moves them.

NOTE [ One job per local directory ]
The ranks of one job on a node share ``local`` (one engine cache, one LRU, one limit); two jobs must not: each
engine keeps its own accounting of the same files, so one evicts what the other counts (an outside trial: one job
died with the engine's "no shards present locally to evict", the directory 10% over its limit) or serves what the
other is replacing. The engine's own check does not catch it: its walk of the shared-memory prefixes skips every
prefix whose ``/tmp`` file locks exist, which those of a dataset that has downloaded do (checked: a second
``StreamingDataset`` on the same remote and local, in another process, is constructed without complaint). So the
first holder of the lock (step 1 above, while it holds it exclusively) writes its job into the lock file
(:func:`job`: the launcher's rendezvous -- torchrun's ``MASTER_ADDR:MASTER_PORT`` and run id, Slurm's job id -- or
this process alone); every holder, once it shares the lock, reads it back and is refused (a ConfigError naming that
job's pid, host and command, and the fix: another ``local``) when it is another job's. The lock file is rewritten
only under the exclusive lock, which no one gets while a holder lives, so what it says is the living holders' job;
two first holders racing for the exclusive lock (flock's conversion to shared is not atomic) each read the file
after it, and the one that did not write it last is refused. A claim that says nothing (its first holder died or hit
a full disk before writing it) is taken over by the next holder when no one holds it, else refused: never read as
"no job". The claim file is opened without following a link (one planted in a shared ``local`` would have gpufeed
truncate the file it points to), and a write that fails is a CacheWriteError naming it.
The claim lives in ``local`` itself, not under gpufeed's cache directory: a lock there (keyed by the directory's
path) was one per cache directory, so a second user (another HOME) or a job with another ``GPUFEED_CACHE_DIR`` on the
same ``local`` held a lock of its own and was served while the first job held it (an outside trial). Local-only data
takes no claim: it is only read, never evicted, so any number of jobs (and a read-only mount) may read it at once.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CacheWriteError, ConfigError
from . import engine

__all__ = ["CLAIM", "SHM_DIR", "RunLock", "blocks_naming", "clean_stale", "hold", "job", "lock_path", "mapped_blocks"]

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


CLAIM = ".gpufeed-claim"  # the claim file in a remote's local (NOTE [ One job per local directory ])


def lock_path(local: str | os.PathLike[str]) -> Path:
    """The claim file of a local directory: ``local/.gpufeed-claim``, in the directory it protects (its real
    path: a symlink to it and the directory itself share one claim)."""
    return Path(os.path.realpath(os.fspath(local))) / CLAIM


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


# what names a multi-process job the same in each of its ranks (and differs between two jobs at once on a node)
_JOB_VARIABLES = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_STEP_ID")


def job(env: Mapping[str, str] | None = None, ranks: int = 1) -> str:
    """This process's job, as the ranks of one job on a node all name it (NOTE [ One job per local directory ]).

    A rank of a multi-process job (``WORLD_SIZE`` > 1, or a process group of more than one): its launcher's
    rendezvous (``MASTER_ADDR``, ``MASTER_PORT``, torchrun's run id, Slurm's job and step), else its parent process
    (``torch.multiprocessing.spawn``'s ranks share it). ``ranks``: the ranks on this node the caller's layout says
    share the directory (``gf.stream(layout=...)`` before any process group): more than one is a multi-process job
    too. Any other process is a job of its own.

    Example:
        >>> job({"WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
        'MASTER_ADDR=10.0.0.1 MASTER_PORT=29500'
    """
    env = os.environ if env is None else env
    world = max(int(env.get("WORLD_SIZE", "1") or 1), ranks)
    if world <= 1 and env is os.environ:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world <= 1:
        return f"pid={os.getpid()}@{socket.gethostname()}"
    named = " ".join(f"{k}={env[k]}" for k in _JOB_VARIABLES if env.get(k))
    return named or f"ppid={os.getppid()}@{socket.gethostname()}"


def _command(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= 120 else text[:117] + "..."


def _refusal(local: str, path: Path, theirs: dict[str, Any]) -> ConfigError:
    pid, host = theirs.get("pid"), theirs.get("host")
    since = theirs.get("since")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else ""
    command = f", running {_command(pid)}" if isinstance(pid, int) and host == socket.gethostname() else ""
    return ConfigError(
        f"local={local} is in use by another job: pid {pid} on {host}{when}{command} (job {theirs.get('job')}; this "
        f"one is {job()}). Two jobs on one cache directory evict each other's shards and overrun cache_limit: give "
        f"this job another local= (each job a directory of its own; the ranks of one job share theirs), or wait for "
        f"that one to end (its claim, {path}, frees when its last process exits)"
    )


def _no_flock(local: str, path: Path, e: OSError) -> RunLock:
    """No claim (a file system without flock: Lustre mounted without it, NFS without its lock daemon): said once,
    and the run goes on unclaimed."""
    warnings.warn(
        f"cannot claim {local} ({path}: {e.strerror or e}: this file system has no working flock), so another job on "
        "it is not refused, nor shared memory left by a killed run cleaned: give each job a local of its own, on a "
        "local disk if you can",
        stacklevel=3,
    )
    return RunLock(local, None, first=False)


class _NoFlock(Exception):
    """flock refused for another reason than another holder (the file system has none that works)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _flock(fd: int, operation: int) -> None:
    """``fcntl.flock``; a BlockingIOError as it is (another holder), any other OSError as :class:`_NoFlock`."""
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        raise
    except OSError as e:
        raise _NoFlock(e) from e


def _record(fd: int) -> dict[str, Any] | None:
    """What the claim file says (None: nothing readable: its first holder died or failed before writing it)."""
    try:
        theirs = json.loads(os.pread(fd, 1 << 16, 0).decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return theirs if isinstance(theirs, dict) and isinstance(theirs.get("job"), str) else None


def hold(local: str | os.PathLike[str], ranks: int = 1) -> RunLock:
    """Hold ``local`` for this run; the first holder cleans its stale blocks. Release it when the run ends.
    ``ranks``: the ranks of this node that share ``local`` (:func:`job`).

    Raises:
        ConfigError: another job holds ``local`` (NOTE [ One job per local directory ]); the ranks of one job share it.
            Or the claim file is a symbolic link (it would be written through to its target, outside ``local``).
        CacheWriteError: the claim cannot be written (``local``'s disk is full).

    Example::

        with hold("/scratch/cache") as lock:
            ...  # construct the StreamingDataset, read; lock.cleaned lists what a killed run had left
    """
    local = os.path.abspath(os.fspath(local))
    path = lock_path(local)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # never through a link: a claim planted as a link to another file would have that file truncated
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR):
            raise _not_a_claim(local, path) from None
        warnings.warn(
            f"cannot create the claim file {path} ({e}); shared memory left by a killed run on {local} will not be "
            "cleaned, nor another job on it refused: give a local this user can write",
            stacklevel=2,
        )
        return RunLock(local, None, first=False)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: nothing gpufeed could write a claim into
        os.close(fd)
        raise _not_a_claim(local, path)
    mine = {
        "local": local,
        "job": job(ranks=ranks),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
    }
    cleaned: list[str] = []
    try:
        for attempt in range(2):
            try:
                _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                first = True
            except BlockingIOError:
                first = False
            if first:
                _write_claim(fd, path, mine)  # who holds it: for the next job, and a person
                cleaned = clean_stale(local)
            # shared from here: the node's other ranks join; a first holder elsewhere waits (it would clean)
            _flock(fd, fcntl.LOCK_SH)
            theirs = _record(fd)
            if theirs is not None:
                break
            # its first holder died or failed before writing it: take it over if no one else holds it now
            _flock(fd, fcntl.LOCK_UN)
            if attempt:
                raise ConfigError(
                    f"local={local} is held by another process whose claim ({path}) says nothing: a gpufeed run that "
                    "could not write it (a full disk), or a process that is not gpufeed, holds it. Give this job "
                    f"another local=, or end the processes that use this one (fuser -v {path} lists them)"
                )
        assert theirs is not None  # the loop ends on a record, or raises
        if theirs.get("job") != mine["job"]:
            raise _refusal(local, path, theirs)
    except _NoFlock as e:
        os.close(fd)
        return _no_flock(local, path, e.error)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(local, path, first, cleaned, fd)


def _not_a_claim(local: str, path: Path) -> ConfigError:
    """The claim file's path holds something gpufeed did not make: a link (it would write through it, outside
    ``local``), a directory, a FIFO."""
    if path.is_symlink():
        try:
            what = f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            what = "a symbolic link"
    else:
        what = "a directory" if path.is_dir() else "not a regular file"
    return ConfigError(
        f"the claim file {path} is {what}: gpufeed writes its claim there, and would write to another file, outside "
        f"local={local}, or none; remove it (gpufeed makes the file itself) or give another local"
    )


def _write_claim(fd: int, path: Path, mine: dict[str, Any]) -> None:
    """Write this holder's record over the claim file (under the exclusive lock), or a CacheWriteError."""
    data = (json.dumps(mine) + "\n").encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as e:
        raise CacheWriteError(
            f"cannot write the claim file {path} ({e.strerror or e}; {len(data)} bytes): local={mine['local']} is "
            "full or not writable; free space in it (its shards can go) or give another local"
        ) from None
