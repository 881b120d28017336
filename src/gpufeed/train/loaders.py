"""The training loaders ``gpufeed train --loader`` and ``gpufeed bench`` compare.

- ``torch``: torchvision's ``DataLoader`` with per-sample PIL transforms (the usual baseline).
- ``pretransform``: the deterministic part (ToTensor + Normalize) computed once per sample into a
  float tensor, the random part (crop, flip) per sample in ``DataLoader`` workers.
- ``gpu-per-sample``: the whole dataset on the device as floats, still indexed and augmented one
  sample at a time through ``DataLoader`` (the step most guides stop at).
- ``gpufeed``: :func:`gpufeed.accelerate`.
- ``fixed``: one batch, already on the device, served ``len(loader)`` times (the model-alone floor).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..errors import ConfigError
from ..pipeline.accelerate import accelerate
from ..sampling import derive_seed
from ..workers import default_workers, loader_kwargs
from .kinds import LOADER_KINDS

__all__ = ["LOADER_KINDS", "MEAN", "STD", "eval_transform", "make_train_loader", "subset", "train_transform"]

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def train_transform() -> T.Compose:
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def eval_transform() -> T.Compose:
    return T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])


def subset(dataset: Any, n: int | None) -> Any:
    """The first ``n`` samples as a dataset of the same class (arrays sliced, so fast paths still apply); of an
    image folder, ``n`` spread evenly over its classes."""
    if dataset is None or n is None or n >= len(dataset):
        return dataset
    if not hasattr(dataset, "data"):
        from ..data.images import folder_subset

        return folder_subset(dataset, n)
    if n < 1:
        raise ConfigError(f"a subset of {n=} samples is empty; use a size >= 1")
    ds = copy.copy(dataset)
    ds.data, ds.targets = dataset.data[:n], list(dataset.targets[:n])
    return ds


class _ToDevice:
    """A CPU loader's batches moved to the device (non-blocking from pinned memory)."""

    def __init__(self, loader: Any, device: torch.device, channels_last: bool) -> None:
        self.loader, self.device, self.channels_last = loader, device, channels_last
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if isinstance(getattr(self.loader, "sampler", None), DistributedSampler):
            self.loader.sampler.set_epoch(self.epoch)  # as DeviceLoader does: each pass is the next epoch
        self.epoch += 1
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        for x, y in self.loader:
            yield x.to(self.device, non_blocking=True, memory_format=fmt), y.to(self.device, non_blocking=True)


class _TensorAugment(Dataset):
    """Samples of an ``(N, C, H, W)`` float tensor (on any device) through per-sample tensor transforms."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Any) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.images[i]), self.labels[i]


class _Fixed:
    def __init__(self, batch: tuple[torch.Tensor, torch.Tensor], steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            yield self.batch


def _pretransformed(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """ToTensor + Normalize once per sample, as a user would cache the deterministic part by hand."""
    det = eval_transform()
    plain = copy.copy(dataset)
    plain.transform = None
    images = torch.stack([det(plain[i][0]) for i in range(len(plain))])
    return images, torch.as_tensor(dataset.targets)


def make_train_loader(
    kind: str,
    dataset: Any,
    batch_size: int,
    device: torch.device,
    seed: int,
    *,
    num_workers: int | None = None,
    drop_last: bool = True,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    store: str = "auto",
    max_side: int | None = None,
) -> Any:
    """A loader of ``kind`` over ``dataset`` (whose transform is the training transform), yielding device batches."""
    workers = default_workers() if num_workers is None else num_workers
    random_part = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()])

    def dataloader(ds: Dataset, workers: int) -> _ToDevice:
        g = torch.Generator().manual_seed(derive_seed(seed, 2))
        sampler: DistributedSampler | None = None
        if dist.is_available() and dist.is_initialized():  # one share per rank, reshuffled each epoch
            sampler = DistributedSampler(ds, shuffle=True, seed=seed, drop_last=drop_last)
        dl = DataLoader(
            ds,
            batch_size,
            shuffle=sampler is None,
            sampler=sampler,
            drop_last=drop_last,
            pin_memory=device.type == "cuda" and workers > 0,
            generator=g,
            **loader_kwargs(workers, persistent=True, prefetch_factor=4 if workers else None),
        )
        return _ToDevice(dl, device, channels_last)

    folder = not hasattr(dataset, "data")  # an image folder: files, not CIFAR's arrays
    if folder and kind in ("pretransform", "gpu-per-sample"):
        raise ConfigError(
            f"loader={kind!r} stores CIFAR-10's arrays as float tensors; an image folder's images differ in size: "
            "use loader='torch' or 'gpufeed'"
        )

    def gpufeed(last: bool) -> Any:
        return accelerate(
            dataset,
            batch_size,
            shuffle=True,
            drop_last=last,
            device=device,
            seed=seed,
            dtype=dtype,
            channels_last=channels_last,
            cache="auto" if folder else False,  # a folder's decoded images are kept in gpufeed's cache directory
            progress=False,
            store=store,
            max_side=max_side,
        )

    if kind == "torch":
        return dataloader(dataset, workers)
    if kind == "pretransform":
        return dataloader(_TensorAugment(*_pretransformed(dataset), random_part), workers)
    if kind == "gpu-per-sample":
        images, labels = _pretransformed(dataset)
        return dataloader(_TensorAugment(images.to(device), labels.to(device), random_part), 0)
    if kind == "gpufeed":
        return gpufeed(drop_last)
    if kind == "fixed":
        loader = gpufeed(True)
        x, y = next(iter(loader))
        return _Fixed((x.clone(memory_format=torch.preserve_format), y.clone()), len(loader))
    raise ConfigError(f"loader={kind!r} is not one of {LOADER_KINDS}")
