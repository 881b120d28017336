"""The first stage: what :func:`gpufeed.accelerate` was asked, checked once, before anything is read.

The arguments arrive as two checked records (:class:`~gpufeed.options.BatchOptions`,
:class:`~gpufeed.options.ReadOptions`); this stage adds what depends on the dataset: torch's ``Subset`` /
``ConcatDataset`` seen through (:func:`gpufeed.read.wrappers.unwrap`), the transform of each view, the
mixing op with the dataset's class count, the device, and the watch on what is read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..augment.mix import as_mix
from ..device import resolve_device
from ..errors import ConfigError
from ..options import BatchOptions, ReadOptions
from ..read.hf import arrow_images, hf_kind, transform_of
from ..read.wrappers import SourceWatch, unwrap
from ..validate import UnbatchableError, as_views, check_dataset, check_epoch, check_length
from .translate.wrapped import view_transforms

__all__ = ["DATASET", "Request", "request"]

DATASET: Any = object()  # transform= not given: the dataset's own


@dataclass(frozen=True)
class Request:
    """A checked call of ``accelerate``: the dataset as gpufeed reads it and everything said about it."""

    dataset: Any  # a Subset / ConcatDataset seen through: the data it selects, with the inner transform
    transforms: tuple[Any, ...]  # the torchvision pipeline of each view (one unless views= gave pipelines)
    views: int  # images per sample per batch, each with its own draws
    batch: BatchOptions
    read: ReadOptions
    device: torch.device
    mixer: Any  # MixUp / CutMix per batch, or None
    num_classes: int | None  # from the dataset's classes, when its labels index them
    watch: SourceWatch  # what was read once, checked at every epoch
    unbatchable: UnbatchableError | None = None  # parts with different transforms: only the fallback runs them
    notes: tuple[str, ...] = ()  # what the plan says of the request itself (a dataset's own transform replaced)

    @property
    def labelled(self) -> bool:
        """Whether batches carry labels (a Hugging Face dataset read with ``label_key=None`` has none)."""
        return getattr(self.dataset, "labelled", True)

    @property
    def transform(self) -> Any:
        """The (first view's) pipeline, as the per-sample fallback runs it."""
        return self.transforms[0]

    @property
    def pipelines(self) -> bool:
        """``views=`` gave one pipeline per view (rather than a count)."""
        return len(self.transforms) > 1


def request(
    dataset: Any,
    batch: BatchOptions,
    read: ReadOptions,
    *,
    transform: Any = DATASET,
    device: str | torch.device | None = None,
    mix: Any = None,
    views: int | Sequence[Any] = 1,
    image_key: str | None = None,
    label_key: str | None = "auto",
) -> Request:
    """Check what depends on the dataset (a map-style dataset, an epoch of at least one batch, the views, the
    mixing op's class count) and see through torch's wrappers: a bad argument costs no read of the data. A
    Hugging Face dataset is read as its image column (:func:`gpufeed.read.hf.arrow_images`)."""
    from .stream import streaming_dataset_error

    streaming = streaming_dataset_error(dataset)
    if streaming is not None:
        raise streaming
    notes: tuple[str, ...] = ()
    if hf_kind(dataset) is not None:
        own = transform_of(dataset)
        given = transform if transform is not DATASET else None
        if given is None and isinstance(views, (list, tuple)):
            given = views[0]
        dataset = arrow_images(dataset, image_key, label_key, given)
        notes = dataset.notes  # how its labels are read (class names numbered, float targets, none)
        if own is not None:
            name = getattr(own, "__qualname__", type(own).__name__)
            notes += (
                f"the dataset's own transform ({name}, from set_transform/with_transform) is replaced by the "
                "recipe given",
            )
    elif image_key is not None or label_key != "auto":
        raise ConfigError("image_key and label_key name the columns of a Hugging Face datasets.Dataset; this is a "
                          f"{type(dataset).__name__}: drop them")  # fmt: skip
    check_dataset(dataset)
    n = check_length(len(dataset), "dataset")  # an absurd __len__ is named before anything is allocated
    check_epoch(n, batch.batch_size, batch.drop_last)  # the rank-aware check follows in the loader
    watch = SourceWatch(dataset, transform_given=transform is not DATASET)  # what is read once, by identity
    unbatchable = None
    try:  # torch's Subset / random_split parts / ConcatDataset: their inner transform, files and arrays
        dataset = unwrap(dataset, own_transforms=transform is DATASET)  # transform= replaces them all
    except UnbatchableError as e:  # parts with different transforms: only the per-sample pipeline runs them
        unbatchable = e
    transform = getattr(dataset, "transform", None) if transform is DATASET else transform
    classes = getattr(dataset, "classes", None)  # torchvision datasets: labels must index it
    num_classes = len(classes) if isinstance(classes, list) and classes else None
    if getattr(dataset, "target_transform", None) is not None:  # its labels are whatever it maps the classes to
        num_classes = None
    mixer = as_mix(mix, num_classes)  # a bad mix= is refused before the data is read
    if mixer is not None and not getattr(dataset, "labelled", True):
        raise ConfigError("mix= mixes images with their labels, but label_key=None reads images alone")
    if mixer is not None and getattr(getattr(dataset, "label_values", None), "dtype", None) == "float32":
        raise ConfigError(
            f"mix= mixes one-hot class labels, but label_key={dataset.label_key!r} serves float targets: drop mix=, or "
            "cast the column to class ids (int64 or a ClassLabel)"
        )
    split = view_transforms(transform) if isinstance(views, int) and views == 1 and transform is not None else None
    if split is not None:  # a TwoCropsTransform-style object: each view through the transform it holds, batched
        n = len(split)
        notes = (
            *notes,
            f"the transform {type(transform).__name__} returns {n} views of each image: each batch is ([view_1, ..., "
            f"view_{n}], labels) as its DataLoader's, each view with its own draws (views={n})",
        )
        views = split if len({id(v) for v in split}) > 1 else len(split)
        transform = split[0]
    if isinstance(views, (list, tuple)):
        if len(views) < 2:
            raise ConfigError(f"views: {len(views)} pipeline(s); give an int, or one pipeline per view (two or more)")
        transforms, count = tuple(views), len(views)
    else:
        transforms, count = (transform,), as_views(views)
    return Request(
        dataset, transforms, count, batch, read, resolve_device(device), mixer, num_classes, watch, unbatchable, notes
    )
