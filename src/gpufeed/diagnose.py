"""diagnose(): is this training loop waiting on data, and what would fix it?

It runs the caller's own loop (``step_fn(batch)`` for each batch of ``loader``) for some steps and
measures, per step, the host time spent waiting for the next batch and the time in the step (plus
the step's span on the GPU, from CUDA events read once at the end). GPU utilisation comes from
NVML where available, CPU utilisation from psutil. One extra step runs under a probe that counts
float32 convolutions and matmuls; on a GPU, five more on one batch run under torch's profiler to
measure how much of a step's wall time kernels actually run. The verdict:

- ``"data-bound"``: at least 25% of the wall time is spent waiting for batches;
- ``"data-bound (CPU contention)"``: little waiting, but the steps themselves run slower while the
  loader works: a few steps on one cached batch with the loader idle (after the measured loop)
  are timed against the steps in the loop, and the slowdown costs at least 25% of the wall time
  (DataLoader workers competing with the training step for the cores);
- ``"launch-bound"``: little waiting, yet the GPU is busy less than 60% of the time (kernels too
  small to hide the host's launch overhead: larger batches, CUDA graphs, torch.compile);
- ``"compute-bound"``: otherwise -- the data pipeline is not the problem.

A loader that ends before ``steps`` is iterated again (the next epoch), and the report says how
many steps were measured over how many epochs.

Three lines for your own loop::

    report = gpufeed.diagnose(train_loader, lambda batch: train_step(*batch), steps=100)
    print(report)
    report.save("diagnosis")   # report.md, report.json, timeline.png
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .device import resolve_device, sync
from .errors import ConfigError
from .findings import CHECKS, Evidence, Finding, MachineMeter, unwrap_dataloader
from .loading.prefetch import map_tensors

__all__ = ["DATA_BOUND_FRACTION", "LAUNCH_BOUND_BUSY", "Report", "diagnose"]

DATA_BOUND_FRACTION = 0.25
LAUNCH_BOUND_BUSY = 0.60
CONTENTION_SLOWDOWN = 1.3  # a step this much slower in the loop than with the loader idle is contended
_IDLE_STEPS = 5


@dataclass
class Report:
    """The diagnosis: ``verdict``, ``data_wait_fraction``, ``findings`` (each with its fix), and the evidence."""

    verdict: str
    data_wait_fraction: float
    steps: int
    wall_s: float
    wait_s: list[float]
    step_s: list[float]
    device_step_s: list[float] | None
    gpu_busy_fraction: float | None
    gpu_timeline: list[tuple[float, float, float]]  # (seconds since start, GPU %, memory used MiB)
    cpu_percent: float | None
    device: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    idle_step_s: float | None = None  # median step on one cached batch with the loader idle
    contention_fraction: float = 0.0  # wall time lost to steps slowed while the loader ran
    epochs: int = 1  # epochs of the loader the measured steps spanned

    def __str__(self) -> str:
        from .report import diagnosis_text

        return diagnosis_text(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: str | Path) -> Path:
        """Write ``report.md``, ``report.json`` and ``timeline.png`` to ``directory``."""
        from .report import timeline_plot

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(self.to_dict(), indent=2))
        (out / "report.md").write_text(f"# gpufeed diagnosis\n\n```\n{self}\n```\n\n![timeline](timeline.png)\n")
        timeline_plot(self, out / "timeline.png")
        return out


class _PrecisionProbe(TorchFunctionMode):
    """Counts conv/linear/matmul calls by whether they would run in float32 (autocast off) or lower."""

    _OPS = {
        torch.nn.functional.conv2d,
        torch.nn.functional.conv1d,
        torch.nn.functional.conv3d,
        torch.nn.functional.linear,
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
    }

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type, self.fp32, self.low = device_type, 0, 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self._OPS and args and isinstance(args[0], torch.Tensor):
            if args[0].dtype == torch.float32 and not torch.is_autocast_enabled(self.device_type):
                self.fp32 += 1
            elif args[0].dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(self.device_type):
                self.low += 1
        return func(*args, **(kwargs or {}))


def _batch_facts(batch: Any) -> tuple[bool | None, bool | None, int]:
    tensors: list[torch.Tensor] = []
    map_tensors(batch, lambda t: tensors.append(t) or t)  # type: ignore[func-returns-value]
    if not tensors:
        return None, None, 0
    on_host = all(t.device.type == "cpu" for t in tensors)
    pinned = all(t.is_pinned() for t in tensors) if on_host and torch.cuda.is_available() else None
    return on_host, pinned, sum(t.nbytes for t in tensors)


def _copy_times(batch: Any, device: torch.device) -> dict[str, float]:
    """One batch copied to the device from pageable and from pinned memory (median of 3 each)."""
    tensors: list[torch.Tensor] = []
    map_tensors(batch, lambda t: tensors.append(t) or t)  # type: ignore[func-returns-value]
    out = {}
    for name, source in [("pageable", [t.clone() for t in tensors]), ("pinned", [t.pin_memory() for t in tensors])]:
        times = []
        for _ in range(3):
            sync(device)
            t0 = time.perf_counter()
            for t in source:
                t.to(device, non_blocking=name == "pinned")
            sync(device)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def diagnose(
    loader: Iterable[Any],
    step_fn: Callable[[Any], Any],
    steps: int = 100,
    *,
    device: str | torch.device | None = None,
) -> Report:
    """Run ``step_fn(batch)`` for ``steps`` batches of ``loader`` and say what limits the loop.

    Args:
        loader: any iterable of batches (a ``DataLoader``, a gpufeed loader, ...). Fresh iterators
            are taken, one per epoch the ``steps`` span, so a gpufeed loader advances by as many
            epochs as in training.
        step_fn: one training step on one batch, exactly as the loop calls it.
        steps: steps to measure (fewer if the loader ends first). More steps follow on one batch: a
            probe that counts float32 matmuls and convolutions and, on a GPU, five under the profiler.
            They train the model further, as the measured steps do.
        device: the training device; ``None``: CUDA if available, else CPU.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ConfigError(f"steps={steps!r} must be an int >= 2")
    dev = resolve_device(device)
    from .train.monitor import UtilisationMonitor

    # this process's and its workers' CPU, and what other processes do meanwhile: the machine's contention may set
    # the speed
    machine = MachineMeter()
    wait_s: list[float] = []
    step_s: list[float] = []
    events: list[tuple[Any, Any]] = []
    first_batch: Any = None
    it: Iterator[Any] | None = iter(loader)
    epochs, per_epoch = 1, None
    sync(dev)
    with UtilisationMonitor(dev, interval_s=0.02) as monitor:
        t_start = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = next(it, _END)  # type: ignore[arg-type]  # it is set until the loop ends
            if batch is _END:  # the epoch ended first: go on into the next one, as training would
                per_epoch = per_epoch or len(step_s)
                it = iter(loader)
                batch = next(it, _END)
                if batch is _END:  # a one-shot iterable, or an empty loader
                    break
                epochs += 1
            t1 = time.perf_counter()
            if first_batch is None:
                first_batch = batch
            if dev.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            step_fn(batch)
            if dev.type == "cuda":
                end.record()
                events.append((start, end))
            wait_s.append(t1 - t0)
            step_s.append(time.perf_counter() - t1)
        sync(dev)
        wall = time.perf_counter() - t_start
    machine_load = machine.read()  # the measured steps only, not the probes below
    cpu_percent = 100 * machine_load.own
    if len(step_s) < 2:
        raise ConfigError(f"the loader yielded {len(step_s)} batch(es) in all; diagnose needs at least 2")
    notes: list[str] = []
    if len(step_s) < steps or epochs > 1:
        span = f"over {epochs} epochs of {per_epoch} batches" if epochs > 1 else "in one epoch"
        why = "" if len(step_s) == steps else ": the loader yields no more (a one-shot iterable?)"
        notes.append(f"measured {len(step_s)} of {steps} steps {span}{why}")
    it = None  # the loader idles from here (non-persistent DataLoader workers shut down)
    probe_batch = first_batch
    probe = _PrecisionProbe(dev.type)
    with probe:
        step_fn(probe_batch)
    sync(dev)
    idle = _idle_step_s(step_fn, probe_batch, dev)
    device_step = [s.elapsed_time(e) / 1e3 for s, e in events] if events else None
    busy = None
    if dev.type == "cuda":
        busy, why = _step_duty_cycle(step_fn, probe_batch, dev)
        if busy is None and monitor.mean is not None:
            busy = monitor.mean / 100
        elif busy is None:
            notes.append(
                f"GPU busy fraction unknown ({why}; NVML: {monitor.unavailable}); launch-bound cannot be "
                "told apart from compute-bound"
            )
    fraction = sum(wait_s) / wall
    contended = statistics.median(step_s) > CONTENTION_SLOWDOWN * idle
    contention = sum(max(0.0, s - idle) for s in step_s) / wall if contended else 0.0
    if fraction >= DATA_BOUND_FRACTION:
        verdict = "data-bound"
    elif contention >= DATA_BOUND_FRACTION:
        verdict = "data-bound (CPU contention)"
    else:
        verdict = "launch-bound" if busy is not None and busy < LAUNCH_BOUND_BUSY else "compute-bound"
    on_host, pinned, nbytes = _batch_facts(first_batch)
    ev = Evidence(
        dev,
        wait_s,
        step_s,
        wall,
        fraction,
        verdict,
        on_host,
        pinned,
        nbytes,
        _copy_times(first_batch, dev) if dev.type == "cuda" and on_host else {},
        probe.fp32,
        probe.low,
        idle,
        contention,
        machine_load,
    )
    dl = unwrap_dataloader(loader)
    findings = [f for check in CHECKS if (f := check(dl, ev)) is not None]
    timeline = [(t, u, m) for t, u, m in getattr(monitor, "timeline", [])]
    return Report(
        verdict,
        fraction,
        len(step_s),
        wall,
        wait_s,
        step_s,
        device_step,
        busy,
        timeline,
        cpu_percent,
        str(dev),
        findings,
        notes,
        idle,
        contention,
        epochs,
    )


_END = object()


def _idle_step_s(step_fn: Callable[[Any], Any], batch: Any, device: torch.device) -> float:
    """The median step on one cached batch once the loader is idle (its workers done or shut down).

    Timed as the loop times its steps: the host's time in ``step_fn``, from a drained device (after a data
    wait the device has usually caught up) and with no sync inside, so the two compare like with like."""
    gc.collect()  # the released iterator's workers go now, not at some later collection
    time.sleep(0.2)  # persistent workers finish the batches they were asked for
    times = []
    for _ in range(_IDLE_STEPS):
        sync(device)
        t0 = time.perf_counter()
        step_fn(batch)
        times.append(time.perf_counter() - t0)
    sync(device)
    return statistics.median(times)


def _step_duty_cycle(
    step_fn: Callable[[Any], Any], batch: Any, device: torch.device, steps: int = 5
) -> tuple[float | None, str]:
    """The fraction of wall time kernels run during ``steps`` steps on one batch (no data wait), by the profiler.

    Under 60% means the GPU idles between small kernels while the host launches the next ones:
    launch-bound. Returns ``(None, why)`` if the profiler cannot see CUDA kernels here.
    """
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                step_fn(batch)
            sync(device)
            wall = time.perf_counter() - t0
        kernel_us = sum(
            getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in prof.key_averages()
        )
    except Exception as e:  # CUPTI missing or refused: say so in the report
        return None, f"the CUDA profiler is unavailable: {type(e).__name__}"
    if kernel_us <= 0:
        return None, "the CUDA profiler recorded no kernels"
    return min(1.0, kernel_us / 1e6 / wall), ""
