"""prefetch(): move batches from any iterable to the device, copies overlapped with compute.

NOTE [ Stream ownership in prefetch ]
CUDA streams are created here and in ``stream.py`` (its reader decodes on a side stream by the same rules). Per
batch, in order:

1. The host tensors are pinned (``pin_memory()``; already-pinned ones are used as they are),
   so the copy can be asynchronous. The pinned buffer comes from torch's caching host
   allocator, which records the copy on the copy stream and does not reuse the buffer before
   that copy has finished, so dropping our reference early is safe.
2. On a side *copy stream*, ``.to(device, non_blocking=True)`` enqueues the copy and an event is
   recorded after it. Up to ``depth`` batches are in flight ahead of the one being consumed.
3. When the batch is handed out, the *consumer's* current stream waits on that event (a device
   side wait: the host does not block), so no kernel reads the batch before it has arrived.
4. Each device tensor was allocated on the copy stream; ``record_stream(consumer)`` tells the
   caching allocator that the consumer uses it, so its memory is not given to a later copy
   until the consumer's queued work on it is done, even after the caller drops the tensor.

The source iterable must hand out a fresh tensor per batch (``DataLoader`` does): a source that
rewrites one buffer in place would race with the copies still in flight.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from ..device import resolve_device
from ..errors import ConfigError

__all__ = ["prefetch"]

T = TypeVar("T")


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, lists, namedtuples and dicts; other leaves pass through."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: map_tensors(v, fn) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(v, fn) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


def _tensors(batch: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(batch, lambda t: found.append(t) or t)  # type: ignore[func-returns-value]
    return found


class _Failed:
    """An exception raised by the source, kept in its place in the queue."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def lookahead(
    source: Iterable[Any], depth: int, start: Callable[[Any], Any], finish: Callable[[Any], T]
) -> Iterator[T]:
    """Yield ``finish(start(item))`` per item, with ``depth`` items started ahead of the one yielded.

    An exception raised by ``source`` is re-raised where it happened in the sequence, after the
    items before it have been yielded.
    """
    it = iter(source)
    pending: deque[Any] = deque()
    more = True

    def fill() -> None:
        nonlocal more
        while more and len(pending) < depth:
            try:
                pending.append(start(next(it)))
            except StopIteration:
                more = False
            except Exception as e:
                pending.append(_Failed(e))
                more = False

    fill()
    while pending:
        item = pending.popleft()
        fill()  # start the next copies before handing this batch out, so they overlap its compute
        if isinstance(item, _Failed):
            raise item.error
        yield finish(item)


class Prefetcher(Iterable[T]):
    """Re-iterable wrapper returned by :func:`prefetch`; ``len()`` is the source's length."""

    def __init__(self, iterable: Iterable[T], device: torch.device, depth: int) -> None:
        self.iterable, self.device, self.depth = iterable, device, depth

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        if self.device.type != "cuda":
            return iter(self.iterable)
        device = self.device
        with torch.cuda.device(device):
            copy_stream = torch.cuda.Stream(device)

        def start(batch: Any) -> tuple[Any, torch.cuda.Event]:
            with torch.cuda.device(device), torch.cuda.stream(copy_stream):  # NOTE [ Stream ownership ] 1-2
                moved = map_tensors(batch, lambda t: _pinned(t).to(device, non_blocking=True))
                event = torch.cuda.Event()
                event.record(copy_stream)
            return moved, event

        def finish(item: tuple[Any, torch.cuda.Event]) -> Any:
            moved, event = item
            consumer = torch.cuda.current_stream(device)
            consumer.wait_event(event)  # NOTE [ Stream ownership ] 3
            for t in _tensors(moved):
                if t.device == device:
                    t.record_stream(consumer)  # NOTE [ Stream ownership ] 4
            return moved

        return lookahead(self.iterable, self.depth, start, finish)


def _pinned(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "cpu" or t.is_pinned():
        return t
    return t.pin_memory()


def prefetch(iterable: Iterable[T], device: str | torch.device | None = None, depth: int = 2) -> Prefetcher[T]:
    """Copy each batch of ``iterable`` to ``device`` ahead of use, on a side CUDA stream.

    Batches may be tensors or nested tuples, lists, namedtuples and dicts of tensors; other leaves
    pass through. On the CPU it is a plain pass-through. An exception raised by the source
    surfaces at the batch where it happened, after the batches before it.

    Args:
        iterable: yields CPU batches, e.g. a ``torch.utils.data.DataLoader``.
        device: target device; ``None``: CUDA if available, else CPU.
        depth: batches in flight ahead of the one in use.

    Example:
        >>> import torch
        >>> [b.tolist() for b in prefetch([torch.ones(2)], device="cpu")]
        [[1.0, 1.0]]
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"depth={depth!r} must be an int >= 1")
    return Prefetcher(iterable, resolve_device(device), depth)
