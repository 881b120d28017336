"""Fetching shards ahead of the reader: a thread that walks the planned ids, a bounded number of shards ahead."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError, StorageError

if TYPE_CHECKING:
    from .shards import Shards

__all__ = ["Prefetcher"]


class Prefetcher:
    """Fetches the shards of planned ids ahead of the reader, in a thread, at most ``ahead`` shards ahead.

    The reader calls :meth:`advance` with how many of ``ids`` it has read; the thread prepares shards in the order of
    their first use, never more than ``ahead`` whose first use is still to come (downloads overlap the reader; the
    cache is not filled with shards needed much later), and skips a shard the reader reached first (it fetched it
    itself; a late fetch could only bring back a shard already read and evicted: measured 1.8 downloads a shard
    at a quarter cache before this rule, 1.02 after). A shard the remote does not deliver (a StorageError) ends the
    prefetching: the read that needs that shard raises it (NOTE [ A shard's download: bounded, typed, ... ] in
    ``shards.py``), in the batch that needed it, and the shards after it would most likely wait in vain too. Any other
    error in the thread is raised by the next :meth:`advance`.

    Example::

        with Prefetcher(shards, plan.ids, ahead=4) as ahead:
            for k in range(plan.num_batches):
                batch = shards.read(plan.batch(k))
                ahead.advance((k + 1) * plan.batch_size)
    """

    def __init__(self, shards: Shards, ids: np.ndarray | Sequence[int], *, ahead: int = 4) -> None:
        if ahead < 1:
            raise ConfigError(f"ahead={ahead} must be >= 1")
        shard_of, _ = shards.index.locate(ids)
        unique, first = np.unique(shard_of, return_index=True)
        order = np.argsort(first)
        self._events = list(zip(first[order].tolist(), unique[order].tolist(), strict=True))
        self._shards = shards
        self._ahead = ahead
        self._position = 0
        self._closed = False
        self.error: BaseException | None = None
        self.failed = False  # stopped at a shard the remote did not deliver
        self.prepared = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gpufeed-stream-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for k, (first, shard) in enumerate(self._events):
                with self._cond:
                    while not self._closed and k >= self._ahead and self._events[k - self._ahead][0] >= self._position:
                        self._cond.wait()
                    if self._closed:
                        return
                    if first < self._position:
                        # the reader got there first (it fetches what it needs itself): fetching it now could only
                        # bring back a shard already read and evicted
                        continue
                self._shards.prepare(shard)
                self.prepared += 1
        except StorageError:  # kept by the shards for the read that needs it
            self.failed = True
        except BaseException as e:  # raised in the reader by advance()
            self.error = e

    def advance(self, position: int) -> None:
        """The reader has read ``ids[:position]``."""
        if self.error is not None:
            raise self.error
        with self._cond:
            self._position = position
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
