"""One pool of threads for the process, for work that releases the GIL: decoding files (libjpeg-turbo), resizing
boxes with Pillow. Threads start as work needs them; a forked child makes its own pool (it inherits the pool but
not its threads, and work handed to it would wait forever)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

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


def spread(each: Callable[[int], None], items: int, threads: int | None = None) -> None:
    """``each(i)`` for every ``i`` below ``items``, on ``threads`` workers (default the usable cores, at most
    ``items``): this thread and the pool's, each taking the next item as it finishes one (images of different
    sizes take different times: items dealt in turn left one worker idle at the end of each batch). An error stops
    the workers taking more and is raised here once every worker has stopped: this thread's own first (an item's,
    or a signal's: Ctrl-C), else a pool worker's."""
    workers = min(usable_cores() if threads is None else threads, items)
    if workers <= 1:
        for i in range(items):
            each(i)
        return
    order, lock = iter(range(items)), threading.Lock()
    stop = threading.Event()  # set: take no more items

    def work() -> None:
        while not stop.is_set():
            with lock:
                i = next(order, None)
            if i is None:
                return
            try:
                each(i)
            except BaseException:
                stop.set()
                raise

    others: list[Future[None]] = []
    try:
        for _ in range(workers - 1):
            others.append(pool().submit(work))
        work()
        for f in others:
            f.result()
    except BaseException:  # an item's error (this thread's first), a worker's, or a signal's (Ctrl-C)
        stop.set()
        wait(others)  # the items they hold finish; their errors give way to this one
        raise
