"""stream(): an MDS dataset (a directory, or ``s3://``, ``gs://``, ... fetched into a local cache) -> StreamLoader.

The torchvision transform is converted as :func:`gpufeed.accelerate` converts a folder of photos kept as JPEGs:
nothing is cached (the images are decoded per batch at their own sizes). A training recipe (``RandomResizedCrop``
first) runs batched whole; an evaluation recipe's deterministic start (``Resize``, ``CenterCrop``) runs per sample
on the reader's threads (:mod:`gpufeed.loading.stream_samples`), the rest batched. The order's settings default as
the engine's do, except that the shuffle block is fitted to the cache when a limit is set
(:func:`gpufeed.mds.plan.block_size_for_cache`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..augment.transforms import BatchTransform, takes_ragged
from ..cache.usage import parse_size
from ..device import resolve_device
from ..errors import ConfigError
from ..loading.plan import Plan
from ..loading.stream import StreamLoader, process_layout
from ..loading.stream_samples import SampleOps
from ..mds.plan import Layout, StreamSettings
from ..mds.shards import Shards
from ..mds.urls import check_url
from ..validate import as_int, as_seconds, as_seed, as_views
from .translate import build_batched, split_transform

__all__ = ["stream", "streaming_dataset_error"]


def recipe(
    transform: Any, first_file: Callable[[], bytes]
) -> tuple[SampleOps | None, BatchTransform | None, tuple[str, ...]]:
    """``transform`` (gpufeed's ops, or a torchvision / timm recipe) as what runs per sample (its deterministic
    start: :class:`~gpufeed.loading.stream_samples.SampleOps`), what runs batched, and the notes the conversion made.
    ``first_file``: a sample's bytes, to learn the size the per-sample part makes (read only when there is one).
    A ConfigError if the images would stay of different sizes."""
    notes: list[str] = []
    per_sample: SampleOps | None = None
    if isinstance(transform, BatchTransform):
        ops: BatchTransform | None = transform
    elif transform is None:
        ops = None
    else:
        split = split_transform(transform)
        size = (64, 64)  # RandomResizedCrop first: its output size does not depend on this
        if split.cached:
            per_sample = SampleOps(split.cached)
            size = tuple(per_sample(first_file(), "sample 0").shape[-2:])  # type: ignore[assignment]
        ops = build_batched(split.device, torch.uint8, size, True, notes=notes, channels=3)
    if per_sample is None and (ops is None or not takes_ragged(ops)):
        raise ConfigError(
            f"transform={transform!r}: a stream's images come at their own sizes, so the recipe must start with "
            "RandomResizedCrop (training: it draws each image's box from that image's size and makes the batch one "
            "size) or with a resize and a crop to one size (evaluation: Resize, CenterCrop)"
        )
    return per_sample, ops, tuple(notes)


def _is_streaming_dataset(obj: Any) -> bool:
    return any(c.__module__.startswith("streaming.") and c.__name__ == "StreamingDataset" for c in type(obj).mro())


def streaming_dataset_error(dataset: Any) -> ConfigError | None:
    """For a MosaicML ``StreamingDataset`` given to :func:`gpufeed.accelerate`: the error naming the
    :func:`stream` call that serves its data (its remote, local and order settings); else None."""
    while not _is_streaming_dataset(dataset) and hasattr(dataset, "dataset"):  # a Subset / random_split part
        dataset = dataset.dataset
    if not _is_streaming_dataset(dataset):
        return None
    streams = getattr(dataset, "streams", None) or []
    one = streams[0] if len(streams) == 1 else None
    where = (
        f"remote={getattr(one, 'remote', None)!r}, local={getattr(one, 'local', None)!r}, "
        if one is not None
        else "remote=..., local=..., "
    )
    order = ", ".join(
        f"{name}={getattr(dataset, name)!r}"
        for name in ("shuffle", "shuffle_seed", "shuffle_algo", "num_canonical_nodes")
        if getattr(dataset, name, None) is not None
    )
    several = "" if one is not None or not streams else f" (it mixes {len(streams)} streams: gpufeed serves one)"
    return ConfigError(
        f"dataset is a {type(dataset).__name__}{several}: gpufeed serves its shards itself, in the engine's order, "
        f"with gpufeed.stream({where}transform=<the recipe>, batch_size={getattr(dataset, 'batch_size', None)!r}, "
        f"{order}); close this dataset first (it holds its local directory)"
    )


def check_stream_arguments(
    remote: str | os.PathLike[str] | None, cache_limit: Any, retry: Any, timeout: Any, views: Any
) -> int | None:
    """What :func:`stream` hands the engine, checked before any shard or credential is looked for (a typo costs
    no network round trip): the remote's scheme one the engine reads, ``cache_limit`` a size (returned in bytes),
    the attempts a count >= 1, the timeout a finite number of seconds, ``views`` a count.

    Example:
        >>> check_stream_arguments("s3://bucket/data", "1gb", 2, 60.0, 1)
        1073741824
    """
    if isinstance(views, (list, tuple)):
        raise ConfigError(
            "views=[...] (one recipe per view) is gf.accelerate's; gf.stream draws views=N independent views of its "
            "one transform: pass an int, or one gf.stream per recipe over the same shards"
        )
    as_views(views)
    as_int(retry, "download_retry", 1)  # attempts, the first included (the engine's meaning)
    seconds = as_seconds(timeout, "download_timeout")
    if seconds is None or seconds == 0:
        raise ConfigError(f"download_timeout={timeout!r} must be a number of seconds > 0")
    if isinstance(remote, str):
        check_url(remote)
    if cache_limit is None:
        return None
    return as_bytes(cache_limit, "cache_limit")


def as_bytes(value: Any, name: str) -> int:
    """A size: an int of bytes >= 1, or a string such as ``"64gb"`` or ``"1.5T"`` (powers of 1024, read by
    :func:`gpufeed.cache.usage.parse_size`, as ``GPUFEED_CACHE_LIMIT`` and ``--cache-limit`` are).

    Example:
        >>> as_bytes("1.5kb", "cache_limit"), as_bytes(4096, "cache_limit")
        (1536, 4096)
    """
    size = parse_size(value, name) if isinstance(value, str) else as_int(value, name, 1)
    if size < 1:
        raise ConfigError(f"{name}={value!r} must be at least 1 byte")
    return size


def stream(
    remote: str | None = None,
    local: str | os.PathLike[str] | None = None,
    *,
    transform: Any,
    batch_size: int | None = None,
    global_batch_size: int | None = None,
    shuffle: bool = True,
    drop_last: bool = True,
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    image_key: str = "image",
    label_key: str | None = "label",
    num_classes: int | None = None,
    cache_limit: int | str | None = None,
    num_canonical_nodes: int | None = None,
    shuffle_seed: int = 9176,
    shuffle_algo: str = "py1e",
    shuffle_block_size: int | None = None,
    mix: Any = None,
    views: int = 1,
    layout: Layout | None = None,
    ahead: int = 2,
    prefetch_shards: int = 4,
    download_retry: int = 2,
    download_timeout: float = 60.0,
    validate_hash: str | None = None,
) -> StreamLoader:
    """A loader over an MDS dataset, in the engine's order, decoded and augmented in batches on ``device``.

    Needs the streaming extra (``pip install 'gpufeed[streaming]'``). Under ``torch.distributed`` call it after
    ``init_process_group``, on every rank, with the same arguments: each rank serves its share of every global
    batch, and the node's ranks share ``local``.

    Args:
        remote: where the dataset lives (``s3://bucket/prefix``, ``gs://...``, a directory, ...); None: ``local``
            holds it (local-only data: never evicted, no engine object).
        local: the dataset's directory (local-only), or where a remote's shards are cached (default: under
            gpufeed's cache directory).
        transform: a torchvision (v1 or v2) or timm recipe, or gpufeed's ops, converted as :func:`gpufeed.accelerate`
            converts it: a training recipe starts with ``RandomResizedCrop`` (all of it runs batched); an evaluation
            recipe's resize and crop (``Resize``, ``CenterCrop``) run per sample as torchvision runs them, the rest
            batched.
        drop_last: True (training): whole global batches; up to ``global_batch_size - 1`` positions at an epoch's
            end are not served that epoch (shuffled, another epoch's order moves them; with ``shuffle=False`` they are
            the same samples every epoch). False (evaluation, with ``shuffle=False``): each rank's whole share as
            ``StreamingDataset`` yields it, every sample at least once, the last batch possibly smaller, the same
            number of batches on every rank; the engine's few padding repeats come last, and
            ``loader.real_counts[i]`` says how many of batch ``i``'s first samples to score.
        batch_size: samples per batch on each rank (as ``DataLoader``'s), or ``global_batch_size``: over all ranks,
            kept when the run resumes at another world size (give one of the two).
        shuffle, shuffle_seed, shuffle_algo, shuffle_block_size, num_canonical_nodes: the engine's order
            (``StreamingDataset``'s arguments of the same names); ``num_canonical_nodes`` defaults to this run's
            node count (the engine's default), ``shuffle_block_size`` to one that fits ``cache_limit`` when set.
            A resumed state's order settings are taken over.
        seed: the augmentation's seed; each sample's draws are keyed by (seed, epoch, sample id).
        dtype, channels_last, num_classes, mix, device: as for :func:`gpufeed.accelerate`.
        views: an int: each batch is ``([view_1, ..., view_k], labels)``, independent draws of ``transform``
            (one recipe per view, as ``gf.accelerate`` takes, is not served by streams).
        image_key, label_key: the columns holding an image file's bytes and its integer label (None: batches are
            images alone).
        cache_limit: bytes (or ``"64gb"``) the node's ``local`` may hold (remote data only).
        layout: this rank's place (:class:`gpufeed.mds.plan.Layout`); by default from the process group and
            torchrun's ``LOCAL_WORLD_SIZE``.
        ahead, prefetch_shards: batches read and decoded, and shards fetched, ahead of use.
        download_retry, download_timeout, validate_hash: how shards are fetched (checked first: a count, a finite
            number of seconds > 0). ``download_timeout`` bounds the whole wait for one shard, the engine's
            ``download_retry`` attempts and its storage client's own retries included: then a
            :class:`~gpufeed.errors.StorageError` names the shard and the remote (``state_dict()`` holds the
            position, ``load_state_dict()`` resumes there).

    Example::

        loader = gf.stream("s3://bucket/imagenet-mds", "/scratch/imagenet", global_batch_size=1024,
                           transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                T.ToTensor(), T.Normalize(mean, std)]))
        for epoch in range(epochs):
            for x, y in loader: ...
        torch.save(loader.state_dict(), "loader.pt")   # resumes at any world size
    """
    for name, value in (("remote", remote), ("local", local)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise streaming_dataset_error(value) or ConfigError(
                f"{name}={value!r}: give a URL (s3://bucket/prefix, gs://...) or a directory"
            )
    cache_limit = check_stream_arguments(remote, cache_limit, download_retry, download_timeout, views)
    as_seed(seed)  # before the shards are opened (NOTE [ Seeds, epochs and batch sizes ] in gpufeed.validate)
    if (batch_size is None) == (global_batch_size is None):
        raise ConfigError(
            "give batch_size= (per rank, as DataLoader's) or global_batch_size= (over all ranks; kept when a run "
            "resumes at another world size), not both or neither"
        )
    where = layout if layout is not None else process_layout()
    if global_batch_size is None:
        global_batch_size = as_int(batch_size, "batch_size", 1) * where.world_size
    if num_canonical_nodes is None:  # the engine's default: from the run's first layout (a state keeps it)
        num_canonical_nodes = where.num_nodes * (64 if shuffle_algo in ("py1s", "py2s") else 1)
    explicit = {
        name
        for name, value in (
            ("num_canonical_nodes", num_canonical_nodes),
            ("shuffle_block_size", shuffle_block_size),
        )
        if value is not None
    } | {"shuffle", "shuffle_seed", "shuffle_algo"}
    settings = StreamSettings(
        global_batch_size, num_canonical_nodes, shuffle, shuffle_seed, shuffle_algo, shuffle_block_size
    )  # checked before the shards are opened
    settings.batch_size(where.world_size)
    resolve_device(device)
    shards = Shards(
        local,
        remote,
        image_key=image_key,
        label_key=label_key,
        cache_limit=cache_limit,
        ranks_per_node=where.ranks_per_node,
        download_retry=download_retry,
        download_timeout=download_timeout,
        validate_hash=validate_hash,
    )
    try:
        per_sample, ops, notes = recipe(transform, lambda: shards.read([0]).images[0])
        if shuffle_block_size is None and shards.engine_cache_limit is not None:
            settings = StreamSettings(
                global_batch_size, num_canonical_nodes, shuffle, shuffle_seed, shuffle_algo,
                shards.shuffle_block_size(num_canonical_nodes),
            )  # fmt: skip
        if num_classes is None and shards.classes is not None:
            num_classes = len(shards.classes)
        elif num_classes is None and isinstance(shards.meta.get("num_classes"), int):  # numbered classes (tars)
            num_classes = shards.meta["num_classes"]
        loader = StreamLoader(
            shards,
            settings,
            ops,
            per_sample=per_sample,
            drop_last=drop_last,
            device=device,
            seed=seed,
            dtype=dtype,
            channels_last=channels_last,
            num_classes=num_classes,
            layout=layout,
            mix=mix,
            views=views,
            ahead=ahead,
            prefetch_shards=prefetch_shards,
            explicit_order=frozenset(explicit),
        )
    except BaseException:
        shards.close()
        raise
    if per_sample is not None:
        notes = (f"per sample, as torchvision runs them, on the reader's threads: {per_sample!r}", *notes)
    loader.plan = _plan(loader, shards, notes)
    return loader


def _plan(loader: StreamLoader, shards: Shards, notes: tuple[str, ...]) -> Plan:
    index, s = shards.index, loader.settings
    where = f"fetched from {shards.remote} into {shards.local}" if shards.remote else f"read from {shards.local}"
    limit = f" (cache limit {shards.cache_limit:,} bytes)" if shards.cache_limit is not None else ""
    shuffled = f"shuffled ({s.shuffle_algo}, block {s.block_size:,})" if s.shuffle else "in order"
    order = (
        f"the engine's order: {shuffled}, {s.num_canonical_nodes} canonical node(s); global batch "
        f"{s.global_batch_size} = {loader.layout.world_size} rank(s) x {loader.batch_size}"
    )
    ops = getattr(loader.transform, "transforms", [loader.transform] if loader.transform is not None else [])
    lines = tuple(op.describe() for op in ops)
    return Plan(
        cached=(),
        batched=lines,
        storage="stream",
        stored_shape=(index.num_samples, 3),
        stored_dtype="uint8",
        bytes=int(index.max_bytes.sum()),
        ingest=f"MDS shards {where}{limit}: {index.num_samples:,} samples in {index.num_shards:,} shards",
        notes=(order, *notes),
        device=str(loader.device),
        layout="encoded files decoded per batch",
    )
