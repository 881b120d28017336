"""The loaders of ``gpufeed train`` (and so of ``bench`` and ``diagnose``) over an MDS dataset: ``--data
s3://bucket/prefix``, or a directory holding an ``index.json``.

- ``gpufeed``: :func:`gpufeed.stream` (the engine's order, gpufeed's batched decode and recipe, keyed draws).
- ``torch``: what a user of the engine writes without gpufeed, the honest baseline: ``streaming.StreamingDataset``
  in a ``DataLoader``, each sample's bytes decoded with PIL and run through the same torchvision recipe.
- ``fixed``: one batch of the stream, already on the device, served as often as an epoch has batches.

Every loader is opened here, inside :func:`gpufeed.train.loop.prepare`, so under torchrun each rank opens it after
the process group exists (the engine starts a group of its own otherwise). The batch size of a stream is the global
one (all ranks together); ``train_size`` keeps the first global batches of each epoch's order.
"""

from __future__ import annotations

import gc
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..data.images import folder_train
from ..errors import ConfigError, DataError, GpufeedError
from ..workers import default_workers, loader_kwargs
from .loaders import _Fixed, _ToDevice

__all__ = ["EngineSamples", "StreamLoaders", "engine_samples", "open_stream_loaders"]

VAL_BATCH = 128  # per rank, as for image folders


class _Cut:
    """The first ``batches`` batches of each epoch of ``loader`` (``--train-size`` of a stream); the rest of an
    epoch is left, so the next pass serves the next epoch (NOTE [ When an epoch is claimed ])."""

    def __init__(self, loader: Any, batches: int) -> None:
        self.loader, self.batches = loader, min(batches, len(loader))

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        try:
            for _, batch in zip(range(self.batches), it, strict=False):
                yield batch
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # the stream's reader thread stops now, not at garbage collection

    def __getattr__(self, name: str) -> Any:  # plan, set_epoch, state_dict, shards: the loader's
        return getattr(self.__dict__["loader"], name)


class EngineSamples(IterableDataset):
    """The engine's ``StreamingDataset`` as a training script reads it: each sample's image decoded with PIL (a
    ``bytes`` column; a ``jpeg``/``png`` one comes decoded) and run through ``transform``."""

    def __init__(self, dataset: Any, transform: Any, image_key: str = "image", label_key: str = "label") -> None:
        self.dataset, self.transform = dataset, transform
        self.image_key, self.label_key = image_key, label_key

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        from PIL import Image

        for sample in self.dataset:
            image = sample[self.image_key]
            if isinstance(image, bytes):
                image = Image.open(io.BytesIO(image))
            yield self.transform(image.convert("RGB")), int(sample[self.label_key])


class _EngineLoader(_ToDevice):
    """The DataLoader over the engine, moved to the device; :meth:`close` ends its workers and its dataset (the
    engine's dataset holds its local directory until it is collected)."""

    def close(self) -> None:
        self.loader = None
        gc.collect()


@dataclass
class StreamLoaders:
    """A run's loaders over a stream, what the model needs to know, and what to close when the run ends."""

    loader: Any
    test_loader: Any
    num_classes: int
    samples: int  # in the training dataset
    closers: list[Any] = field(default_factory=list)

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


def engine_samples(remote: str | None, local: str, batch_size: int, image_size: int, cache_limit: Any = None) -> Any:
    """The engine's ``StreamingDataset`` over the data, shuffled, its samples decoded with PIL and run through the
    folder training recipe: what a training script without gpufeed reads (the baseline of bench and tune)."""
    from ..mds import engine

    dataset = engine.dataset(remote=remote, local=local, batch_size=batch_size, shuffle=True, cache_limit=cache_limit)
    return EngineSamples(dataset, folder_train(image_size))


def _engine_loader(cfg: Any, opened: Any, device: torch.device, world: int) -> _EngineLoader:
    shards = opened.shards
    local, remote = shards.local, shards.remote
    shards.close()  # the engine's dataset takes the local directory over
    gc.collect()
    samples = engine_samples(remote, local, cfg.batch_size // world, cfg.image_size or 224, shards.cache_limit)
    workers = default_workers() if cfg.num_workers is None else cfg.num_workers
    dl = DataLoader(
        samples,
        cfg.batch_size // world,
        drop_last=True,
        pin_memory=device.type == "cuda" and workers > 0,
        **loader_kwargs(workers, persistent=True, prefetch_factor=4 if workers else None),
    )
    return _EngineLoader(dl, device, cfg.channels_last)


def _open(source: Any, global_batch_size: int, **kwargs: Any) -> Any:
    """``source.open(...)``; an error of the engine's storage clients on a remote (botocore's, google's, ...: no
    credentials, an unreachable endpoint, no such bucket) becomes a DataError naming the dataset, not a traceback."""
    try:
        return source.open(global_batch_size, **kwargs)
    except (GpufeedError, OSError, KeyboardInterrupt):
        raise  # already a message the CLI prints (OSError: a path, or the engine's FileNotFoundError)
    except Exception as e:
        if source.remote is None:
            raise
        raise DataError(
            f"{source.describe()}: the streaming engine could not read it ({type(e).__name__}: {e}); check the URL, "
            "the credentials its client reads (for s3:// AWS_ACCESS_KEY_ID..., or S3_ENDPOINT_URL for another "
            "endpoint) and the network"
        ) from e


def _val_batch(samples: int | None, test_size: int | None, world: int) -> int:
    usable = min(x for x in (samples, test_size) if x is not None) if (samples or test_size) else None
    batch = VAL_BATCH * world
    if usable is not None:
        if usable < world:
            raise ConfigError(f"the validation data's {usable} samples cannot be shared by {world} processes")
        batch = min(batch, usable - usable % world)
    return batch


def open_stream_loaders(cfg: Any, sources: tuple[Any, Any], device: torch.device, world: int) -> StreamLoaders:
    """The training loader of ``cfg.loader`` over ``sources[0]`` and the evaluation one over ``sources[1]`` (if any),
    opened now; the number of classes from the dataset's ``gpufeed.json`` (or ``cfg.num_classes``)."""
    train_src, val_src = sources
    if cfg.loader not in ("gpufeed", "torch", "fixed"):
        raise ConfigError(
            f"loader={cfg.loader!r} keeps CIFAR-10's arrays as float tensors; an MDS dataset is streamed: use "
            "loader 'gpufeed' (gpufeed.stream) or 'torch' (the engine's StreamingDataset in a DataLoader)"
        )
    opened = _open(
        train_src, cfg.batch_size, device=device, seed=cfg.seed, channels_last=cfg.channels_last,
        num_classes=cfg.num_classes,
    )  # fmt: skip
    out = StreamLoaders(opened, None, 0, opened.shards.index.num_samples, [opened.shards.close])
    try:
        if opened.num_classes is None:
            meta = opened.shards.meta
            why = (
                "has a gpufeed.json without class names or a class count (its labels are numbers, written by an "
                "older gpufeed convert)"
                if meta
                else "has no gpufeed.json naming its classes (it was not written by gpufeed convert)"
            )
            raise ConfigError(f"{train_src.describe()} {why}: give --num-classes N")
        out.num_classes = opened.num_classes
        batches = len(opened) if cfg.train_size is None else cfg.train_size // cfg.batch_size
        if batches < 1:
            raise ConfigError(
                f"--train-size {cfg.train_size} is less than one global batch of {cfg.batch_size}: every epoch would "
                "be empty; raise it or lower --batch-size"
            )
        if cfg.loader == "fixed":
            x, y = next(iter(opened))
            out.loader = _Fixed((x.clone(memory_format=torch.preserve_format), y.clone()), min(batches, len(opened)))
            opened.shards.close()
        elif cfg.loader == "torch":
            engine_loader = _engine_loader(cfg, opened, device, world)
            out.closers.append(engine_loader.close)
            out.loader = _Cut(engine_loader, batches) if cfg.train_size is not None else engine_loader
        else:
            out.loader = _Cut(opened, batches) if cfg.train_size is not None else opened
        if val_src is not None:
            out.test_loader = _open_val(cfg, val_src, opened, out, device, world)
    except BaseException:
        out.close()
        raise
    return out


def _open_val(cfg: Any, val_src: Any, opened: Any, out: StreamLoaders, device: torch.device, world: int) -> Any:
    batch = _val_batch(val_src.samples(), cfg.test_size, world)
    val = _open(
        val_src, batch, device=device, seed=cfg.seed, channels_last=cfg.channels_last, num_classes=out.num_classes
    )
    out.closers.append(val.shards.close)
    train_classes, val_classes = opened.shards.classes, val.shards.classes
    if train_classes is not None and val_classes is not None and train_classes != val_classes:
        raise DataError(
            f"the classes of {val_src.describe()} differ from the training data's (a label would mean different "
            "classes in each): convert both from folders with the same class names"
        )
    if cfg.test_size is not None:
        return _Cut(val, max(1, cfg.test_size // batch))
    return val
