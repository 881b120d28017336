"""accelerate(): a torchvision-style dataset with its transform -> the fastest loader that fits.

1. :mod:`gpufeed.pipeline.translate` splits the transform: a deterministic prefix computed once per sample, and
   the rest as batched ops on the device.
2. :mod:`gpufeed.pipeline.materialise` gets the stored images: :mod:`gpufeed.read.samples` reads the dataset through the
   prefix (vectorised when it exposes arrays; a folder of photos as its files), or a verified cache
   on disk (:mod:`gpufeed.pipeline.entries`) gives them back.
3. A storage tier is chosen: the device if the data fits its budget, else pinned host memory,
   else a memory map of the cache file. Every tier yields the same batches.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..augment.mix import as_mix
from ..device import host_available, resolve_device
from ..errors import CacheWriteError, ConfigError, DataError, UnsupportedTransformError
from ..loading.fallback import FallbackLoader
from ..loading.loader import DeviceLoader
from ..loading.plan import Plan
from ..read.files import Encoded, file_samples
from ..read.samples import Probe, RaggedError, UnbatchableError, probe
from ..read.wrappers import SourceWatch, unwrap
from ..sampling import as_even
from ..store.ragged import Ragged
from ..store.spill import spill
from ..validate import as_flag, as_int, as_workers, check_dataset, check_epoch
from .materialise import ON_ERROR, STORES, describe_store, fmt_bytes, load, load_ragged, takes_ragged
from .translate import Split, build_batched, split_transform

__all__ = ["DEVICE_BUDGET_FRACTION", "HOST_BUDGET_FRACTION", "STORES", "accelerate", "preflight"]


DEVICE_BUDGET_FRACTION = 0.5  # of the device memory free when accelerate() runs: the rest is the model's
HOST_BUDGET_FRACTION = 0.5  # of the host memory available, for the pinned tier

_DATASET = object()


def _share(fraction: float) -> str:
    return "half" if fraction == 0.5 else f"{fraction:.0%}"


def _host_budget() -> tuple[int, str]:
    """The host tiers' budget and the sentence that says where it comes from (for the plan's note)."""
    available, what = host_available()
    return int(available * HOST_BUDGET_FRACTION), f"{_share(HOST_BUDGET_FRACTION)} of {what}"


def _device_budget(device: torch.device, memory_budget: int | None) -> int:
    return _budget(device, memory_budget)[0]


def _budget(device: torch.device, memory_budget: int | None) -> tuple[int, str]:
    """The device's budget in bytes and where the figure comes from."""
    if memory_budget is not None:
        if memory_budget < 0:
            raise ConfigError(f"{memory_budget=} must be >= 0 bytes")
        return memory_budget, "memory_budget"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        # A cap set with torch.cuda.set_per_process_memory_fraction binds the allocator, not the device.
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = get_fraction(device) if get_fraction is not None else 1.0
        usable = min(free + reserved - allocated, int(fraction * total) - allocated)
        source = f"{_share(DEVICE_BUDGET_FRACTION)} of {device}'s free memory"
        return max(0, int(usable * DEVICE_BUDGET_FRACTION)), source
    return _host_budget()


def _choose_tier(nbytes: int, device: torch.device, memory_budget: int | None) -> tuple[str, str]:
    budget, source = _budget(device, memory_budget)
    size, limit = fmt_bytes(nbytes), f"{fmt_bytes(budget)} ({source})"
    if nbytes <= budget:
        return "device", f"{size} fits the {device.type} budget of {limit}"
    if device.type != "cuda":  # the CPU's budget is host memory already
        return "mmap", f"{size} exceeds the device budget of {limit} (host memory on the CPU); memory-mapped file"
    host, host_source = _host_budget()
    if nbytes <= host:
        return "pinned", f"{size} exceeds the device budget of {limit}; fits pinned host memory ({host_source})"
    return "mmap", (
        f"{size} exceeds the device budget of {limit} and the host budget of {fmt_bytes(host)} ({host_source}); "
        "memory-mapped file"
    )


def accelerate(
    dataset: Any,
    batch_size: int = 256,
    shuffle: bool = True,
    drop_last: bool = False,
    device: str | torch.device | None = None,
    seed: int = 0,
    *,
    transform: Any = _DATASET,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    memory_budget: int | None = None,
    cache: bool | str | Path = "auto",
    fallback: str = "error",
    cache_lambda: bool = False,
    num_workers: int | None = None,
    progress: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    even: bool | str = True,
    shard: str = "full",
    lock_timeout: float | None = None,
    store: str = "auto",
    max_side: int | None = None,
    mix: Any = None,
    views: int | Sequence[Any] = 1,
    on_error: str = "error",
) -> DeviceLoader | FallbackLoader:
    """A loader over ``dataset`` that yields what ``DataLoader(dataset, ...)`` would, many times faster.

    The dataset's transform (or ``transform=``) is split: its deterministic prefix is computed once
    and stored as uint8 where possible, its random part runs batched on ``device`` with the same
    semantics. ``print(loader.plan)`` says what was decided and why.

    Args:
        dataset: a map-style dataset: torchvision's CIFAR10/100, MNIST, SVHN, STL10, ImageFolder,
            a ``TensorDataset``, any dataset returning ``(image, label)``; or torch's ``Subset`` (a
            ``random_split`` part) or ``ConcatDataset`` of them, read as the datasets they wrap (the inner
            transform is split, arrays and files read and cached as the inner dataset's).
        batch_size, shuffle, drop_last, seed: as for :class:`DeviceLoader`.
        device: where batches are made; ``None``: CUDA if available, else CPU.
        transform: overrides ``dataset.transform`` (for a ``Subset`` or ``ConcatDataset``, the inner datasets').
        dtype: the images' output dtype; ``None`` (default): what the pipeline itself returns (uint8
            for a pipeline that ends in uint8, float for one that ends in ToTensor/ToDtype/Normalize).
        channels_last: return images in ``torch.channels_last`` memory format.
        memory_budget: bytes the stored data may take on the device (default: half the free memory).
        cache: also the root directory of the cache (``~`` expanded): entries are created inside it.
        cache: ``"auto"`` stores the computed prefix on disk when it was expensive to compute (per-sample
            path) or when the data must be memory-mapped; ``True`` always, ``False`` never; a path is
            the cache root to use (default ``$XDG_CACHE_HOME/gpufeed``).
        fallback: ``"error"`` (default) raises for an op gpufeed cannot batch or images of different
            sizes; ``"prefetch"`` runs the original per-sample pipeline, unchanged, in DataLoader workers
            behind :func:`prefetch` (with a warning), for anything a ``DataLoader`` could run.
        cache_lambda: treat ``Lambda`` ops in the deterministic prefix as deterministic.
        num_workers: workers for per-sample ingestion (and the fallback); default from the cores.
        rank, world_size, even, shard: sharding under ``torch.distributed``, as for
            :class:`DeviceLoader` (read from the process group by default). A cache on disk is built
            by one process per node; the others wait for it and reuse it.
        lock_timeout: seconds to wait while another process builds the same cache entry (default
            ``$GPUFEED_LOCK_TIMEOUT``, else an hour); then a CacheError names that process. A cache
            that cannot be written (disk full, read-only) is not an error: the data stays in memory,
            with one warning.
        store: for images of different sizes (a folder of photos) with a recipe that starts with
            RandomResizedCrop: ``"pixels"`` decodes every image once and keeps the pixels (fast,
            large), ``"jpeg"`` keeps the files' bytes and decodes each batch (compact; an
            ``ImageFolder``, ``DatasetFolder`` or ``Food101`` read by torchvision's PIL loader),
            ``"auto"`` the pixels when they fit ``memory_budget``, else the bytes.
        max_side: downscale the pixel store's images whose longer side exceeds it, once, as they
            are decoded (torchvision's ``Resize(size=None, max_size=max_side)``, antialiased): a
            change to what the model sees, stated in ``loader.plan``; off by default.
        mix: MixUp or CutMix on every batch, after the per-sample ops, as torchvision v2 applies them
            (gpufeed's :mod:`gpufeed.augment.mix`, or v2's ``MixUp``, ``CutMix`` or a ``RandomChoice`` of
            them; ``num_classes`` from the dataset's ``classes`` when not given): labels become
            ``(N, num_classes)`` soft targets.
        views: for self-supervised learning: each batch is ``([view_1, ..., view_k], labels)``, the same
            images through the transform ``views`` times with independent draws (the usual
            ``TwoCropsTransform(base)`` is ``transform=base, views=2``). Or one torchvision pipeline per
            view (DINO's two global crops and several local ones, each its own size): they replace
            the dataset's transform and must share its deterministic part.
        on_error: files of a folder that cannot be read or decoded (truncated, garbled, a header that
            claims more than the file holds) are all found while the store is built: ``"error"``
            (default) names every one in one DataError; ``"skip"`` leaves them out, with one warning
            that lists them and a line in ``loader.plan`` (labels stay with their images).

    Example:
        >>> import torch, torchvision.transforms.v2 as v2
        >>> from torch.utils.data import TensorDataset
        >>> ds = TensorDataset(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), torch.arange(8))
        >>> aug = v2.Compose([v2.RandomCrop(32, padding=4), v2.ToDtype(torch.float32, scale=True)])
        >>> loader = accelerate(ds, batch_size=4, device="cpu", transform=aug, progress=False)
        >>> [tuple(x.shape) for x, _ in loader], loader.plan.storage
        ([(4, 3, 32, 32), (4, 3, 32, 32)], 'device')
    """
    if store not in STORES:
        raise ConfigError(f"store={store!r} must be one of {STORES}")
    max_side = None if max_side is None else as_int(max_side, "max_side", 1)
    if max_side is not None and store == "jpeg":
        raise ConfigError("max_side shrinks a pixel store as it is decoded; store='jpeg' keeps the files as they are")
    if fallback not in ("error", "prefetch"):
        raise ConfigError(f"fallback={fallback!r} must be 'error' or 'prefetch'")
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} must be one of {ON_ERROR}")
    # Checked before the data is read: a bad argument must not cost an ingest.
    check_dataset(dataset)
    batch_size, seed = as_int(batch_size, "batch_size", 1), as_int(seed, "seed")
    shuffle, drop_last = as_flag(shuffle, "shuffle"), as_flag(drop_last, "drop_last")
    channels_last, even = as_flag(channels_last, "channels_last"), as_even(even, drop_last, shard)
    check_epoch(len(dataset), batch_size, drop_last)  # the rank-aware check follows in the loader
    cache = _cache_option(cache)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(f"dtype={dtype!r} must be a torch.dtype (e.g. torch.float32) or None")
    memory_budget = None if memory_budget is None else as_int(memory_budget, "memory_budget (bytes)", 0)
    num_workers = None if num_workers is None else as_workers(num_workers)
    watch = SourceWatch(dataset, transform_given=transform is not _DATASET)  # what is read once, by identity
    try:  # torch's Subset / random_split parts / ConcatDataset: their inner transform, files and arrays
        dataset = unwrap(dataset, own_transforms=transform is _DATASET)  # transform= replaces them all
    except UnbatchableError as e:  # parts with different transforms: only the per-sample pipeline runs them
        unwrapped_error: UnbatchableError | None = e
    else:
        unwrapped_error = None
    transform = getattr(dataset, "transform", None) if transform is _DATASET else transform
    dev = resolve_device(device)
    classes = getattr(dataset, "classes", None)  # torchvision datasets: labels must index it
    num_classes = len(classes) if isinstance(classes, list) and classes else None
    if getattr(dataset, "target_transform", None) is not None:  # its labels are whatever it maps the classes to
        num_classes = None
    mixer = as_mix(mix, num_classes)  # a bad mix= is refused before the data is read

    view_list = list(views) if isinstance(views, (list, tuple)) else None
    if view_list is not None:
        if len(view_list) < 2:
            raise ConfigError(
                f"views: {len(view_list)} pipeline(s); give an int, or one pipeline per view (two or more)"
            )
        transform = view_list[0]
    views = len(view_list) if view_list is not None else as_int(views, "views", 1)

    def slow_path(why: Exception) -> FallbackLoader:
        if fallback != "prefetch":
            raise why
        if views > 1:
            raise ConfigError(f"views={views} needs the batched path, and this pipeline is not batched: {why}")
        if on_error == "skip":  # the per-sample pipeline reads the files as the user's DataLoader would
            raise ConfigError(
                f"on_error='skip' leaves bad files out of a store gpufeed builds, and this pipeline runs per sample "
                f"instead ({why}); remove the bad files, or drop on_error"
            )
        warnings.warn(
            f"gpufeed.accelerate falls back to per-sample DataLoader workers (slow path): {why}", stacklevel=3
        )
        return FallbackLoader(
            dataset,
            transform,
            batch_size,
            shuffle,
            drop_last,
            dev,
            seed,
            dtype=dtype,
            channels_last=channels_last,
            num_workers=num_workers,
            reason=str(why),
            rank=rank,
            world_size=world_size,
            even=even,
            mix=mixer,
        )

    # Planned in full on a few samples before the dataset is read, so that anything the batched path
    # cannot do takes the fallback without an ingest (and fails fast without one).
    try:
        if unwrapped_error is not None:
            raise unwrapped_error
        split, probed = preflight(dataset, transform, cache_lambda, on_error)
        takes = takes_ragged(
            build_batched(split.device, probed.dtype, probed.size, probed.pil, channels=probed.channels)
        )
        view_splits = [split]
        for other in (view_list or [])[1:]:  # each view planned as the first; one stored part for all
            other_split, other_probe = preflight(dataset, other, cache_lambda, on_error)
            if [repr(op) for op in other_split.cached] != [repr(op) for op in split.cached]:
                raise ConfigError(
                    f"views: the pipelines' deterministic parts differ ({list(split.cached)} and "
                    f"{list(other_split.cached)}); the images are stored once, so every view must start the same"
                )
            takes = takes and takes_ragged(
                build_batched(
                    other_split.device, other_probe.dtype, other_probe.size, other_probe.pil, channels=probed.channels
                )
            )
            view_splits.append(other_split)
        if (store == "jpeg" or max_side is not None) and not takes:
            what = "store='jpeg'" if store == "jpeg" else f"max_side={max_side}"
            first = split.cached[0] if split.cached else (split.device[0] if split.device else None)
            starts = f"this one starts with {type(first).__name__}" if first is not None else "this one is empty"
            if transform is None:
                starts = f"{type(dataset).__name__} has no transform (pass transform=, or the dataset's own)"
            raise ConfigError(
                f"{what} keeps each image at its own size: it needs a recipe that starts with RandomResizedCrop; "
                f"{starts}"
            )
        budget = _device_budget(dev, memory_budget)
        # A folder read by torchvision's loader always goes by its files' headers: three probed samples of one
        # size say nothing about the rest.
        folder = takes and not split.cached and file_samples(dataset) is not None
        if probed.ragged is not None or folder or store == "jpeg" or max_side is not None:
            src = load_ragged(
                dataset, split, cache, num_workers, progress, lock_timeout, store, budget, max_side, on_error
            )
        else:
            try:
                src = load(dataset, split, cache, num_workers, progress, lock_timeout, on_error)
            except RaggedError as e:  # sizes the probe did not see: kept as they are if the recipe allows
                if not (e.sizes_only and takes):
                    raise
                src = load_ragged(
                    dataset, split, cache, num_workers, progress, lock_timeout, store, budget, on_error=on_error
                )
    except (UnsupportedTransformError, UnbatchableError) as e:  # after the probe: what its samples did not show
        return slow_path(e)
    images, labels = src.images, src.labels
    nbytes = images.nbytes + labels.nbytes
    tier, why = _choose_tier(nbytes, dev, memory_budget)
    if isinstance(images, Encoded):  # the decoders read host memory, nvJPEG included
        tier = "pinned" if dev.type == "cuda" else "device"
        where = "pinned host memory" if dev.type == "cuda" else "memory"
        why = f"the files' bytes ({fmt_bytes(nbytes)}) are kept in {where}, where the decoders read them"
    elif tier == "mmap" and isinstance(images, Ragged) and not src.mapped:
        tier = "pinned" if dev.type == "cuda" else "device"
        why = why.replace(
            "; memory-mapped file", ", and a ragged store is memory-mapped only from a cache: host memory"
        )
        warnings.warn(f"gpufeed.accelerate: {why}", stacklevel=2)
    elif tier != "device":
        warnings.warn(f"gpufeed.accelerate: {why}; batches are the same, each chunk is copied in", stacklevel=2)
    if tier == "mmap" and not src.mapped:
        assert isinstance(images, torch.Tensor)
        try:
            images, labels = spill(images, labels)
        except CacheWriteError as e:
            tier = "pinned" if dev.type == "cuda" else "device"
            why = f"{why}, but the memory map could not be written, so the data stays in host memory"
            warnings.warn(f"gpufeed.accelerate: {e}; the data stays in host memory", stacklevel=2)
    notes: list[str] = []
    size = probed.size if isinstance(images, (Ragged, Encoded)) else (images.shape[2], images.shape[3])
    batched = build_batched(split.device, images.dtype, size, probed.pil, notes, probed.channels)
    view_ops: int | list[Any] = views
    if view_list is not None:
        view_ops = [batched] + [
            build_batched(v.device, images.dtype, size, probed.pil, notes, probed.channels) for v in view_splits[1:]
        ]
        if any(ops is None for ops in view_ops):
            raise ConfigError("views: every view's pipeline needs a random op after its deterministic part")
    loader = DeviceLoader(
        images,
        labels,
        batch_size,
        shuffle,
        drop_last,
        transform=batched,
        device=dev,
        seed=seed,
        dtype=dtype,
        channels_last=channels_last,
        storage=tier,
        num_classes=num_classes,
        rank=rank,
        world_size=world_size,
        even=even,
        shard=shard,
        mix=mixer,
        views=view_ops,
    )
    loader.source_watch = watch
    loader.plan = Plan(
        cached=tuple(repr(op) for op in split.cached),
        batched=tuple(op.describe() for op in (batched.transforms if batched else []))
        + ((f"then per batch {mixer!r}",) if mixer is not None else ())
        + ((f"all of it {views} times per batch, each view with its own draws",) if views > 1 and not view_list else ())
        + tuple(
            f"view {k + 1}: " + ", ".join(op.describe() for op in ops.transforms)
            for k, ops in enumerate(view_ops if isinstance(view_ops, list) else [])
        ),
        storage=tier,
        stored_shape=tuple(images.shape)
        if isinstance(images, torch.Tensor)
        else (len(images), int(images.shapes[0, 0])),
        layout=describe_store(loader.images) if isinstance(loader.images, (Ragged, Encoded)) else "",
        stored_dtype=str(images.dtype).replace("torch.", ""),
        bytes=nbytes,
        ingest=src.description,
        cache_path=str(src.cache_path) if src.cache_path else None,
        notes=(why, *src.notes, *split.notes, *notes, *filter(None, [loader.host_memory_note])),
        device=str(dev),
    )
    return loader


def preflight(dataset: Any, transform: Any, cache_lambda: bool = False, on_error: str = "error") -> tuple[Split, Probe]:
    """The plan, checked on a few samples before the dataset is read: the split of ``transform``, and what
    the probed samples say. Raises UnsupportedTransformError or UnbatchableError for what the batched
    path cannot run (the fallback's cases), DataError for samples no loader could use."""
    split = split_transform(transform, cache_lambda)
    # A folder's bad files are all found while its store is built (and named in one error, or left out): the probe
    # reads past them rather than failing on the first.
    probed = probe(dataset, split.cached_transform(), "skip" if file_samples(dataset) is not None else on_error)
    batched = build_batched(split.device, probed.dtype, probed.size, probed.pil, channels=probed.channels)
    if probed.ragged is not None and not (probed.sizes_only and takes_ragged(batched)):
        crop = next((op for op in getattr(batched, "transforms", []) if op.one_size_output), None)
        if probed.sizes_only and crop is not None:  # the recipe could keep them as they are, with its ops reordered
            assert batched is not None
            before = [
                op.describe() for op in batched.transforms[: batched.transforms.index(crop)] if not op.ragged_input
            ]
            raise RaggedError(
                f"{probed.ragged.split(';')[0]}; images of different sizes are kept as they are only when "
                f"RandomResizedCrop comes before any op that needs one size ({', '.join(before)}): put it first, or "
                "pass fallback='prefetch'",
                sizes_only=True,
            )
        raise RaggedError(probed.ragged, sizes_only=probed.sizes_only)
    _dry_run(batched, probed.samples)
    return split, probed


def _dry_run(batched: Any, samples: torch.Tensor | Ragged | None) -> None:
    """Run the batched ops on the probed samples: what they refuse (an erase value a uint8 image cannot
    hold, a fill out of range) is found before the dataset is read, and can take the fallback."""
    if batched is None or samples is None:
        return
    try:
        batched(samples, generator=torch.Generator().manual_seed(0))
    except (ConfigError, DataError) as e:
        raise UnsupportedTransformError(f"the batched ops cannot run this pipeline: {e}") from e


_FLAG_WORDS = {"", "no", "false", "off", "none", "0", "yes", "true", "on", "1"}


def _cache_option(cache: Any) -> bool | str | Path:
    """``True``, ``False``, ``"auto"``, or a cache root directory (``~`` expanded); anything else is an error."""
    if isinstance(cache, bool) or cache == "auto":
        return cache
    if not isinstance(cache, (str, os.PathLike)):
        raise ConfigError(f"cache={cache!r} must be True, False, 'auto' or a directory (the cache root)")
    if str(cache).strip().lower() in _FLAG_WORDS:
        raise ConfigError(f"cache={cache!r} reads as a flag, not a directory: pass cache=True, False or 'auto'")
    root = Path(cache).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"cache={str(cache)!r} is a file; pass a directory, the root gpufeed's entries go under")
    return root
