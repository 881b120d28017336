"""accelerate(): a torchvision-style dataset with its transform -> the fastest loader that fits.

Four stages, data flowing one way (each a module of :mod:`gpufeed.pipeline`):

1. :mod:`.request`: the arguments checked once (:mod:`gpufeed.options`), torch's wrappers seen through;
2. :mod:`.probe`: the transform split into a cached part and batched ops (built once), checked on a few
   samples before the dataset is read;
3. :mod:`.plan`: decisions, no read: how the data is read (its arrays, sample by sample, a folder's files) and the
   memory budgets of the tiers;
4. :mod:`.materialise`: a cache hit or one read of the dataset, in its tier (device, pinned host memory, a memory
   map);

then :mod:`.assemble` constructs the loader with its plan. What the batched path cannot run takes the
per-sample fallback when asked (``fallback="prefetch"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, UnsupportedTransformError
from ..loading.fallback import FallbackLoader
from ..loading.loader import DeviceLoader
from ..options import BatchOptions, ReadOptions
from ..validate import UnbatchableError, as_batch_keys
from .assemble import device_loader, fallback_loader
from .materialise import materialise
from .plan import plan
from .probe import probe
from .request import DATASET, request

__all__ = ["accelerate"]


def accelerate(
    dataset: Any,
    batch_size: int = 256,
    shuffle: bool = True,
    drop_last: bool = False,
    device: str | torch.device | None = None,
    seed: int = 0,
    *,
    transform: Any = DATASET,
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
    image_key: str | None = None,
    label_key: str | None = "auto",
    batch_keys: Sequence[str] | None = None,
) -> DeviceLoader | FallbackLoader:
    """A loader over ``dataset`` that yields what ``DataLoader(dataset, ...)`` would, many times faster.

    The transform (the dataset's, or ``transform=``) is split: its deterministic prefix is computed once and
    stored (uint8 where possible), its random part runs batched on ``device`` with the same semantics.
    ``print(loader.plan)`` says what was decided and why. torch's ``Subset`` (a ``random_split`` part) and
    ``ConcatDataset`` are read as the datasets they wrap (``transform=`` replaces the inner transforms).

    Args:
        dataset: a map-style dataset returning ``(image, label)``: torchvision's (CIFAR, MNIST, SVHN, STL10,
            ImageFolder, Food101, ...), a ``TensorDataset``, your own; or a Hugging Face ``datasets.Dataset``
            (one split), its images served from its Arrow bytes as a folder's files are, decoded as ``datasets``
            decodes them and converted to RGB; its ``set_transform`` function is replaced by ``transform=``.
        image_key, label_key: a Hugging Face dataset's image column (found from its ``Image`` feature) and label
            column (``"auto"``: its ``ClassLabel``, or an integer ``label``/``labels``/``target`` column; class
            names from the ``ClassLabel``).
        batch_keys: each batch as a dict under these keys instead of a tuple: ``("pixel_values", "labels")``
            for a loop written for a Hugging Face collate function (``batch["pixel_values"]``, ``model(**batch)``);
            one key per part of the batch (one alone for images without labels).
        batch_size, shuffle, drop_last, seed, channels_last, rank, world_size, even, shard: as for
            :class:`DeviceLoader` (checked by :class:`~gpufeed.options.BatchOptions`).
        dtype: the images' dtype; ``None``: what the pipeline returns (float after ToTensor/Normalize).
        device: where batches are made; ``None``: CUDA if available, else CPU.
        mix: MixUp or CutMix per batch (gpufeed's or v2's, or a v2 ``RandomChoice`` of them): soft labels.
        views: an int: each batch is ``([view_1, ..., view_k], labels)``, independent draws; or one
            torchvision pipeline per view (DINO's crops), sharing the deterministic part.
        cache, store, max_side, fallback, on_error, cache_lambda, num_workers, progress, lock_timeout,
            memory_budget: how the data is read and kept; :class:`~gpufeed.options.ReadOptions` says each.
            In short: ``cache`` ``"auto"``/True/False or a root directory; ``store`` ``"auto"``/``"pixels"``/
            ``"jpeg"`` for a folder of photos; ``fallback="prefetch"`` runs what gpufeed cannot batch per
            sample in DataLoader workers; ``on_error="skip"`` leaves a folder's unreadable files out.

    Example:
        >>> import torch, torchvision.transforms.v2 as v2
        >>> from torch.utils.data import TensorDataset
        >>> ds = TensorDataset(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), torch.arange(8))
        >>> aug = v2.Compose([v2.RandomCrop(32, padding=4), v2.ToDtype(torch.float32, scale=True)])
        >>> loader = accelerate(ds, batch_size=4, device="cpu", transform=aug, progress=False)
        >>> [tuple(x.shape) for x, _ in loader], loader.plan.storage
        ([(4, 3, 32, 32), (4, 3, 32, 32)], 'device')
    """
    keys = as_batch_keys(batch_keys)
    batch = BatchOptions(batch_size, shuffle, drop_last, seed, dtype, channels_last, rank, world_size, even, shard)
    read = ReadOptions(
        cache, store, max_side, fallback, on_error, cache_lambda, num_workers, progress, lock_timeout, memory_budget
    )
    req = request(
        dataset,
        batch,
        read,
        transform=transform,
        device=device,
        mix=mix,
        views=views,
        image_key=image_key,
        label_key=label_key,
    )
    try:
        if req.unbatchable is not None:
            raise req.unbatchable
        probed = probe(req.dataset, req.transforms, read.cache_lambda, read.on_error)
        decided = plan(req, probed)
        if req.notes:
            decided = replace(decided, notes=req.notes + decided.notes)
        source = materialise(req, probed, decided)
    except (UnsupportedTransformError, UnbatchableError) as e:  # what the batched path cannot run
        loader: DeviceLoader | FallbackLoader = fallback_loader(req, e)
    else:
        loader = device_loader(req, probed, source)
    if keys is not None and len(keys) != (2 if loader.labelled else 1):
        parts = "(images, labels)" if loader.labelled else "images alone (no label column)"
        raise ConfigError(f"batch_keys={keys} names {len(keys)} parts; this loader's batches are {parts}")
    loader.batch_keys = keys
    return loader
