"""One pool of threads for the process, for work that releases the GIL: decoding files (libjpeg-turbo), resizing
boxes with Pillow. Threads start as work needs them; a forked child makes its own pool (it inherits the pool but
not its threads, and work handed to it would wait forever)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .device import usable_cores

__all__ = ["pool", "spread"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The process's pool."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(64, thread_name_prefix="gpufeed-work")
        return _POOL


def _forget_pool() -> None:
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def spread(part: Callable[[int, int], None], items: int, threads: int | None = None) -> None:
    """``part(first, step)`` for each ``first`` below the number of workers (``threads``, default the usable cores,
    at most ``items``): each worker takes every ``step``-th item from its first, on the pool's threads while this
    one waits (one worker: in this thread). An exception in any part is raised here."""
    workers = min(usable_cores() if threads is None else threads, items)
    if workers > 1:
        list(pool().map(part, range(workers), [workers] * workers))
    else:
        part(0, 1)
