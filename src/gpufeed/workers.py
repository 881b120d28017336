"""DataLoader worker settings, decided in one place for every DataLoader gpufeed builds.

Ingestion, the per-sample fallback, ``gpufeed train``'s baseline loaders and ``tune_dataloader``
all start worker processes; they share these rules:

- the default count is the usable cores (the affinity mask, which containers narrow), at most 16;
  none for a job too small to repay their start-up, or on a single core;
- a process whose CUDA is initialised never forks workers (a forked child with live CUDA state
  crashed in a measured run): ``forkserver`` then;
- persistent workers where a loader runs several epochs, so start-up (seconds with forkserver) is
  paid once;
- a worker that died is found by :func:`dead_workers` and its iterator's other workers stopped by
  :func:`stop_workers`, so that the loader can start fresh ones (torch's persistent iterator never does).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import torch

from .device import usable_cores

__all__ = [
    "MAX_WORKERS",
    "dead_workers",
    "default_workers",
    "loader_kwargs",
    "start_method",
    "stop_workers",
    "workers_that_died",
]

MAX_WORKERS = 16
_SMALL_JOB = 2048  # samples: below this, starting workers costs more than they save


def default_workers(samples: int | None = None) -> int:
    """Workers for a loader over ``samples`` samples: the usable cores (at most 16), 0 for small jobs or one core.

    Example:
        >>> default_workers(samples=100)
        0
    """
    cores = usable_cores()
    if cores < 2 or (samples is not None and samples < _SMALL_JOB):
        return 0
    return min(MAX_WORKERS, cores)


def start_method() -> str | None:
    """``"forkserver"`` when CUDA is initialised in this process (never fork it), else the platform default."""
    return "forkserver" if torch.cuda.is_initialized() else None


def loader_kwargs(num_workers: int, *, persistent: bool = False, prefetch_factor: int | None = None) -> dict[str, Any]:
    """``DataLoader`` keyword arguments for ``num_workers`` workers under the rules above.

    Example:
        >>> loader_kwargs(0, persistent=True)
        {'num_workers': 0}
    """
    kwargs: dict[str, Any] = {"num_workers": num_workers}
    if num_workers > 0:
        if persistent:
            kwargs["persistent_workers"] = True
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
        method = start_method()
        if method is not None:
            kwargs["multiprocessing_context"] = method
    return kwargs


def dead_workers(iterator: Any) -> list[str]:
    """The workers of a ``DataLoader`` ``iterator`` that died, each as ``"<index> (pid <pid>) <cause>"``.

    ``[]`` for an iterator without workers, or one that stopped them itself. Reads torch's private
    ``_workers`` / ``_shutdown``: there is no public way to ask a ``DataLoader`` about its workers.
    """
    if iterator is None or getattr(iterator, "_shutdown", False):
        return []
    dead = []
    for index, worker in enumerate(getattr(iterator, "_workers", [])):
        if worker.is_alive():
            continue
        code = worker.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            cause = f"was killed by {name}"
        else:
            cause = f"exited with code {code}"
        dead.append(f"{index} (pid {worker.pid}) {cause}")
    return dead


def workers_that_died(iterator: Any, error: BaseException, wait_s: float = 5.0) -> list[str]:
    """:func:`dead_workers` after ``error`` was raised while taking a batch. A worker killed while it passed a
    batch's shared memory closes its end of the socket before the kernel reports the process gone: the parent
    reads an ``EOFError`` (or a reset connection) from a worker torch still sees alive, so the workers are asked
    again for up to ``wait_s`` seconds before the error is taken for something else. Any other error is
    answered at once."""
    dead = _asked(iterator)
    if dead or not isinstance(error, (EOFError, ConnectionError)):
        return dead
    deadline = time.monotonic() + wait_s
    while not dead and time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except RuntimeError as e:  # torch's SIGCHLD handler, run here: the death being waited for (asked below)
            if "DataLoader worker" not in str(e):
                raise
        dead = _asked(iterator)
    return dead


def _asked(iterator: Any) -> list[str]:
    """:func:`dead_workers`, through torch's SIGCHLD handler: Python runs it in the main thread whenever the signal
    comes (a thread that does not block SIGCHLD takes it even while the main thread does), and it raises its own
    RuntimeError for a dead worker, here too; the worker is then asked again."""
    for _ in range(3):
        try:
            return dead_workers(iterator)
        except RuntimeError as e:
            if "DataLoader worker" not in str(e):
                raise
    return dead_workers(iterator)


def stop_workers(iterator: Any) -> None:
    """Stop the remaining workers of a ``DataLoader`` ``iterator`` and unregister them from torch's SIGCHLD check."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
