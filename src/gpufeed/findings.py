"""What :func:`gpufeed.diagnose` looks for: each check returns a :class:`Finding` (with its fix) or None.

Every check reads evidence the diagnosis gathered (:class:`Evidence`) and the loader itself
(unwrapped down to a ``DataLoader`` where there is one); none changes anything.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from .device import Cores, cpu_busy_seconds, cpu_throttling, process_cores, usable_cores

__all__ = [
    "BUSY_CORES",
    "CHECKS",
    "DATA_COST_WORTH",
    "Evidence",
    "Finding",
    "MachineLoad",
    "MachineMeter",
    "Reading",
    "unwrap_dataloader",
]

DATA_COST_WORTH = 0.05  # below this share of the loop, faster loading cannot buy much
# Other processes' CPU use, in cores, from which their contention is said to set a measurement's speed: half a core
# (on the 2-core machine two busy processes beside a DeviceLoader made torch's 2-thread team 10-30x slower), or a
# quarter of the usable cores on larger machines. And the share of the time a cgroup quota may throttle the process.
BUSY_CORES = 0.5
THROTTLED_SHARE = 0.05


@dataclass(frozen=True)
class Reading:
    """One reading of the machine's counters: the clock, the seconds the CPUs this process may run on (its affinity
    mask's) spent busy (every process), this process's and its children's CPU seconds, and its cgroup's throttling
    (periods, seconds) where it has a quota."""

    t: float
    machine_busy_s: float
    own_s: float
    throttled: tuple[int, float] | None = None


@dataclass(frozen=True)
class MachineLoad:
    """What the rest of the machine did while a measurement ran (:class:`MachineMeter`).

    ``others`` and ``own`` are cores' worth of CPU time over the wall time: the busy time of the CPUs this process
    may run on (every process, and the time a hypervisor took, ``steal``) less this process's and its children's,
    and theirs. ``load`` is the 1-minute load average at the end, ``cores`` what this process may use,
    ``throttled_share`` the share of the wall time its cgroup's CPU quota held it back."""

    wall_s: float
    others: float
    own: float
    load: float
    cores: Cores
    throttled_periods: int | None = None
    throttled_share: float | None = None

    @property
    def contending(self) -> float:
        """Cores' worth of the others' CPU time that did not fit on the CPUs this process could leave them: a job of a
        2-core quota on a 64-CPU server shares nothing with 30 busy cores of other jobs."""
        return max(0.0, self.others - (self.cores.affinity - self.cores.usable))

    @property
    def busy(self) -> bool:
        """Other processes took enough of the cores this one may use to set the measured speed (:data:`BUSY_CORES`)."""
        return self.contending >= max(BUSY_CORES, 0.25 * self.cores.usable)

    @property
    def cpus(self) -> str:
        """The CPUs the figures are of, said for a person."""
        c = self.cores
        return f"the machine's {c.machine} cores" if c.affinity == c.machine else f"the {c.affinity} CPUs it may run on"

    @property
    def throttled(self) -> bool:
        return (self.throttled_share or 0.0) >= THROTTLED_SHARE

    def __str__(self) -> str:
        text = (
            f"other processes used {self.others:.2f} of {self.cpus} and this one "
            f"{self.own:.2f} (1-minute load {self.load:.1f}; {self.cores.usable} usable)"
        )
        if self.throttled_share is not None:
            text += f"; the cgroup quota throttled it {self.throttled_share:.0%} of the time"
        return text


def machine_load(before: Reading, after: Reading, load: float, cores: Cores) -> MachineLoad:
    """The :class:`MachineLoad` between two readings (the counters only grow; a negative difference reads 0)."""
    wall = max(1e-9, after.t - before.t)
    own = max(0.0, after.own_s - before.own_s)
    others = max(0.0, after.machine_busy_s - before.machine_busy_s - own)
    periods = share = None
    if before.throttled is not None and after.throttled is not None:
        periods = max(0, after.throttled[0] - before.throttled[0])
        share = min(1.0, max(0.0, after.throttled[1] - before.throttled[1]) / wall)
    return MachineLoad(wall, others / wall, own / wall, load, cores, periods, share)


class MachineMeter:
    """Reads the machine's counters when made and again at :meth:`read`: other processes' CPU use, the load, the
    cgroup's throttling (psutil's ``cpu_times``; none of it changes anything).

    Example:
        >>> meter = MachineMeter()
        >>> load = meter.read()
        >>> load.others >= 0 and load.cores.usable >= 1
        True
    """

    def __init__(self, exclude: Iterable[int] = ()) -> None:
        self.cores = process_cores()
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None  # the CPUs it may run on
        self.exclude = set(exclude)  # children counted as other processes (a benchmark's background load)
        self.before = self.reading()

    def reading(self) -> Reading:
        import psutil

        t = time.perf_counter()
        busy = cpu_busy_seconds(self.cpus)
        if busy is None:  # no /proc/stat (not Linux): every CPU, from psutil
            cpu = psutil.cpu_times()
            busy = sum(getattr(cpu, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        me = psutil.Process()
        own = 0.0
        for p in [me, *(c for c in me.children(recursive=True) if c.pid not in self.exclude)]:
            try:
                times = p.cpu_times()
            except psutil.Error:  # a child that exited between listing and reading
                continue
            own += times.user + times.system
        own += me.cpu_times().children_user + me.cpu_times().children_system  # children waited for already
        folder = self.cores.quota_folder
        return Reading(t, busy, own, cpu_throttling(folder) if folder else None)

    def read(self) -> MachineLoad:
        """The :class:`MachineLoad` since the meter was made."""
        return machine_load(self.before, self.reading(), os.getloadavg()[0], self.cores)


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
    machine: MachineLoad | None = None  # what other processes did meanwhile

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


def _busy_machine(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    m = ev.machine
    if m is None or not m.busy:
        return None
    free = m.cores.usable - m.contending
    workers = f"num_workers <= {max(0, round(free) - 1)}, " if dl is not None and dl.num_workers else ""
    return Finding(
        "busy-machine",
        f"other processes used {m.others:.1f} of {m.cpus} while the loop ran (1-minute "
        f"load {m.load:.1f}, {m.cores.usable} usable cores; this process and its workers {m.own:.1f}): the machine's "
        "contention, not the data, set the times measured here",
        "measure again when the machine is quiet, or give the job cores of its own (taskset -c, a cpuset, a "
        f"container's --cpuset-cpus); on the shared cores ask for what is free: {workers}"
        f"torch.set_num_threads({max(1, round(free))}) (gpufeed's own ops choose 1 thread under contention: "
        "GPUFEED_THREADS)",
        (
            f"the loop may run up to {m.cores.usable / free:.1f}x faster alone"
            if free > 0.1
            else "the loop's speed alone is unknown: other processes took every usable core"
        ),
    )


def _throttled(dl: DataLoader | None, ev: Evidence) -> Finding | None:
    m = ev.machine
    if m is None or not m.throttled or m.throttled_share is None or m.cores.quota is None:
        return None
    return Finding(
        "cpu-quota",
        f"the cgroup CPU quota of {m.cores.quota:.2f} cores ({m.cores.quota_from}) held this process back for "
        f"{m.throttled_share:.0%} of the loop's time ({m.throttled_periods} periods throttled): its threads and "
        "workers asked for more CPU than the quota gives",
        f"at most {m.cores.usable} busy threads in all: num_workers + torch.set_num_threads(...) <= "
        f"{m.cores.usable}, or a larger quota (docker --cpus, a Kubernetes CPU limit)",
        f"up to {1 / max(1e-9, 1 - m.throttled_share):.1f}x for the throttled time",
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
    _busy_machine,
    _throttled,
)
