"""The last stage: the loader, constructed with its plan.

:func:`device_loader` serves the materialised store through the batched ops the probe built;
:func:`fallback_loader` runs the user's per-sample pipeline unchanged, when asked to (``fallback="prefetch"``)
for what the batched path cannot run.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ConfigError
from ..loading.fallback import FallbackLoader
from ..loading.loader import DeviceLoader
from ..loading.plan import Plan
from ..store import as_store
from .entries import Source
from .probe import Probed
from .request import Request

__all__ = ["device_loader", "fallback_loader"]


def device_loader(req: Request, probed: Probed, src: Source) -> DeviceLoader:
    """A :class:`~gpufeed.DeviceLoader` over ``src`` in its tier, running the probe's batched ops."""
    b = req.batch
    view_ops: int | list[Any] = list(probed.batched) if req.pipelines else req.views
    store = as_store(src.images)
    plan = Plan(
        cached=tuple(repr(op) for op in probed.split.cached),
        batched=_batched_lines(req, probed),
        storage=src.tier,
        stored_shape=store.stored_shape,
        stored_dtype=str(store.dtype).replace("torch.", ""),
        bytes=src.nbytes,
        ingest=src.description,
        cache_path=str(src.cache_path) if src.cache_path else None,
        notes=(src.why, *src.notes, *probed.split.notes, *probed.notes),
        device=str(req.device),
    )  # the loader adds its store's layout and the note on its buffers
    loader = DeviceLoader(
        store,
        src.labels,
        b.batch_size,
        b.shuffle,
        b.drop_last,
        transform=probed.batched[0],
        device=req.device,
        seed=b.seed,
        dtype=b.dtype,
        channels_last=b.channels_last,
        storage=src.tier,
        num_classes=req.num_classes,
        rank=b.rank,
        world_size=b.world_size,
        even=b.even,
        shard=b.shard,
        mix=req.mixer,
        views=view_ops,
        plan=plan,
        source_watch=req.watch,
    )
    loader.labelled = req.labelled
    return loader


def _batched_lines(req: Request, probed: Probed) -> tuple[str, ...]:
    """The plan's ``batched:`` line: each op, then the mixing op, then the views."""
    first = probed.batched[0]
    lines = tuple(op.describe() for op in (first.transforms if first is not None else []))
    if req.mixer is not None:
        lines += (f"then per batch {req.mixer!r}",)
    if req.views > 1 and not req.pipelines:
        lines += (f"all of it {req.views} times per batch, each view with its own draws",)
    if req.pipelines:
        lines += tuple(
            f"view {k + 1}: " + ", ".join(op.describe() for op in ops.transforms)
            for k, ops in enumerate(probed.batched)
        )
    return lines


def fallback_loader(req: Request, why: Exception) -> FallbackLoader:
    """The per-sample pipeline in DataLoader workers (``fallback="prefetch"``, with a warning); else ``why`` raised."""
    if req.read.fallback != "prefetch":
        raise why
    if req.views > 1:
        raise ConfigError(f"views={req.views} needs the batched path, and this pipeline is not batched: {why}")
    if req.read.on_error == "skip":  # the per-sample pipeline reads the files as the user's DataLoader would
        raise ConfigError(
            f"on_error='skip' leaves bad files out of a store gpufeed builds, and this pipeline runs per sample "
            f"instead ({why}); remove the bad files, or drop on_error"
        )
    warnings.warn(f"gpufeed.accelerate falls back to per-sample DataLoader workers (slow path): {why}", stacklevel=3)
    b = req.batch
    loader = FallbackLoader(
        req.dataset,
        req.transform,
        b.batch_size,
        b.shuffle,
        b.drop_last,
        req.device,
        b.seed,
        dtype=b.dtype,
        channels_last=b.channels_last,
        num_workers=req.read.num_workers,
        reason=str(why),
        rank=b.rank,
        world_size=b.world_size,
        even=b.even,
        mix=req.mixer,
    )
    loader.labelled = req.labelled
    return loader
