"""The training loop behind ``gpufeed train`` and the rows of ``gpufeed bench``.

Per epoch it records the wall time, images/s, the fraction of it the host spent waiting for the
next batch, GPU utilisation (NVML) and peak memory, the mean training loss and the test accuracy.
The loss is accumulated on the device and read once per epoch, so the loop itself adds no host
synchronisation per step. Traps avoided: training drops the ragged last batch (a new batch size
makes cuDNN re-tune for seconds), and DataLoader workers are never forked after CUDA is up.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..data.images import is_folder
from ..data.mds import is_stream
from ..device import environment, resolve_device, sync
from ..errors import ConfigError
from ..pipeline.accelerate import accelerate
from .loaders import LOADER_KINDS, eval_transform, make_train_loader, subset, train_transform
from .models import FOLDER_MODELS, MODELS, build_model
from .monitor import UtilisationMonitor
from .step import SGD, make_step
from .streams import open_stream_loaders

__all__ = ["EpochRecord", "Prepared", "TrainConfig", "load_datasets", "prepare", "train"]

_AMP = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run; validated on construction."""

    model: str = "small"
    loader: str = "gpufeed"
    epochs: int = 3
    batch_size: int = 256
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    amp: str = "off"
    channels_last: bool = False
    cuda_graphs: bool = False
    compile: bool = False
    seed: int = 0
    device: str | None = None
    num_workers: int | None = None
    train_size: int | None = None
    test_size: int | None = None
    data: str = "synthetic"  # synthetic or cifar10 (CIFAR-10), synthetic-folder or a directory (image folders)
    data_dir: str | None = None
    download: bool = False
    val_data: str | None = None  # an image folder's validation split, when --data is the training one
    image_size: int | None = None  # image folders: the recipes' size (default 224); CIFAR-10 is 32
    store: str = "auto"  # image folders: accelerate(store=...): "auto", "pixels" or "jpeg"
    max_side: int | None = None  # image folders: accelerate(max_side=...)
    progress: bool = True
    # MDS datasets (data: a remote URL or a directory with index.json), read by gpufeed.stream; batch_size is then
    # the global batch (all processes together)
    local: str | None = None  # where a remote's shards are cached (with a directory as data: that is the remote)
    cache_limit: int | None = None  # bytes local may hold (remote data only)
    num_classes: int | None = None  # default: the dataset's gpufeed.json

    def __post_init__(self) -> None:
        from ..data.images import is_folder
        from ..data.mds import is_stream

        stream = is_stream(self.data)
        if not stream and (self.local, self.cache_limit, self.num_classes) != (None, None, None):
            raise ConfigError(
                "local, cache_limit and num_classes (--local, --cache-limit, --num-classes) apply to MDS datasets "
                f"(data='s3://...' or a directory with index.json), not to data={self.data!r}"
            )
        if stream:
            if self.model not in FOLDER_MODELS:
                raise ConfigError(f"model={self.model!r} is not one of {list(FOLDER_MODELS)} (the models for images)")
            if self.store != "auto" or self.max_side is not None or self.data_dir is not None or self.download:
                raise ConfigError(
                    "store, max_side, data_dir and download (--store, --max-side, --data-dir, --download) do not apply "
                    "to an MDS dataset: gpufeed.stream decodes its images per batch, the engine caches its shards"
                )
            if self.image_size is not None and self.image_size < 16:
                raise ConfigError(f"image_size={self.image_size} is too small for these models; use >= 16")
        elif not is_folder(self.data):
            if self.image_size not in (None, 32):
                raise ConfigError(f"image_size={self.image_size} applies to image folders; CIFAR-10 images are 32x32")
            if self.val_data is not None:
                raise ConfigError("val_data (--val-data) goes with an image folder; CIFAR-10 has its own test split")
            if self.model not in MODELS:
                raise ConfigError(f"model={self.model!r} is not one of {sorted(MODELS)} (the CIFAR-10 models)")
            if self.store != "auto" or self.max_side is not None:
                raise ConfigError("store and max_side (--store, --max-side) apply to image folders, not CIFAR-10")
        else:
            if self.model not in FOLDER_MODELS:
                raise ConfigError(
                    f"model={self.model!r} is not one of {list(FOLDER_MODELS)} (the models for image folders)"
                )
            if self.data_dir is not None:
                raise ConfigError("data_dir (--data-dir) is where CIFAR-10 lives; an image folder is --data itself")
            if self.image_size is not None and self.image_size < 16:
                raise ConfigError(f"image_size={self.image_size} is too small for these models; use >= 16")
        if self.loader not in LOADER_KINDS:
            raise ConfigError(f"loader={self.loader!r} is not one of {LOADER_KINDS}")
        if self.amp not in _AMP:
            raise ConfigError(f"amp={self.amp!r} is not one of {sorted(_AMP)}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        if self.cuda_graphs and self.amp == "fp16":
            raise ConfigError("cuda_graphs with amp='fp16' is not possible: fp16 loss scaling reads the host; use bf16")


@dataclass
class EpochRecord:
    epoch: int
    epoch_s: float
    images: int
    images_per_s: float
    data_wait_fraction: float
    train_loss: float
    test_acc: float | None  # None: no test or validation data
    test_images: int | None = None  # images scored for test_acc (all ranks together)
    gpu_util: float | None = None
    peak_memory_bytes: int | None = None
    lr: float = 0.0
    notes: list[str] = field(default_factory=list)


def _lr_at(step: int, total: int, peak: float) -> float:
    """Linear warm-up over the first 15% of steps from 0.1 x peak, then linear decay to 0."""
    warm = max(1, int(0.15 * total))
    if step < warm:
        return peak * (0.1 + 0.9 * step / warm)
    return peak * max(0.0, (total - step) / max(1, total - warm))


@torch.no_grad()
def evaluate(model: nn.Module, loader: Any, amp: torch.dtype | None, device: torch.device) -> tuple[float, int]:
    """Accuracy over ``loader`` and the number of images scored; under DDP each rank scores its share and
    the counts are summed."""
    # The bare module: DDP's forward broadcasts buffers, a collective that would hang when ranks hold
    # different numbers of test batches (evaluation shares differ by up to one batch).
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    model = model.module if isinstance(model, DistributedDataParallel) else model
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    # a loader that pads with repeats (a stream's evaluation: the engine's padding) says how many of each batch's
    # first samples are real; only those are scored, so every sample counts once
    real = getattr(loader, "real_counts", None)
    for i, (x, y) in enumerate(loader):
        n = real[i] if real is not None and i < len(real) else y.shape[0]
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            correct += (model(x).argmax(dim=1)[:n] == y[:n]).sum()
        total += n
    model.train()
    counts = torch.stack([correct, torch.tensor(total, device=device)])
    if dist.is_initialized():  # every rank scored its share of the test set: sum them
        dist.all_reduce(counts)
    correct_all, total_all = counts.tolist()
    return correct_all / max(1, total_all), int(total_all)


@dataclass
class Prepared:
    """A run set up and ready: what :func:`train` loops over, and what ``gpufeed diagnose`` measures."""

    model: nn.Module
    loader: Any
    test_loader: Any  # None: nothing to evaluate on (an image folder without a validation split)
    step: Any  # step(x, y) -> loss on the device
    lr: torch.Tensor
    device: torch.device
    amp: torch.dtype | None
    world_size: int = 1
    rank: int = 0
    closers: list[Any] = field(default_factory=list)  # what releases the data (a stream's local directory)
    samples: int | None = None  # of an MDS dataset: the samples its index lists (known once it is opened)
    num_classes: int | None = None  # of an MDS dataset: from its gpufeed.json (or the config)

    def close(self) -> None:
        """Release what the loaders hold open (a stream's shards and cache directory); idempotent."""
        while self.closers:
            self.closers.pop()()


def prepare(cfg: TrainConfig, datasets: tuple[Any, Any] | None = None) -> Prepared:
    """Data, model, loader, optimiser and step for ``cfg`` (CUDA graph captured if asked).

    Like any training script it seeds torch's global RNG with ``cfg.seed`` (model initialisation,
    and torchvision's per-sample transforms when they run in this process) and turns on
    ``cudnn.benchmark`` on a GPU (:func:`train` restores the caller's setting afterwards).
    """
    device, rank, world = _distributed(cfg)
    if cfg.cuda_graphs and device.type != "cuda":
        raise ConfigError("cuda_graphs needs a CUDA device")
    if cfg.cuda_graphs and world > 1:
        raise ConfigError("cuda_graphs is not supported with more than one process (DDP); run one process or drop it")
    torch.manual_seed(cfg.seed)  # model initialisation; the data order and augmentation have their own seeds
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    amp = _AMP[cfg.amp]
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    if is_stream(cfg.data):  # opened now, after the process group: every rank calls gpufeed.stream
        streams = open_stream_loaders(cfg, datasets or stream_sources(cfg), device, world)
        try:
            torch.manual_seed(cfg.seed)  # as for the other data: the model's initialisation from the seed alone
            model = build_model(cfg.model, streams.num_classes, cfg.image_size or 224).to(device, memory_format=fmt)  # type: ignore[call-overload]
            run = _finish(cfg, model, streams.loader, streams.test_loader, device, amp, world, rank, streams.closers)
            run.samples, run.num_classes = streams.samples, streams.num_classes
            return run
        except BaseException:
            streams.close()
            raise
    train_set, test_set = datasets or load_datasets(cfg)
    train_set, test_set = subset(train_set, cfg.train_size), subset(test_set, cfg.test_size)
    size = (cfg.image_size or 224) if is_folder(cfg.data) else None
    # memory_format= is a keyword torch accepts at run time but its type stubs do not list.
    model = build_model(cfg.model, len(train_set.classes), size).to(device, memory_format=fmt)  # type: ignore[call-overload]
    loader = make_train_loader(
        cfg.loader,
        train_set,
        cfg.batch_size,
        device,
        cfg.seed,
        num_workers=cfg.num_workers,
        channels_last=cfg.channels_last,
        store=cfg.store,
        max_side=cfg.max_side,
    )
    # even=False: every test image scored exactly once across ranks (even=True would pad with repeats).
    test_loader = None
    if test_set is not None:
        test_loader = accelerate(
            test_set,
            1024 if size is None else 128,
            shuffle=False,
            device=device,
            channels_last=cfg.channels_last,
            cache="auto" if size is not None else False,  # a folder's decoded, resized images are worth keeping
            progress=False,
            even=False,
        )
    return _finish(cfg, model, loader, test_loader, device, amp, world, rank)


def _finish(
    cfg: TrainConfig,
    model: nn.Module,
    loader: Any,
    test_loader: Any,
    device: torch.device,
    amp: torch.dtype | None,
    world: int,
    rank: int,
    closers: list[Any] | None = None,
) -> Prepared:
    """The optimiser, DDP, compilation and the step (CUDA graph captured if asked) around a model and its loaders."""
    lr = torch.tensor(cfg.lr, device=device)
    opt = SGD(list(model.parameters()), lr, cfg.momentum, cfg.weight_decay)
    if dist.is_initialized():
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    compiled = cast(nn.Module, torch.compile(model)) if cfg.compile else model
    example = None
    if cfg.cuda_graphs:
        example = next(iter(loader))
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(0)  # taking the example started epoch 0; training starts it again
    step = make_step(compiled, opt, amp, device, graph_example=example)
    return Prepared(compiled, loader, test_loader, step, lr, device, amp, world, rank, list(closers or []))


def stream_sources(cfg: TrainConfig) -> tuple[Any, Any]:
    """The MDS sources of ``cfg`` (:class:`~gpufeed.data.mds.StreamSource`: training, validation or None)."""
    from ..data.mds import StreamSource

    size = cfg.image_size or 224
    train = StreamSource.of(cfg.data, cfg.local, cfg.cache_limit, size, True)
    return train, None if cfg.val_data is None else StreamSource.of(cfg.val_data, None, None, size, False)


def load_datasets(cfg: TrainConfig) -> tuple[Any, Any | None]:
    """``(train, test)`` for ``cfg.data`` with the standard recipes (test is None for a folder without a
    validation split)."""
    from ..data import cifar10
    from ..data.images import folder_splits

    if is_folder(cfg.data):
        train_set, val_set, _ = folder_splits(cfg.data, cfg.val_data, cfg.image_size or 224)
        return train_set, val_set
    return (
        cifar10(cfg.data, cfg.data_dir, train=True, transform=train_transform(), download=cfg.download),
        cifar10(cfg.data, cfg.data_dir, train=False, transform=eval_transform(), download=cfg.download),
    )


def _distributed(cfg: TrainConfig) -> tuple[torch.device, int, int]:
    """The device, rank and world size; joins the process group when launched by torchrun."""
    if "LOCAL_RANK" in os.environ and not dist.is_initialized():  # launched by torchrun, even with one process
        use_cuda = torch.cuda.is_available() and (cfg.device is None or str(cfg.device).startswith("cuda"))
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if not dist.is_initialized():
        return resolve_device(cfg.device), 0, 1
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        device = resolve_device(f"cuda:{local}")
        torch.cuda.set_device(device)
    return device, dist.get_rank(), dist.get_world_size()


def train(
    cfg: TrainConfig,
    out: str | Path | None = None,
    datasets: tuple[Any, Any] | None = None,
    on_ready: Callable[[Prepared], None] | None = None,
) -> list[EpochRecord]:
    """Train ``cfg.model`` on ``cfg.data`` (CIFAR-10 or an image folder) and return one record per epoch;
    ``out/train.json`` if given. ``on_ready`` is called with the prepared run before the first epoch (the CLI
    prints the loader's plan)."""
    previous = torch.backends.cudnn.benchmark  # prepare() turns it on for the run; the caller's value returns after
    try:
        return _train(cfg, out, datasets, on_ready)
    finally:
        torch.backends.cudnn.benchmark = previous


def _train(
    cfg: TrainConfig,
    out: str | Path | None,
    datasets: tuple[Any, Any] | None,
    on_ready: Callable[[Prepared], None] | None = None,
) -> list[EpochRecord]:
    run = prepare(cfg, datasets)
    try:
        return _train_prepared(cfg, out, run, on_ready)
    finally:
        run.close()


def _train_prepared(
    cfg: TrainConfig, out: str | Path | None, run: Prepared, on_ready: Callable[[Prepared], None] | None
) -> list[EpochRecord]:
    if on_ready is not None:
        on_ready(run)
    records: list[EpochRecord] = []
    total_steps, done = cfg.epochs * len(run.loader), 0
    lead = run.rank == 0
    for epoch in range(cfg.epochs):
        record, done = _epoch(
            epoch,
            run.loader,
            run.step,
            run.lr,
            replace(cfg, progress=cfg.progress and lead),
            run.device,
            done,
            total_steps,
            run.world_size,
        )
        if run.test_loader is not None:
            record.test_acc, record.test_images = evaluate(run.model, run.test_loader, run.amp, run.device)
        records.append(record)
        if out is not None and lead:
            _save(Path(out), cfg, run.device, records, run.world_size)
    if "LOCAL_RANK" in os.environ and dist.is_initialized():  # the group prepare() joined for torchrun
        dist.destroy_process_group()
    return records


def _epoch(
    epoch: int,
    loader: Any,
    step: Any,
    lr: torch.Tensor,
    cfg: TrainConfig,
    device: torch.device,
    done: int,
    total: int,
    world: int = 1,
) -> tuple[EpochRecord, int]:
    from tqdm.auto import tqdm

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    loss_sum = torch.zeros((), device=device)
    images, wait = 0, 0.0
    sync(device)
    with UtilisationMonitor(device) as monitor:
        t0 = time.perf_counter()
        it = iter(loader)
        bar = tqdm(total=len(loader), desc=f"epoch {epoch}", unit="batch", disable=not cfg.progress, leave=False)
        while True:
            tw = time.perf_counter()
            batch = next(it, None)
            wait += time.perf_counter() - tw
            if batch is None:
                break
            x, y = batch
            lr.fill_(_lr_at(done, total, cfg.lr))  # a device-side write: no host sync
            loss_sum += step(x, y)
            images += y.shape[0]
            done += 1
            bar.update(1)
        sync(device)
        seconds = time.perf_counter() - t0
        bar.close()
    if world > 1:  # the mean loss over the ranks, and the images every rank trained on
        totals = torch.stack([loss_sum.double(), torch.tensor(float(images), device=device, dtype=torch.float64)])
        dist.all_reduce(totals)
        loss_sum, images = totals[0] / world, int(totals[1].item())
    record = EpochRecord(
        epoch=epoch,
        epoch_s=seconds,
        images=images,
        images_per_s=images / seconds,
        data_wait_fraction=wait / seconds,
        train_loss=loss_sum.item() / max(1, len(loader)),
        test_acc=None,
        gpu_util=monitor.mean,
        lr=_lr_at(done - 1, total, cfg.lr),
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        notes=[monitor.unavailable] if monitor.unavailable and device.type == "cuda" else [],
    )
    return record, done


def _save(out: Path, cfg: TrainConfig, device: torch.device, records: list[EpochRecord], world: int = 1) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device, world_size=world)
    payload = {"config": asdict(cfg), "environment": env, "epochs": [asdict(r) for r in records]}
    tmp = out / "train.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2))
    tmp.replace(out / "train.json")
