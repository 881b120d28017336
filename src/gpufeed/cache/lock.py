"""One builder per cache entry across processes: an exclusive ``flock`` on a lock file beside it.

The kernel releases an ``flock`` when its holder exits, however it exits, so a builder that dies
never blocks the others: the next waiter takes the lock, finds no valid entry, and builds it.
The holder writes who it is (pid, host, since when, what it builds) into the lock file; a waiter
says so on stderr within ``announce_s`` seconds, shows the wait as a progress bar, and gives up
after ``timeout`` seconds with a :class:`~gpufeed.errors.CacheError` that names the holder.

Only building takes the lock: reading a valid entry needs none (entries appear by one rename),
so a cache in a read-only location is usable.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO

from ..errors import CacheError, CacheWriteError, ConfigError

__all__ = ["DEFAULT_LOCK_TIMEOUT_S", "LOCK_TIMEOUT_ENV", "build_lock", "lock_timeout"]

LOCK_TIMEOUT_ENV = "GPUFEED_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 3600.0  # a large ImageFolder can take many minutes to build


def lock_timeout(value: float | None) -> float:
    """Seconds to wait for another process's build: ``value``, else ``$GPUFEED_LOCK_TIMEOUT``, else an hour."""
    source = "lock_timeout"
    if value is None:
        env = os.environ.get(LOCK_TIMEOUT_ENV)
        if not env:
            return DEFAULT_LOCK_TIMEOUT_S
        source, value = LOCK_TIMEOUT_ENV, env  # type: ignore[assignment]
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not seconds >= 0:
        raise ConfigError(f"{source}={value!r} must be a number of seconds >= 0 (0: do not wait, inf: no limit)")
    return seconds


def _holder(f: IO[bytes]) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace").strip()
    try:
        h = json.loads(text)
        since = datetime.fromtimestamp(h["since"]).isoformat(sep=" ", timespec="seconds")
        ago = time.time() - h["since"]
        return f"pid {h['pid']} on {h['host']} since {since} ({ago:.0f} s ago)"
    except (ValueError, KeyError, TypeError):
        return f"pid {text}" if text.isdigit() else "an unknown process"


@contextmanager
def build_lock(
    target: Path,
    timeout: float | None = None,
    *,
    progress: bool = True,
    announce_s: float = 2.0,
    poll_s: float = 0.1,
) -> Iterator[None]:
    """Hold the build lock of the entry ``target`` (a file ``.<name>.lock`` beside it) for the ``with`` block.

    Raises CacheWriteError if the lock file cannot be created (a read-only location), CacheError
    when ``timeout`` seconds pass while another process holds it.
    """
    timeout_s = lock_timeout(timeout)
    path = target.parent / f".{target.name}.lock"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+b", buffering=0)  # unbuffered: a full disk fails the write, not a later close
    except OSError as e:
        raise CacheWriteError(
            f"cannot create the build lock {path} ({e.strerror or e}): the cache location is not writable, so "
            f"{target} cannot be built there; choose a writable location (cache root: GPUFEED_CACHE_DIR / "
            "--cache-dir / accelerate(..., cache=ROOT)), or accelerate(..., cache=False)"
        ) from None
    with f:
        _acquire(f, path, target, timeout_s, progress, announce_s, poll_s)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "target": str(target)}
        try:  # who holds it, for a waiting process to name; a full disk refuses even these few bytes
            f.seek(0)
            f.truncate()
            f.write(json.dumps(record).encode())
        except OSError as e:
            fcntl.flock(f, fcntl.LOCK_UN)
            raise CacheWriteError(
                f"cannot write the build lock {path} ({e.strerror or e}): the cache location has no room or no "
                f"right to write, so {target} cannot be built there; free space or choose another location (cache "
                "root: GPUFEED_CACHE_DIR / --cache-dir / accelerate(..., cache=ROOT)), or accelerate(..., cache=False)"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _acquire(
    f: IO[bytes], path: Path, target: Path, timeout_s: float, progress: bool, announce_s: float, poll_s: float
) -> None:
    start = time.monotonic()
    bar = None
    try:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            waited = time.monotonic() - start
            if waited >= timeout_s:
                raise CacheError(
                    f"gave up after {timeout_s:.0f} s waiting for {path}: {_holder(f)} is building {target}. The lock "
                    "is released when its holder exits, so that process is still running: wait longer "
                    f"(lock_timeout= or {LOCK_TIMEOUT_ENV}=SECONDS), or stop it"
                )
            if bar is None and waited >= min(announce_s, timeout_s):
                limit = f"giving up after {timeout_s:.0f} s" if math.isfinite(timeout_s) else "no time limit"
                print(
                    f"gpufeed: waiting for {_holder(f)} to finish building {target} (lock {path}); {limit}",
                    file=sys.stderr,
                    flush=True,
                )
                from tqdm.auto import tqdm

                total = round(timeout_s) if math.isfinite(timeout_s) else None
                bar = tqdm(total=total, desc="gpufeed: waiting for the cache build", unit="s", disable=not progress)
            if bar is not None and round(waited) != bar.n:
                bar.n = round(waited) if bar.total is None else min(bar.total, round(waited))
                bar.refresh()
            time.sleep(poll_s)
    finally:
        if bar is not None:
            bar.close()
