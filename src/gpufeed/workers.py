"""DataLoader worker settings, decided in one place for every DataLoader gpufeed builds.

Ingestion, the per-sample fallback, ``gpufeed train``'s baseline loaders and ``tune_dataloader``
all start worker processes; they share these rules:

- the default count is the usable cores (the affinity mask, which containers narrow), at most 16;
  none for a job too small to repay their start-up, or on a single core;
- a process whose CUDA is initialised never forks workers (a forked child with live CUDA state
  crashed in a measured run): ``forkserver`` then;
- persistent workers where a loader runs several epochs, so start-up (seconds with forkserver) is
  paid once.
"""

from __future__ import annotations

from typing import Any

import torch

from .device import usable_cores

__all__ = ["MAX_WORKERS", "default_workers", "loader_kwargs", "start_method"]

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
