"""ahead(): items made by a thread, a bounded number ahead of the consumer, handed out in order.

The stream loader's reader (shard reads, headers, the batched decode) runs here while the consumer trains on the
batch before. The thread stops when the consumer closes the iterator (``break``, an exception, the epoch's end): a
bounded queue never holds more than ``depth`` made items, and a thread waiting to put one wakes to the stop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ..errors import ConfigError

__all__ = ["Ahead"]

T = TypeVar("T")

_POLL = 0.1  # seconds a blocked put or get waits before it looks at the stop flag again


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class Ahead(Generic[T]):
    """``make(0)``, ``make(1)``, ... ``make(count - 1)`` computed in a thread, at most ``depth`` ahead of the
    consumer. An exception raised by ``make(k)`` is raised by the consumer's ``k``-th ``next``, after the items
    before it. :meth:`close` (or ``with``) stops the thread; idempotent.

    Example:
        >>> with Ahead(lambda k: k * k, count=4, depth=2) as squares:
        ...     list(squares)
        [0, 1, 4, 9]
    """

    def __init__(self, make: Callable[[int], T], count: int, depth: int = 2, name: str = "gpufeed-ahead") -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"depth={depth!r} must be an int >= 1")
        self._make, self._count = make, count
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        for k in range(self._count):
            if self._stop.is_set():
                return
            try:
                item: object = self._make(k)
            except BaseException as e:  # raised in the consumer, at this item's place
                self._put(_Failed(e))
                return
            if not self._put(item):
                return
        self._put(_END)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        while not self._done:
            try:
                item = self._queue.get(timeout=_POLL)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():  # stopped by close() from elsewhere
                    break
                continue
            if item is _END:
                break
            if isinstance(item, _Failed):
                self.close()
                raise item.error
            return item  # type: ignore[return-value]
        self._done = True
        raise StopIteration

    def close(self) -> None:
        """Stop the thread and drop what it made ahead."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # a put in progress finds room, then sees the stop
                self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(_POLL)

    def __enter__(self) -> Ahead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
