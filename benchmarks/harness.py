"""Shared timing harness for gpufeed benchmarks.

Every figure is the median over repeated epochs after a warm-up epoch, with the device
synchronised before each clock read; the first epoch and the time to the first batch are kept
separately, since start-up costs (worker processes, cuDNN tuning, caches) hide there.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpufeed.device import environment as _environment
from gpufeed.device import sync

__all__ = ["Timing", "environment", "print_table", "save_json", "time_epochs"]


@dataclass
class Timing:
    name: str
    images: int  # images per epoch
    first_batch_s: float
    first_epoch_s: float
    epoch_s: float  # median of the steady-state epochs
    epochs_s: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def images_per_s(self) -> float:
        return self.images / self.epoch_s

    def row(self, baseline: Timing | None) -> dict[str, Any]:
        d = asdict(self)
        d["images_per_s"] = round(self.images_per_s)
        d["speedup"] = round(baseline.epoch_s / self.epoch_s, 2) if baseline else None
        return d


def _batch_size(batch: Any) -> int:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(x.shape[0])


def time_epochs(
    name: str,
    make_epoch: Callable[[], Iterable[Any]],
    device: torch.device,
    repeats: int = 3,
    consume: Callable[[Any], None] | None = None,
    note: str = "",
) -> Timing:
    """Time one warm-up epoch (also giving time to first batch) and ``repeats`` steady epochs.

    ``make_epoch()`` returns the iterable of one epoch; ``consume(batch)`` stands for the work a
    training step would do with it (e.g. the host-to-device copy of a CPU loader).
    """
    sync(device)
    t0 = time.perf_counter()
    first_batch = None
    images = 0
    for batch in make_epoch():
        if consume is not None:
            consume(batch)
        if first_batch is None:
            sync(device)
            first_batch = time.perf_counter() - t0
        images += _batch_size(batch)
    sync(device)
    first_epoch = time.perf_counter() - t0
    epochs = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for batch in make_epoch():
            if consume is not None:
                consume(batch)
        sync(device)
        epochs.append(time.perf_counter() - t)
    return Timing(name, images, first_batch or 0.0, first_epoch, statistics.median(epochs), epochs, note)


def environment(device: torch.device, **sizes: Any) -> dict[str, Any]:
    """Date, hardware and versions, recorded beside every figure (gpufeed's own, so all agree)."""
    return dict(_environment(device, **sizes))


def print_table(rows: list[Timing], baseline: Timing | None = None) -> None:
    header = f"{'loader':<58} {'epoch s':>9} {'img/s':>11} {'speedup':>8} {'1st epoch s':>11} {'1st batch s':>11}"
    print(header)
    print("-" * len(header))
    for r in rows:
        speed = f"{baseline.epoch_s / r.epoch_s:7.1f}x" if baseline else ""
        print(
            f"{r.name:<58} {r.epoch_s:9.4f} {r.images_per_s:11,.0f} {speed:>8} {r.first_epoch_s:11.3f} "
            f"{r.first_batch_s:11.4f}"
        )


def save_json(
    path: Path, env: dict[str, Any], rows: list[Timing], baseline: Timing | None = None, **extra: Any
) -> None:
    """``{"environment": env, "rows": [...], **extra}`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"environment": env, "rows": [r.row(baseline) for r in rows], **extra}
    path.write_text(json.dumps(payload, indent=2, default=str))
