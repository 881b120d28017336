"""tune_dataloader(): the classic DataLoader's settings chosen by measurement, within a time budget.

Folklore says ``num_workers = os.cpu_count()``; measured, the best count depends on the per-sample
cost, the cores actually usable, the batch size and the copy to the device. The search:

1. the default settings (``num_workers=0``) -- the baseline every speed-up is quoted against;
2. worker counts doubling (1, 2, 4, ...) up to the usable cores, stopping once two steps in a row
   gain under 5%, then the midpoint next to the best when the budget allows;
3. ``prefetch_factor`` 2, 4, 8 at the best count; ``pin_memory`` on and off when the batches go to
   a GPU (the copy is part of what is timed).

Every trial is a fresh ``DataLoader`` over the dataset with its own generator: the caller's loaders,
epochs and random state are untouched. Throughput is measured over three timed slices after a
warm-up, each several times the prefetch depth (workers deliver in bursts), as their total samples
over their total time; the start-up time (workers, first batch) is kept separately, since persistent workers pay
it once per run instead of once per epoch.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset
from tqdm.auto import tqdm

from .device import resolve_device, usable_cores
from .errors import ConfigError
from .validate import as_int, as_workers, check_dataset
from .workers import loader_kwargs, start_method

__all__ = ["LoaderConfig", "Trial", "tune_dataloader"]


@dataclass(frozen=True)
class Trial:
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    images_per_s: float
    startup_s: float  # from iter() to the first batch
    spread: float = 0.0  # (fastest - slowest) slice rate / the trial's rate: the measurement's noise


@dataclass(frozen=True)
class LoaderConfig:
    """The chosen settings; ``DataLoader(dataset, **cfg.kwargs)``. ``table`` holds every trial."""

    batch_size: int
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    multiprocessing_context: str | None
    speedup: float  # over DataLoader's defaults (num_workers=0, pin_memory=False); 1.0 when within the noise
    table: tuple[Trial, ...] = field(repr=False, default=())
    notes: tuple[str, ...] = ()
    noise: float = 0.0  # the largest spread of the trials compared: gains below it are not counted

    def __post_init__(self) -> None:
        if self.num_workers < 0 or (self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor)):
            raise ConfigError(f"num_workers={self.num_workers} cannot have persistent workers or a prefetch factor")

    @property
    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
        }
        if self.num_workers > 0:
            kw.update(prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers)
            if self.multiprocessing_context:
                kw["multiprocessing_context"] = self.multiprocessing_context
        return kw


class _Clock:
    def __init__(self, budget_s: float) -> None:
        self.deadline = time.perf_counter() + budget_s

    @property
    def left(self) -> float:
        return self.deadline - time.perf_counter()


def _count(batch: Any) -> int:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(x.shape[0]) if isinstance(x, torch.Tensor) else 1


def _stream(loader: DataLoader) -> Iterator[Any]:
    """The loader's batches, pass after pass (a small dataset is measured over several epochs)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def _trial(
    dataset: Any,
    batch_size: int,
    workers: int,
    pin: bool,
    prefetch: int | None,
    device: torch.device,
    batches: int,
    collate_fn: Any,
) -> Trial:
    kw = loader_kwargs(workers, persistent=True, prefetch_factor=prefetch if workers else None)
    loader = DataLoader(dataset, batch_size, pin_memory=pin, collate_fn=collate_fn, **_order(dataset, 0), **kw)
    move = device.type == "cuda"
    # Workers deliver in bursts (while the consumer waits for batch k, the others finish k+1.. and queue them),
    # and up to workers * prefetch batches can be ready at once. Slices several times that long, and the rate
    # taken over all of them together (not a median of slice rates, which a burst makes look instant).
    depth = workers * (prefetch or 2)
    warm = max(2, depth)  # the first prefetch wave arrives at once: not steady state
    span = max(batches, 2 * depth)
    t0 = time.perf_counter()
    it = _stream(loader)
    next(it)
    startup = time.perf_counter() - t0
    for _ in range(warm):
        next(it)
    counts, times = [], []
    for _ in range(3):
        t, n = time.perf_counter(), 0
        for _ in range(span):
            batch = next(it)
            if move:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                x.to(device, non_blocking=pin)
            n += _count(batch)
        if move:
            torch.cuda.synchronize(device)
        counts.append(n)
        times.append(time.perf_counter() - t)
    del it, loader  # persistent workers end with their loader
    rate = sum(counts) / sum(times)
    rates = [n / t for n, t in zip(counts, times, strict=True)]
    return Trial(workers, pin, prefetch if workers > 0 else None, rate, startup, (max(rates) - min(rates)) / rate)


def _order(dataset: Any, seed: int) -> dict[str, Any]:
    """A map-style dataset shuffled by a generator of its own; an iterable one (a ``StreamingDataset``) keeps its
    order, which it makes itself and shares out to the workers."""
    if isinstance(dataset, IterableDataset):
        return {}
    return {"shuffle": True, "generator": torch.Generator().manual_seed(seed)}


def _memory_notes(dataset: Any) -> list[str]:
    notes = []
    for owner in (dataset, getattr(dataset, "dataset", None)):
        for name, value in getattr(owner, "__dict__", {}).items():
            if isinstance(value, (list, dict)) and len(value) > 100_000:
                notes.append(
                    f"{type(owner).__name__}.{name} is a Python {type(value).__name__} of {len(value):,} items: each "
                    "worker's copy grows as reference counts touch its pages, so memory rises with num_workers; "
                    "store it as a numpy array"
                )
    return notes


def tune_dataloader(
    dataset: Any,
    batch_size: int,
    time_budget_s: float = 60,
    *,
    device: str | torch.device | None = "cpu",
    max_workers: int | None = None,
    collate_fn: Any = None,
    step_s: float | None = None,
    progress: bool = True,
    on_trial: Callable[[Trial], None] | None = None,
) -> LoaderConfig:
    """Measure DataLoader settings for ``dataset`` and return the fastest as a :class:`LoaderConfig`.

    Args:
        dataset: the dataset, with its transform, as training will use it: map-style (shuffled per trial), or
            iterable (e.g. a ``StreamingDataset`` decoding its samples: it keeps its own order and worker shares).
        batch_size: the training batch size.
        time_budget_s: the search stops starting trials once this is spent (one may overrun it).
        device: where batches go; with ``"cuda"`` the copy is timed and ``pin_memory`` is tried.
        max_workers: the largest worker count tried; default the usable cores.
        step_s: seconds per training step, if known: says whether the loader is the bottleneck.
        progress: show the search's progress (a bar over the time budget).
        on_trial: called with each :class:`Trial` as soon as it is measured (the CLI prints it).

    A dataset of any size can be tuned: the timed slices run over several passes when an epoch is
    short, and the notes state the measurement's noise.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> cfg = tune_dataloader(TensorDataset(torch.zeros(512, 3)), batch_size=32, time_budget_s=2, max_workers=0)
        >>> cfg.kwargs
        {'batch_size': 32, 'num_workers': 0, 'pin_memory': False}
    """
    if not isinstance(dataset, IterableDataset):
        check_dataset(dataset)
    batch_size = as_int(batch_size, "batch_size", 1)
    if time_budget_s <= 0:
        raise ConfigError(f"time_budget_s={time_budget_s} must be > 0")
    dev = resolve_device(device)
    cores = usable_cores() if max_workers is None else as_workers(max_workers, "max_workers")
    ctx = start_method()
    clock = _Clock(time_budget_s)
    state = (random.getstate(), np.random.get_state())
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # torch warns when a trial starts more workers than it suggests; trying that is the point here.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        # Size the slices from one default batch, so each trial takes about 1/12 of the budget.
        probe = DataLoader(dataset, batch_size, collate_fn=collate_fn, **_order(dataset, 1))  # the trials' collate
        t = time.perf_counter()
        next(iter(probe))
        per_batch = max(time.perf_counter() - t, 1e-4)
        batches = int(max(2, time_budget_s / 12 / 4 / per_batch))  # over several passes of a small dataset
        table: list[Trial] = []
        bar = tqdm(total=round(time_budget_s), desc="gpufeed: tuning the DataLoader", unit="s", disable=not progress)

        def run(w: int, pin: bool = False, pf: int = 2) -> Trial:
            bar.set_postfix_str(f"num_workers={w}" + (f", prefetch {pf}" if w else "") + (", pinned" if pin else ""))
            trial = _trial(dataset, batch_size, w, pin, pf, dev, batches, collate_fn)
            table.append(trial)
            bar.n = min(bar.total, round(time_budget_s - clock.left))
            bar.refresh()
            if on_trial is not None:
                on_trial(trial)
            return trial

        run(0)
        best = table[0]
        flat = 0
        w = 1
        while w <= cores and clock.left > 0 and flat < 2:
            run(w)
            flat = flat + 1 if table[-1].images_per_s < 1.05 * best.images_per_s else 0
            best = max(best, table[-1], key=lambda r: r.images_per_s)
            w *= 2
        tried = {r.num_workers for r in table}
        for mid in (best.num_workers * 3 // 2, best.num_workers * 3 // 4):
            if 0 < mid <= cores and mid not in tried and clock.left > 0:
                run(mid)
                best = max(best, table[-1], key=lambda r: r.images_per_s)
        if best.num_workers > 0:
            for pf in (4, 8):
                if clock.left > 0:
                    run(best.num_workers, False, pf)
                    best = max(best, table[-1], key=lambda r: r.images_per_s)
        if dev.type == "cuda" and clock.left > 0:
            run(best.num_workers, True, best.prefetch_factor or 2)
            best = max(best, table[-1], key=lambda r: r.images_per_s)
        bar.close()
    random.setstate(state[0])
    np.random.set_state(state[1])
    base = table[0]
    # A gain no larger than the noise of the two trials compared is not a gain: the defaults are kept.
    compared = max(best.spread, base.spread)
    within_noise = best is not base and best.images_per_s / base.images_per_s - 1 <= compared
    if within_noise:
        fastest = best
        best = base
    memory = _memory_notes(dataset)
    for note in memory:
        warnings.warn(note, stacklevel=2)
    notes = list(memory)
    noise = max(t.spread for t in table)
    passes = (3 * batches + 2) * batch_size > len(dataset)  # the warm-up and timed slices outran one epoch
    notes.append(
        f"measurement noise: the three timed slices of a trial differed by up to {noise:.0%}; differences between "
        "trials smaller than that are not real"
        + (f" (its {len(dataset)} samples were measured over several passes)" if passes else "")
    )
    if within_noise:
        notes.append(
            f"no gain measured: the fastest trial (num_workers={fastest.num_workers}, "
            f"{fastest.images_per_s / base.images_per_s:.2f}x the defaults) is within the {compared:.0%} noise of "
            "the trials compared, so the default settings are kept; rerun with a larger time budget to measure "
            "a smaller difference"
        )
    if best.num_workers > 0:
        why = "forkserver, since CUDA is initialised here" if ctx else "the platform's default start method"
        notes.append(
            f"persistent_workers=True: starting {best.num_workers} workers ({why}) took "
            f"{best.startup_s:.2f} s to the first batch; persistent workers pay it once, not every epoch"
        )
    if step_s is not None and batch_size / table[0].images_per_s < step_s:
        notes.append(
            f"the default DataLoader already delivers a batch in {batch_size / table[0].images_per_s * 1e3:.1f}"
            f" ms, faster than the {step_s * 1e3:.1f} ms step: the loader is not the bottleneck, tuning "
            "cannot speed training up"
        )
    return LoaderConfig(
        batch_size,
        best.num_workers,
        best.pin_memory,
        best.prefetch_factor,
        best.num_workers > 0,
        ctx if best.num_workers > 0 else None,
        best.images_per_s / base.images_per_s,
        tuple(table),
        tuple(notes),
        compared,
    )
