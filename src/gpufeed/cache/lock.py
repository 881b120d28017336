"""One builder per cache entry across processes: an exclusive ``flock`` on a lock file beside it.

The kernel releases an ``flock`` when its holder exits, however it exits, so a builder that dies
never blocks the others: the next waiter takes the lock, finds no valid entry, and builds it.
Waiting is bounded (``timeout_s``) and the error names the lock file and its last holder.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import CacheError

__all__ = ["build_lock"]


@contextmanager
def build_lock(target: Path, timeout_s: float = 3600.0, poll_s: float = 0.1) -> Iterator[None]:
    """Hold the build lock of the entry ``target`` (created next to it) for the ``with`` block."""
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent / f".{target.name}.lock"
    deadline = time.monotonic() + timeout_s
    with open(path, "a+") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.seek(0)
                    holder = f.read().strip() or "unknown"
                    raise CacheError(
                        f"waited {timeout_s:.0f} s for {path} (held by pid {holder}) to build {target}; if no build is "
                        "running, delete the lock file"
                    ) from None
                time.sleep(poll_s)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
