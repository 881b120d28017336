"""What :func:`gpufeed.diagnose` looks for: each check returns a :class:`Finding` (with its fix) or None.

Every check reads evidence the diagnosis gathered (:class:`Evidence`) and the loader itself
(unwrapped down to a ``DataLoader`` where there is one); none changes anything.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from .device import usable_cores

__all__ = ["CHECKS", "DATA_COST_WORTH", "Evidence", "Finding", "unwrap_dataloader"]

DATA_COST_WORTH = 0.05  # below this share of the loop, faster loading cannot buy much


@dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    fix: str
    expected_gain: str


@dataclass
class Evidence:
    device: torch.device
    wait_s: list[float]
    step_s: list[float]
    wall_s: float
    data_wait_fraction: float
    verdict: str
    batch_on_host: bool | None = None
    batch_pinned: bool | None = None
    batch_bytes: int | None = None
    copy_s: dict[str, float] = field(default_factory=dict)  # one batch's host-to-device copy: pageable / pinned
    fp32_ops: int = 0  # conv/linear/matmul calls seen in fp32 with autocast off, in one probe step
    low_precision_ops: int = 0
    idle_step_s: float | None = None  # median step on one batch with the loader idle
    contention_fraction: float = 0.0  # wall time lost to steps slowed by the loader's work

    @property
    def data_cost_fraction(self) -> float:
        """What the loader costs the loop: waiting for batches, plus steps it slowed down."""
        return self.data_wait_fraction + self.contention_fraction


def unwrap_dataloader(loader: Any) -> DataLoader | None:
    """The ``DataLoader`` inside gpufeed's wrappers (prefetch, train loaders), if there is one."""
    for _ in range(4):
        if isinstance(loader, DataLoader):
            return loader
        loader = getattr(loader, "loader", None) or getattr(loader, "iterable", None)
    return None


def _cacheable(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    """Whatever the verdict: a pipeline gpufeed can run batched is worth knowing about."""
    transform = getattr(dl.dataset, "transform", None) if dl is not None else None
    if dl is None or transform is None:
        return None
    from .pipeline.probe import probe

    try:
        probe(dl.dataset, [transform])  # what accelerate() itself checks first, on a few samples
    except Exception:  # not batchable: tuning the DataLoader is the remaining fix
        return None
    cost = ev.data_cost_fraction
    parts = f"waiting {ev.data_wait_fraction:.0%}" + (
        f", steps slowed by its workers {ev.contention_fraction:.0%}" if ev.contention_fraction else ""
    )
    return Finding(
        "per-sample-transforms",
        f"{type(dl.dataset).__name__} runs its transform per sample in Python; gpufeed.accelerate can cache its "
        "deterministic part once and run the random part batched on the device (its planner accepted this "
        "pipeline on a few samples)",
        "loader = gpufeed.accelerate(dataset, batch_size=..., shuffle=True, device=...)",
        f"the loader costs {cost:.0%} of this loop's wall time ({parts}): worth at most "
        f"{1 / max(1e-9, 1 - min(cost, 0.999)):.2f}x to the loop; batched on the device that falls to a few kernels "
        "per batch" + ("" if cost >= DATA_COST_WORTH else ": little to gain here, the loop is bound elsewhere"),
    )


def _contention(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if ev.contention_fraction == 0.0 or ev.idle_step_s is None:
        return None
    loop = statistics.median(ev.step_s)
    workers = f"its {dl.num_workers} workers" if dl is not None and dl.num_workers else "the loader's work"
    return Finding(
        "cpu-contention",
        f"a step takes {loop * 1e3:.1f} ms while the loader runs and {ev.idle_step_s * 1e3:.1f} ms with it idle: "
        f"{workers} compete with the training step for the {usable_cores()} usable cores",
        "take the per-sample work off the CPU (gpufeed.accelerate(dataset, ...)), or give the loader fewer "
        "workers: gpufeed.tune_dataloader(dataset, batch_size, step_s=...)",
        f"up to {ev.contention_fraction:.0%} of wall time ({loop / ev.idle_step_s:.1f}x slower steps)",
    )


def _fits_on_device(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    data = getattr(dl.dataset, "data", None) if dl is not None else None
    if ev.device.type != "cuda" or data is None or not hasattr(data, "nbytes"):
        return None
    free, _ = torch.cuda.mem_get_info(ev.device)
    if data.nbytes > 0.5 * free:
        return None
    return Finding(
        "fits-on-device",
        f"the dataset's images take {data.nbytes / 2**20:.0f} MiB and the GPU has {free / 2**30:.1f} GiB free",
        "keep it on the GPU as uint8: gpufeed.accelerate(dataset, ...) or gpufeed.DeviceLoader(images, labels, ...)",
        "no host work or copies per batch: the loader's cost drops to a few kernels per batch",
    )


def _unpinned(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if ev.device.type != "cuda" or not ev.batch_on_host or ev.batch_pinned:
        return None
    gain = ""
    if "pageable" in ev.copy_s and "pinned" in ev.copy_s:
        gain = f"one batch copies in {ev.copy_s['pinned'] * 1e3:.2f} ms pinned vs {ev.copy_s['pageable'] * 1e3:.2f} ms"
    return Finding(
        "unpinned-copies",
        "batches arrive in pageable host memory, so each copy to the GPU is synchronous and slower",
        "DataLoader(..., pin_memory=True) and .to(device, non_blocking=True), or wrap it: gpufeed.prefetch(loader)",
        gain or "copies overlap compute instead of stalling it",
    )


def _workers(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if dl is None:
        return None
    cores = usable_cores()
    if dl.num_workers > cores:
        return Finding(
            "too-many-workers",
            f"num_workers={dl.num_workers} exceeds the {cores} usable cores: workers compete with each other "
            "and with the training loop",
            f"num_workers <= {cores}; measure with gpufeed.tune_dataloader(dataset, batch_size)",
            "less contention; memory per worker saved",
        )
    if ev.verdict == "data-bound" and dl.num_workers < cores:  # (contention: more workers make it worse)
        return Finding(
            "too-few-workers",
            f"the loop is data-bound with num_workers={dl.num_workers} while {cores} cores are usable",
            "more workers, chosen by measurement: gpufeed.tune_dataloader(dataset, batch_size).kwargs",
            f"up to about {cores / max(1, dl.num_workers):.0f}x the loader's throughput while it is the bottleneck "
            "(1.7x measured with 2 workers on 2 cores for torchvision's CIFAR transforms)",
        )
    return None


def _cudnn_first_step(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if not torch.backends.cudnn.benchmark or len(ev.step_s) < 3:
        return None
    first, median = ev.step_s[0], statistics.median(ev.step_s[1:])
    if first < 1.0 or first < 5 * median:
        return None
    return Finding(
        "cudnn-autotune",
        f"the first step took {first:.1f} s, {first / median:.0f}x the median step: with "
        "torch.backends.cudnn.benchmark=True every new input shape is auto-tuned",
        "keep every batch the same shape (drop_last=True) so tuning happens once; warm up before timing",
        f"{first:.1f} s once per new shape",
    )


def _ragged_last_batch(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if dl is None or dl.batch_size is None or dl.drop_last or not torch.backends.cudnn.benchmark:
        return None
    tail = len(dl.dataset) % dl.batch_size  # type: ignore[arg-type]
    if tail == 0:
        return None
    return Finding(
        "ragged-last-batch",
        f"the last batch of every epoch has {tail} samples instead of {dl.batch_size}; with cudnn.benchmark on, "
        "that new shape is auto-tuned again (seconds, measured up to 8 s on an H200)",
        "DataLoader(..., drop_last=True) for training",
        "the re-tuning time, once per epoch",
    )


def _forked_after_cuda(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if dl is None or dl.num_workers == 0 or not torch.cuda.is_initialized():
        return None
    ctx = dl.multiprocessing_context
    method = (
        ctx.get_start_method()
        if ctx is not None
        else multiprocessing.get_start_method(allow_none=True) or ("fork" if os.name == "posix" else "spawn")
    )
    if method != "fork":
        return None
    return Finding(
        "fork-after-cuda",
        "DataLoader workers are forked from a process whose CUDA is initialised; this crashed workers in a "
        "measured run",
        "DataLoader(..., multiprocessing_context='forkserver', persistent_workers=True): forkserver takes seconds "
        "to start workers, persistent workers pay that once",
        "no worker crashes; start-up paid once instead of every epoch",
    )


def _fp32(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    if ev.fp32_ops == 0 or ev.low_precision_ops > 0:
        return None
    dtype = "bfloat16" if ev.device.type == "cpu" or torch.cuda.is_bf16_supported() else "float16"
    return Finding(
        "fp32-compute",
        f"{ev.fp32_ops} convolution/matmul calls per step run in float32 with autocast off",
        f"with torch.autocast('{ev.device.type}', dtype=torch.{dtype}): ... (and channels_last for convolutions)",
        "often 2-3x where there are bf16/fp16 matrix units (GPU tensor cores; 3.1x measured for a small CNN on a "
        "bf16-capable CPU)",
    )


CHECKS: tuple[Callable[[DataLoader | None, Evidence], Finding | None], ...] = (
    _cacheable,
    _contention,
    _fits_on_device,
    _unpinned,
    _workers,
    _cudnn_first_step,
    _ragged_last_batch,
    _forked_after_cuda,
    _fp32,
)
