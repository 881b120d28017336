"""The materialise stage: the stored images and labels, from a cache hit or one read of the dataset, in their tier.

It follows the plan's route (:mod:`gpufeed.pipeline.plan`), reading the dataset once:

- ``"arrays"``: the dataset's own arrays in one vectorised step (nothing to compute, so nothing cached);
- ``"samples"``: every sample through the cached part, in DataLoader workers, cached when that was expensive; a
  recipe that starts with RandomResizedCrop keeps images of different sizes as they are when the read meets
  them (the probe saw three samples, the read sees them all), in the same read;
- ``"samples-ragged"``: the same, each image kept at its own size from the start;
- ``"folder"``: a folder's files by their headers, as decoded pixels or as their bytes
  (:mod:`gpufeed.pipeline.folder_store`).

Then the tier: the device when the store fits its budget, else pinned host memory, else a memory map (a cache
entry already is one; other data is spilled to a temporary file). Every tier yields the same batches.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import replace
from typing import Any

from ..device import fmt_bytes
from ..errors import CacheWriteError
from ..read.samples import Ingested, ingest
from ..store import as_store
from ..store.spill import spill
from .entries import Source, cached_hit, cached_read, describe_read
from .folder_store import folder_store, with_file_record
from .plan import PIXELS_BY_SAMPLE, RAGGED_NOTE, StorePlan
from .probe import Probed
from .request import Request

__all__ = ["Source", "materialise"]


def materialise(req: Request, probed: Probed, decided: StorePlan) -> Source:
    """The stored data of ``req`` as ``decided``, in its tier (``Source.tier``, with the plan's reason)."""
    if decided.route == "folder":
        src = folder_store(req, probed.split, decided)
    elif decided.route == "arrays":
        data = ingest(req.dataset, None, num_workers=req.read.num_workers, progress=req.read.progress)
        src = Source(data.images, data.labels, describe_read(data))
    else:
        src = _samples(req, probed, decided)
    return _placed(src, decided, req)


def _samples(req: Request, probed: Probed, decided: StorePlan) -> Source:
    """Every sample through the cached part: one tensor, or (``"samples-ragged"``) a Ragged store; with
    ``decided.either``, whichever the read finds (RandomResizedCrop first keeps images of different sizes as they
    are), each kind's entry under its own key, as a read of that kind writes it."""
    dataset, split, options, check = req.dataset, probed.split, req.read, probed.check_mode  # check: on a hit too
    ragged: bool | None = True if decided.route == "samples-ragged" else (None if decided.either else False)
    read = with_file_record(
        dataset, functools.partial(_read_samples, dataset, split, options, ragged, probed.check_mode)
    )
    if not decided.either:
        # "auto" persists what was expensive to compute: a read sample by sample
        return cached_read(
            dataset, split, options, decided.key_kind, read, _per_sample, decided.notes, check_mode=check
        )
    at_own_sizes = [RAGGED_NOTE, *decided.notes]
    hit = cached_hit(dataset, split, options, PIXELS_BY_SAMPLE, at_own_sizes, check)  # a read met other sizes
    if hit is not None:
        return hit
    once = functools.cache(read)  # the dataset is read once, whichever entry it is kept in
    src = cached_read(dataset, split, options, None, once, _per_sample, decided.notes, fits=_one_size, check_mode=check)
    if not as_store(src.images).ragged:
        return src
    if src.key is None:  # nothing persisted (cache=False, or nothing to fingerprint): no other key to try
        src.notes.insert(0, RAGGED_NOTE)
        return src
    return cached_read(dataset, split, options, PIXELS_BY_SAMPLE, once, _per_sample, at_own_sizes, check_mode=check)


def _read_samples(dataset: Any, split: Any, options: Any, ragged: bool | None, check_mode: Any = None) -> Ingested:
    cached = split.cached_transform()
    workers, progress = options.num_workers, options.progress
    return ingest(dataset, cached, num_workers=workers, progress=progress, ragged=ragged, check_mode=check_mode)


def _one_size(data: Ingested) -> bool:
    return not as_store(data.images).ragged


def _per_sample(data: Ingested) -> bool:
    return data.path == "per-sample"


def _placed(src: Source, decided: StorePlan, req: Request) -> Source:
    """``src`` in its tier: the device when it fits the budget, else pinned host memory, else a memory map."""
    images, labels, device = src.images, src.labels, req.device
    store = as_store(images)
    nbytes = store.nbytes + labels.nbytes
    tier, why = decided.budget.tier(nbytes)
    host_tier = "pinned" if device.type == "cuda" else "device"
    if store.host_bytes:  # the decoders read host memory, nvJPEG included
        tier, where = host_tier, "pinned host memory" if device.type == "cuda" else "memory"
        why = f"the files' bytes ({fmt_bytes(nbytes)}) are kept in {where}, where the decoders read them"
    elif tier == "mmap" and store.ragged and not src.mapped:
        tier = host_tier
        why = why.replace(
            "; memory-mapped file", ", and a ragged store is memory-mapped only from a cache: host memory"
        )
        warnings.warn(f"gpufeed.accelerate: {why}", stacklevel=4)
    elif tier != "device":
        warnings.warn(f"gpufeed.accelerate: {why}; batches are the same, each chunk is copied in", stacklevel=4)
    if tier == "mmap" and not src.mapped:
        try:
            images, labels = spill(images, labels)
        except CacheWriteError as e:
            tier = host_tier
            why = f"{why}, but the memory map could not be written, so the data stays in host memory"
            warnings.warn(f"gpufeed.accelerate: {e}; the data stays in host memory", stacklevel=4)
    return replace(src, images=images, labels=labels, tier=tier, why=why, nbytes=nbytes)
