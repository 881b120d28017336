"""The fix, measured: gf.accelerate beside the script's own DataLoader, on a part of its dataset that fits a budget.

It runs inside the watched script's process once its measured steps are done (:mod:`gpufeed.watch.hook` calls it
at the stop or at exit), on the same device and data: one sample piloted through the script's transform sets how
many of the first samples fit the budget (``k``); then ``gf.accelerate`` on them (its plan, the time it took to
read them in and what it stored, in memory and in a scratch cache, its images per second over an epoch after a
warm-up epoch) and the script's ``DataLoader`` rebuilt with the same settings on the same samples, iterated alone
with each batch copied to the device as training would. If accelerate refuses the dataset or its transform, or
time is left and the loader has fewer workers than cores, ``tune_dataloader``'s settings in what is left.
:mod:`gpufeed.watch.predict` turns the figures into the loop's predicted step and the fix's one-time cost.

NOTE [ The script's state is left as found ]
The measurement draws random numbers (shuffling, accelerate's probe, augmentations) and may build DataLoaders; the
global RNG states (torch, numpy, random, CUDA) are saved before and restored after, so whatever the process does
next draws what it would have drawn. The script's own loader and dataset are read, never changed: the loaders here
are new objects over a ``Subset``.

Example (a dataset of tensors: accelerate stores it and batches on the device):
    >>> import torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> ds = TensorDataset(torch.zeros(64, 3, 8, 8, dtype=torch.uint8), torch.zeros(64, dtype=torch.long))
    >>> out = side_measurement(DataLoader(ds, batch_size=16), budget_s=5, device="cpu")
    >>> out["samples"], out["accelerate"]["img_s"] > 0, out["script_loader"]["img_s"] > 0
    (64, True, True)
"""

from __future__ import annotations

import gc
import math
import os
import random
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler, Subset

from ..augment import compiler, fusion
from ..device import resolve_device, sync, usable_cores
from ..errors import ConfigError, DataError, UnsupportedTransformError
from ..loading.prefetch import map_tensors
from ..validate import UnbatchableError
from .found import batch_size_of, drop_last_of, order_sampler
from .hf import accelerate_kwargs, is_hf_dataset

__all__ = ["TUNE_BUDGET_S", "side_measurement", "subset_size"]

TUNE_BUDGET_S = 15.0  # the most tune_dataloader gets when accelerate refuses
_SAMPLES = 384  # "a few hundred": enough batches for a rate, little enough to read in seconds
_MIN_TIMED_S = 0.5  # timed epochs repeat until this much time is measured (tiny subsets run in milliseconds)
_READ_SHARE = 0.3  # of the budget, for reading the part in (accelerate's read; the script loader's first pass)
_MIN_TUNE_S = 4.0  # tune_dataloader for the worker advice only when this much of the budget is left
_REFUSALS = (UnsupportedTransformError, UnbatchableError, ConfigError, DataError)


def subset_size(n: int, batch_size: int, num_workers: int = 0) -> int:
    """How many of ``n`` samples to measure when time allows: whole batches, at least 2 (and 2 per worker, up to 8
    batches, so every worker delivers more than its first batch), about :data:`_SAMPLES` when the batches are
    small. :func:`fitted` cuts it to the budget.

    Example:
        >>> subset_size(50_000, 256, 4), subset_size(50_000, 32), subset_size(100, 64)
        (2048, 384, 64)
    """
    batches = max(2, math.ceil(_SAMPLES / batch_size), min(2 * num_workers, 8))
    return max(1, min(n // batch_size, batches)) * batch_size if n >= batch_size else n


def fitted(wanted: int, batch_size: int, sample_s: float, budget_s: float) -> tuple[int, int]:
    """``(samples, batch size)`` to measure: ``wanted`` (whole batches), cut so that reading them in takes about
    :data:`_READ_SHARE` of ``budget_s`` at ``sample_s`` a sample (the piloted time of one sample through the
    script's transform). Fewer samples than one batch are measured at a smaller batch size, never under 2.

    Example:
        >>> fitted(2048, 256, 0.001, 20.0), fitted(2048, 256, 0.02, 20.0), fitted(384, 32, 2.0, 20.0)
        ((2048, 256), (256, 256), (3, 3))
    """
    cap = max(2, int(_READ_SHARE * budget_s / max(sample_s, 1e-9)))
    if cap >= wanted:
        return wanted, batch_size
    if cap >= batch_size:
        return cap // batch_size * batch_size, batch_size
    k = min(cap, wanted)
    return k, k


def side_measurement(loader: DataLoader, budget_s: float = 20.0, device: str | torch.device | None = None) -> dict:
    """Measure ``gf.accelerate`` and the script's own loader settings on a part of its dataset that fits the budget.

    Args:
        loader: the script's ``DataLoader`` (the one it iterated most); read, not changed.
        budget_s: the time this may take: one sample is piloted through the script's transform first, and the
            part measured is cut so that reading it in takes about a third of the budget; epochs are only
            started when they fit (the tuning gets what is left, at most :data:`TUNE_BUDGET_S`).
        device: where the script trains (batches are made or copied there).

    Returns a dict (JSON-ready): ``samples`` (measured), ``dataset_samples``, ``batch_size`` (the script's),
    ``measured_batch_size``, ``sample_s`` (the pilot), ``device``, ``budget_s``, ``seconds``, ``notes``;
    ``script_loader`` (``img_s``, ``settings``); either ``accelerate`` (``plan``: its text, ``img_s``, ``build_s``:
    reading the part in, ``storage``, ``memory_bytes`` and ``disk_bytes`` for the part (what ``cache="auto"``
    writes; 0: nothing), ``cache_root``: where a run writes it, ``files_bytes``: the part's image files, when
    known) or ``refused`` (``error``, ``reason``); and ``tuned`` (``kwargs``, ``img_s``, ``speedup``) when
    accelerate refused, or when time was left and the loader has fewer workers than cores. Never raises an
    ``Exception``: any failure gives ``{"error": "..."}`` (a ``KeyboardInterrupt`` goes on).
    """
    start = time.perf_counter()
    try:
        # gf.accelerate's eager ops, measured: its fused kernels' compile (tens of seconds to minutes cold) would
        # blow the budget, and in a run it happens in the background, never before the first batch (issue 45)
        with _random_state_kept(), fusion.eager():
            out = _measure(loader, float(budget_s), resolve_device(device), start)
        if compiler.setting():
            out.setdefault("notes", []).append(
                "gf.accelerate measured with its eager ops: in a run, a recipe's fused kernels (ColorJitter, "
                "RandomResizedCrop) compile in the background and take over when ready, with the same pixels; their "
                "compile is not part of the one-time cost (nothing waits on it)"
            )
    except Exception as e:  # the report says what failed; the script's own exit is not disturbed
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - start, "budget_s": budget_s}
    out["seconds"] = time.perf_counter() - start
    return out


def _measure(loader: DataLoader, budget_s: float, device: torch.device, start: float) -> dict[str, Any]:
    # NOTE: a loader Accelerate prepared (a Trainer's too) has batch_size=None and a batch sampler that keeps the
    # script's batch size and order (its BatchSamplerShard over the script's BatchSampler and RandomSampler)
    dataset, batch_size, order = loader.dataset, batch_size_of(loader), order_sampler(loader)
    if batch_size is None:
        batches = getattr(loader, "batch_sampler", None)
        made_by = f"its batch_sampler ({type(batches).__name__}) has no batch_size" if batches is not None else ""
        return {
            "error": f"the loader has batch_size=None and {made_by or 'no batch_sampler (no automatic batching)'}: "
            "no batch size to measure at"
        }
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return {
            "error": f"{type(dataset).__name__} is an iterable-style dataset: gf.accelerate needs a map-style "
            "dataset (indexable, with a length)"
        }
    n = len(dataset)
    sample_s = _pilot(dataset, n)
    k, measured_batch = fitted(subset_size(n, batch_size, loader.num_workers), batch_size, sample_s, budget_s)
    subset = _part(dataset, k)
    given = accelerate_kwargs(dataset, loader.collate_fn)  # a Hugging Face dataset's recipe, as the change passes it
    # a DistributedSampler (torchrun, Lightning, Accelerate) shuffles when its shuffle says so
    shuffle = isinstance(order, RandomSampler) or getattr(order, "shuffle", False) is True
    out: dict[str, Any] = {
        "samples": k, "dataset_samples": n, "batch_size": batch_size, "measured_batch_size": measured_batch,
        "sample_s": sample_s, "device": str(device), "budget_s": budget_s, "notes": [],
    }  # fmt: skip
    if measured_batch < batch_size:
        out["notes"].append(
            f"measured at batch_size={measured_batch}: one sample took {sample_s * 1e3:.0f} ms through the script's "
            f"transform, so a batch of {batch_size} would not fit the {budget_s:g} s budget (the rates are per sample)"
        )
    elif k < 2 * batch_size:
        out["notes"].append(f"{k} samples measured: fewer than 2 batches of {batch_size}")
    kind = type(order).__name__
    if not isinstance(order, (RandomSampler, SequentialSampler)):  # Accelerate's SeedableRandomSampler is one
        order = "shuffled" if shuffle else "in order"
        out["notes"].append(f"the script's {kind} is replaced by the samples {order}, in one process")
    deadline = start + budget_s
    from ..cache.location import default_cache_dir
    from ..pipeline.accelerate import accelerate

    cache_root = str(default_cache_dir())  # where a run of the fix writes its cache: the script's own setting
    # NOTE [ extrapolating the read-in ]: what reading the whole dataset in costs is extrapolated from three reads:
    # 2 samples first (the process's first call pays its warm-up: lazy imports, thread pools), then the part, then
    # a quarter of it: their difference is the cost per sample. Scaling one call's time scaled its fixed costs too
    # and overestimated by 15-50% at 2.7x the part; two reads, the smaller first, took the warm-up for a cost per
    # sample and underestimated by 30-45% (benchmarks/diagnose_prescription.py).
    first = _read_in(dataset, 2, measured_batch, device, accelerate, given) if n > k >= 8 else None
    with tempfile.TemporaryDirectory(prefix="gpufeed-side-") as scratch, _cache_dir(scratch):
        t0 = time.perf_counter()
        try:  # rank 0 of 1: every sample of the part, whatever process group the script set up. cache="auto"
            # into a scratch root, as a run would decide it: what it writes is measured, then removed
            fast = accelerate(
                subset,
                measured_batch,
                shuffle,
                device=device,
                cache="auto",
                progress=False,
                rank=0,
                world_size=1,
                **given,
            )
        except _REFUSALS as e:
            out["refused"] = {"error": type(e).__name__, "reason": str(e)}
        else:
            build_s = time.perf_counter() - t0
            rate, note = _rate(fast, device, start + budget_s * 0.6)  # the rest for the script's loader
            plan = fast.plan
            assert plan is not None  # accelerate attaches its plan to every loader it builds
            shown = str(plan).replace(scratch, "(a scratch folder, removed after)")
            out["accelerate"] = {
                "plan": shown, "img_s": rate, "build_s": build_s, "storage": plan.storage,
                "memory_bytes": int(plan.bytes) if plan.storage != "fallback" else 0,
                "disk_bytes": _tree_bytes(Path(scratch)), "cache_root": cache_root,
                "files_bytes": _files_bytes(subset),
            }  # fmt: skip
            if first is not None and (quarter := _read_in(dataset, k // 4, measured_batch, device, accelerate, given)):
                out["accelerate"]["reads"] = {"first": first, "part": (k, build_s), "quarter": quarter}
            out["notes"] += [f"accelerate: {note}"] if note else []
            del fast
    out["script_loader"] = _script_rate(loader, subset, shuffle, measured_batch, device, deadline, out["notes"])
    left = deadline - time.perf_counter()
    if "refused" in out or (loader.num_workers < usable_cores() and left >= _MIN_TUNE_S):
        budget = min(TUNE_BUDGET_S, max(2.0, left - 1.0))
        out["tuned"] = _tuned(subset, measured_batch, device, budget, loader.collate_fn)
    return out


def _read_in(
    dataset: Any, k: int, batch: int, device: torch.device, accelerate: Any, given: dict[str, Any]
) -> tuple[int, float] | None:
    """``(k, seconds)``: ``gf.accelerate`` reading the first ``k`` samples in (its own scratch cache), or None when
    accelerate refuses them (the main call then says why)."""
    with tempfile.TemporaryDirectory(prefix="gpufeed-side-") as scratch, _cache_dir(scratch):
        t0 = time.perf_counter()
        try:
            loader = accelerate(_part(dataset, k), min(batch, k), False, device=device, cache="auto",
                                progress=False, rank=0, world_size=1, **given)  # fmt: skip
        except _REFUSALS:
            return None
        seconds = time.perf_counter() - t0
        del loader
    return k, seconds


def _part(dataset: Any, k: int) -> Any:
    """The first ``k`` samples: a ``Subset``, or a Hugging Face dataset's own ``select`` (gf.accelerate reads a
    ``datasets.Dataset``, not a torch wrapper of one; the view keeps its ``set_transform`` function)."""
    return dataset.select(range(k)) if is_hf_dataset(dataset) else Subset(dataset, range(k))


def _pilot(dataset: Any, n: int) -> float:
    """Seconds per sample through the script's own ``__getitem__`` (its transform included): the second of two
    samples (the first pays one-time costs: a lazily opened file, a decoder's tables), or the first alone."""
    times = []
    for i in range(min(2, n)):
        t0 = time.perf_counter()
        dataset[i]
        times.append(time.perf_counter() - t0)
    return times[-1] if times else 0.0


@contextmanager
def _cache_dir(root: str) -> Iterator[None]:
    """``GPUFEED_CACHE_DIR`` set to ``root`` for accelerate's default cache location, then as it was."""
    before = os.environ.get("GPUFEED_CACHE_DIR")
    os.environ["GPUFEED_CACHE_DIR"] = root
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GPUFEED_CACHE_DIR", None)
        else:
            os.environ["GPUFEED_CACHE_DIR"] = before


def _tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (what a cache entry takes on disk)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _files_bytes(subset: Any) -> int | None:
    """The bytes of the part's image files, for a dataset that lists them (ImageFolder's ``samples``), through
    ``Subset``s (their indices mapped down)."""
    if not isinstance(subset, Subset):  # a Hugging Face dataset's part: its images are in its Arrow files
        return None
    dataset, indices = subset.dataset, list(subset.indices)
    for _ in range(4):
        if not isinstance(dataset, Subset):
            break
        indices, dataset = [dataset.indices[i] for i in indices], dataset.dataset
    samples = getattr(dataset, "samples", None)
    if not isinstance(samples, list) or not samples or not isinstance(samples[0], tuple):
        return None
    try:
        return sum(os.path.getsize(samples[i][0]) for i in indices)
    except (OSError, TypeError, IndexError):
        return None


def _script_rate(
    loader: DataLoader,
    subset: Any,
    shuffle: bool,
    batch_size: int,
    device: torch.device,
    deadline: float,
    notes: list[str],
) -> dict[str, Any]:
    """The script's settings on ``subset`` (at ``batch_size``): img/s with each batch copied to ``device``."""
    settings: dict[str, Any] = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "drop_last": drop_last_of(loader),
    }
    extra: dict[str, Any] = {"collate_fn": loader.collate_fn, "timeout": loader.timeout}
    if loader.num_workers > 0:
        settings.update(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
        # Workers kept between the warm-up and the timed epochs: the script pays their start-up once per epoch of
        # its whole dataset, which a few hundred samples would overstate many times.
        extra.update(
            persistent_workers=True,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
        )
        if not loader.persistent_workers:
            notes.append("the script's loader was timed with its workers kept between passes (start-up not counted)")
    own = DataLoader(subset, **{**settings, **extra})
    try:
        rate, note = _rate(own, device, deadline)
    finally:
        del own
        gc.collect()  # persistent workers end now, not at some later collection
    notes += [f"script loader: {note}"] if note else []
    return {"img_s": rate, "settings": settings}


def _tuned(subset: Any, batch_size: int, device: torch.device, budget_s: float, collate_fn: Any) -> dict[str, Any]:
    """tune_dataloader's choice on ``subset`` in ``budget_s``, batched by the script's ``collate_fn`` (a Trainer's
    rows are dicts that only its collate function stacks): its kwargs and measured img/s."""
    from ..tune import tune_dataloader

    cfg = tune_dataloader(
        subset, batch_size, time_budget_s=budget_s, device=device, collate_fn=collate_fn, progress=False
    )
    best = [
        t.images_per_s
        for t in cfg.table
        if (t.num_workers, t.pin_memory, t.prefetch_factor) == (cfg.num_workers, cfg.pin_memory, cfg.prefetch_factor)
    ]
    kwargs = {k: v for k, v in cfg.kwargs.items() if k != "batch_size"}
    # the best rate of each worker count measured: "more workers measured no better" needs more than one
    by_workers = {t.num_workers: max(x.images_per_s for x in cfg.table if x.num_workers == t.num_workers)
                  for t in cfg.table}  # fmt: skip
    return {"kwargs": kwargs, "img_s": max(best) if best else None, "speedup": cfg.speedup, "budget_s": budget_s,
            "by_workers": {str(k): by_workers[k] for k in sorted(by_workers)}}  # fmt: skip


def _rate(loader: Iterable[Any], device: torch.device, deadline: float) -> tuple[float, str]:
    """Images per second over whole epochs after a warm-up epoch; ``(rate, note)``.

    Timed epochs repeat until :data:`_MIN_TIMED_S` is measured, and start only when one more fits before
    ``deadline``; if not even one does, the warm-up epoch's rate stands, and the note says so.
    """
    n, seconds = _epoch(loader, device)
    timed_n, timed_s = 0, 0.0
    while timed_s < _MIN_TIMED_S and time.perf_counter() + max(seconds, 1e-3) < deadline:
        n_e, seconds = _epoch(loader, device)
        timed_n, timed_s = timed_n + n_e, timed_s + seconds
    if timed_n == 0:
        return n / max(seconds, 1e-9), "no time left after the warm-up epoch: its rate (start-up included) is given"
    return timed_n / timed_s, ""


def _epoch(loader: Iterable[Any], device: torch.device) -> tuple[int, float]:
    """One pass over ``loader``, each batch moved to ``device`` as a training loop would: (samples, seconds)."""
    sync(device)
    t0 = time.perf_counter()
    samples = 0
    it: Iterator[Any] = iter(loader)
    for batch in it:
        moved = map_tensors(batch, lambda t: t.to(device, non_blocking=True))
        samples += _count(moved)
    sync(device)
    return samples, time.perf_counter() - t0


def _count(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    found: list[torch.Tensor] = []
    map_tensors(batch, lambda t: found.append(t) or t)  # type: ignore[func-returns-value]
    return int(found[0].shape[0]) if found and found[0].dim() else 0


@contextmanager
def _random_state_kept() -> Iterator[None]:
    """NOTE [ The script's state is left as found ]: every global RNG as it was, whatever happens inside."""
    cuda_was = torch.cuda.is_initialized()
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda_states = torch.cuda.get_rng_state_all() if cuda_was else None
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        elif torch.cuda.is_initialized():  # started here: back to the fresh state the script would have found
            for gen in torch.cuda.default_generators:
                gen.manual_seed(gen.initial_seed())
