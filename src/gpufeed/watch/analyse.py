"""The report of a watched script: its records read as ``gf.diagnose`` reads a loop, with the fix measured.

The main loader is the training loader: the one that served the most batches asked for with autograd on (an
evaluation loop runs under no_grad or inference_mode), else the most batches (over all ranks: a loader is the same
on every rank when its creation order and call site are). Its batches after the first (whose wait includes the
workers' start-up) and before the last (no step follows it) give the verdict, by :mod:`gpufeed.diagnose`'s rules
and thresholds:

- ``"data-bound"``: at least :data:`~gpufeed.diagnose.DATA_BOUND_FRACTION` of the wall time waiting in ``next()``;
- ``"launch-bound"``: otherwise, with NVML's GPU utilisation under :data:`~gpufeed.diagnose.LAUNCH_BOUND_BUSY`
  while the steps ran (only where NVML sampled it);
- ``"compute-bound"``: otherwise.

``gf.diagnose``'s third verdict, CPU contention, rests on timing the step with the loader idle, which would change
the script's course; it is not made here, and the report says so, giving instead the CPU the main process and the
loader's workers used while the steps ran (saturated cores or not). Under torchrun the slowest rank (the one that
waited most: the others wait for it at each gradient exchange) gives the verdict, and every rank is listed.

Example:
    >>> from gpufeed.watch.record import LoaderRecord, ProcessRecord
    >>> ld = LoaderRecord(0, "DataLoader", "train.py:9", None, "CIFAR10", None, 32, 0, False, False, None,
    ...                   "RandomSampler", False, epochs=1, requested=[0.0, 1.0, 2.0, 3.0],
    ...                   waits=[0.5, 0.5, 0.5, 0.5], samples=[32] * 4)
    >>> rec = ProcessRecord(0, 1, 1, ["train.py"], "cpu", 0.0, 4.0, "finished", [ld], [], 2, [])
    >>> r = report([rec])
    >>> r.verdict, r.data_wait_fraction
    ('data-bound', 0.5)
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..diagnose import CONTENTION_SLOWDOWN, DATA_BOUND_FRACTION, LAUNCH_BOUND_BUSY, Report
from .advice import Change, rewrite
from .contention import contention
from .fixes import fixes
from .predict import predict, tuned_better
from .record import LoaderRecord, ProcessRecord
from .summary import NO_LOADER, TOO_FEW, LoaderSummary, RankSummary, ReportData
from .text import report_text, save_plot

__all__ = ["NO_LOADER", "TOO_FEW", "LoaderSummary", "RankSummary", "WatchReport", "report"]

SATURATED = 0.9  # CPU use at or over this share of the usable cores: the cores were saturated
_MIN_BATCHES = 3  # the first (start-up) and the last (no step after it) are left out: one measured step at least


class WatchReport(ReportData):
    """What ``gpufeed diagnose -- CMD`` found: ``str()`` is the printed report; :meth:`save` writes it."""

    def __str__(self) -> str:
        return report_text(self)

    def save(self, directory: str | Path) -> Path:
        """Write ``report.md``, ``report.json`` and ``timeline.png`` to ``directory``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(self.to_dict(), indent=2, default=str))
        (out / "report.md").write_text(f"# gpufeed diagnosis\n\n```\n{self}\n```\n\n![timeline](timeline.png)\n")
        save_plot(self, out / "timeline.png")
        return out


@dataclass
class _Window:
    """The measured batches of one loader in one process: after the first, before the last."""

    waits: list[float]
    steps: list[float]
    samples: int
    start: float  # when the second batch was requested (the clock of the record)
    end: float  # when the last batch was requested
    device_steps: list[float] | None

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def fraction(self) -> float:
        return sum(self.waits) / self.wall if self.wall > 0 else 0.0


def report(records: list[ProcessRecord]) -> WatchReport:
    """The report of a watched script from its processes' records (one per process, any order)."""
    records = sorted(records, key=lambda r: (r.rank, r.pid))
    out = WatchReport(
        NO_LOADER,
        None,
        _worst_exit(records),
        records[0].argv if records else [],
        max((r.world_size for r in records), default=1),
        next((r.device for r in records if r.device != "cpu"), records[0].device if records else "cpu"),
        side=next((r.side for r in records if r.side is not None), None),
        notes=[f"rank {r.rank}: {n}" if len(records) > 1 else n for r in records for n in r.notes],
    )
    keys = _loader_keys(records)
    if not any(ld.batches for found in keys.values() for _, ld in found):
        out.loaders = [_summary(found, False) for found in keys.values()]
        return out
    # the training loader: most batches asked for with autograd on (an evaluation pass, under no_grad or
    # inference_mode, can serve more); most batches of all where none was
    main_key = max(
        keys,
        key=lambda k: (sum(ld.training_batches for _, ld in keys[k]), sum(ld.batches for _, ld in keys[k])),
    )
    out.loaders = [_summary(keys[main_key], True)] + [_summary(f, False) for k, f in keys.items() if k != main_key]
    out.ranks = [_rank(rec, ld) for rec, ld in keys[main_key]]
    _change(out)
    measured = [(rec, ld, w) for rec, ld in keys[main_key] if (w := _window(ld)) is not None]
    if not measured:
        out.verdict = TOO_FEW
        out.notes.append(
            f"the main loader served {out.loaders[0].batches} batch(es); a verdict needs {_MIN_BATCHES} in one "
            "process (the first waits for the workers' start-up, the last has no step after it)"
        )
        return out
    rec, ld, win = max(measured, key=lambda m: m[2].fraction)  # the slowest rank sets everyone's pace
    busy, gpu_note = _gpu_busy(rec, win)
    out.verdict = "data-bound" if win.fraction >= DATA_BOUND_FRACTION else "compute-bound"
    if out.verdict != "data-bound" and busy is not None and busy < LAUNCH_BOUND_BUSY:
        out.verdict = "launch-bound"
    out.data_wait_fraction, out.cpu, out.machine = win.fraction, _cpu(rec, win), _machine(rec, win)
    out.step_s, out.wait_s = win.wall / len(win.waits), sum(win.waits) / len(win.waits)
    prediction = predict(out.wait_s, out.step_s - out.wait_s, out.side, out.world_size)
    if prediction is not None and out.cpu is not None and out.loaders[0].num_workers:
        prediction.contended = out.cpu["workers_percent"] / 100
        competing = contention(out.cpu, out.loaders[0].num_workers, out.device)
        if competing is not None and prediction.fix == "accelerate":  # no workers: their cores go to the step
            prediction.free_step_s = prediction.rest_s * competing.rest_factor + prediction.new_wait_s
            prediction.free_speedup = prediction.step_s / prediction.free_step_s
    out.prediction = asdict(prediction) if prediction is not None else None
    out.slowest_rank = rec.rank if len(measured) > 1 else None
    out.notes += [gpu_note] if gpu_note else []
    out.notes += [
        f"the first batch ({ld.waits[0]:.2f} s waiting, the loader's start-up included) and the "
        f"last (no step follows it) are left out: {len(win.waits)} steps measured of {ld.batches} batches",
        f"CPU contention was not checked as gf.diagnose checks it (a step over {CONTENTION_SLOWDOWN:g}x slower with "
        "the loader running than with it idle): that needs steps run without the loader, which would change the "
        "script's course; the CPU use while the steps ran is given instead",
    ]
    gpu = [(t - win.start, u, m) for t, u, m in rec.gpu if win.start <= t <= win.end]
    found = fixes(out, rec.cores)
    out.diagnosis = Report(
        out.verdict, win.fraction, len(win.steps), win.wall, win.waits, win.steps, win.device_steps, busy, gpu,
        None, rec.device, found,
    )  # fmt: skip
    return out


def _loader_keys(records: list[ProcessRecord]) -> dict[tuple[int, str | None], list[tuple[ProcessRecord, Any]]]:
    """Each loader (creation order, call site) with its record in every process that built it."""
    keys: dict[tuple[int, str | None], list[tuple[ProcessRecord, Any]]] = {}
    for rec in records:
        for ld in rec.loaders:
            keys.setdefault((ld.id, ld.built_at), []).append((rec, ld))
    return keys


def _window(ld: LoaderRecord) -> _Window | None:
    n = ld.batches
    if n < _MIN_BATCHES:
        return None
    t = ld.timeline()
    dev = ld.device_step_s[1 : n - 1] if ld.device_step_s is not None and len(ld.device_step_s) >= n - 1 else None
    inner = slice(1, n - 1)  # after the first (start-up), before the last (no step follows it)
    return _Window(t.waits[inner], t.steps[inner], sum(t.samples[inner]), t.requested[1], t.requested[n - 1], dev)


def _summary(found: list[tuple[ProcessRecord, Any]], main: bool) -> LoaderSummary:
    ld = found[0][1]
    windows = [w for _, other in found if (w := _window(other)) is not None]
    wall = sum(w.wall for w in windows)
    return LoaderSummary(
        ld.id, ld.cls, ld.built_at, ld.source, ld.dataset, ld.transform, ld.batch_size, ld.num_workers,
        ld.pin_memory, ld.persistent_workers, ld.prefetch_factor, ld.sampler, ld.drop_last,
        batches=sum(other.batches for _, other in found), epochs=max(other.epochs for _, other in found),
        wait_fraction=sum(sum(w.waits) for w in windows) / wall if windows and wall > 0 else None,
        img_s=sum(w.samples / w.wall for w in windows if w.wall > 0) if windows else None, main=main,
        init_of=ld.init_of, shuffle=ld.shuffle, batch_sampler=ld.batch_sampler, collate_fn=ld.collate_fn,
        built_by=ld.built_by, file=ld.file,
        first_batch_s=min((o.requested[0] + o.waits[0] for _, o in found if o.waits), default=None), hf=ld.hf,
        unpacked=ld.unpacked,
    )  # fmt: skip


def _change(out: WatchReport) -> None:
    """The change to gf.accelerate (its preview, and where it goes) and why there is none; none when accelerate
    refused the pipeline on this data. A loader a library rebuilt from the script's own (Accelerate's
    ``prepare``, Lightning's sampler injection) is changed where the script built that one."""
    side, main = out.side, out.loaders[0]
    if side is not None and "refused" in side:
        # the tuned settings are the fix only where they measured better (NOTE [ one verdict ] in .worth)
        instead = (
            "the tuned DataLoader settings above are the fix"
            if tuned_better(side)
            else "no DataLoader setting measured better either: make the transform one gf.accelerate can batch "
            "(gpufeed.augment's ops)"
        )
        out.no_change_reason = f"gf.accelerate refused this pipeline ({side['refused']['error']}): {instead}"
        return
    change, reason = rewrite(_as_record(main))
    target, notes = main, []
    if change is None and (main.built_by or "").startswith(_REBUILDERS):
        own = [s for s in out.loaders[1:] if s.dataset == main.dataset and s.built_by is None and s.source]
        for s in own:
            change, _ = rewrite(_as_record(s))
            if change is not None:
                target = s
                notes = [
                    f"{main.name} was made by {main.built_by} from the DataLoader built at {s.name}: that is the one "
                    "to change; build it after Accelerator() or inside the LightningModule/DataModule hook (it reads "
                    "the process group), and prepare() / the Trainer pass a gpufeed loader through"
                ]
                break
    if change is None:
        out.no_change_reason = reason
        return
    out.code_change = change.preview
    line = int(target.built_at.rsplit(":", 1)[1]) if target.built_at and ":" in target.built_at else None
    out.change = {
        "file": target.file, "built_at": target.built_at, "line": line, "old": change.old, "new": change.new,
        "imports": change.imports, "notes": notes + change.notes, "before": change.before,
    }  # fmt: skip


_REBUILDERS = ("accelerate.", "lightning.", "pytorch_lightning.")


def change_of(report: WatchReport) -> Change | None:
    """The report's change as an :class:`~gpufeed.watch.advice.Change` (None without one)."""
    c = report.change
    return None if c is None else Change(c["old"], c["new"], list(c["imports"]), list(c["notes"]), c.get("before"))


def _as_record(s: LoaderSummary) -> LoaderRecord:
    return LoaderRecord(
        s.id, s.cls, s.built_at, s.source, s.dataset, s.transform, s.batch_size, s.num_workers, s.pin_memory,
        s.persistent_workers, s.prefetch_factor, s.sampler, s.drop_last, init_of=s.init_of, shuffle=s.shuffle,
        batch_sampler=s.batch_sampler, collate_fn=s.collate_fn, built_by=s.built_by, file=s.file, hf=s.hf,
        unpacked=s.unpacked,
    )  # fmt: skip


def _rank(rec: ProcessRecord, ld: LoaderRecord) -> RankSummary:
    w = _window(ld)
    return RankSummary(
        rec.rank, rec.pid, rec.exit, ld.batches,
        sum(w.waits) if w else None, w.wall if w else None, w.fraction if w else None,
        ld.waits[0] if ld.waits else None,
    )  # fmt: skip


def _gpu_busy(rec: ProcessRecord, win: _Window) -> tuple[float | None, str]:
    """NVML's mean utilisation while the measured steps ran, as a fraction; and a note when it is unknown."""
    if not rec.device.startswith("cuda"):
        return None, ""
    samples = [u for t, u, _ in rec.gpu if win.start <= t <= win.end]
    if not samples:
        return None, (
            "GPU utilisation was not sampled while the steps ran (NVML missing, or the steps took under one "
            "sampling interval): launch-bound cannot be told apart from compute-bound"
        )
    return statistics.fmean(samples) / 100, ""


def _cpu(rec: ProcessRecord, win: _Window) -> dict[str, float] | None:
    """Mean CPU use of the main process and of its children (the loader's workers) while the steps ran."""
    samples = [(m, c) for t, m, c in rec.cpu if win.start <= t <= win.end]
    if not samples:
        return None
    main, workers = statistics.fmean(m for m, _ in samples), statistics.fmean(c for _, c in samples)
    saturated = (main + workers) / 100 >= SATURATED * rec.cores
    return {"main_percent": main, "workers_percent": workers, "cores": float(rec.cores), "saturated": float(saturated)}


BUSY_MACHINE = 0.9  # the machine's CPU at or over this share of its cores: busy (every process counted)


def _machine(rec: ProcessRecord, win: _Window) -> dict[str, float] | None:
    """The whole machine's mean CPU use (every process, % of all cores) and 1-minute load while the steps ran;
    ``others``: the share of the cores used by processes other than the script's."""
    samples = [(p, load) for t, p, load in rec.machine if win.start <= t <= win.end]
    if not samples:
        return None
    import os

    total = os.cpu_count() or rec.cores
    percent, load = statistics.fmean(p for p, _ in samples), statistics.fmean(x for _, x in samples)
    # the script's processes in % of one core (psutil's convention), the machine's in % of all its cores: both as
    # a share of all the cores before one is taken from the other
    own = (rec_cpu["main_percent"] + rec_cpu["workers_percent"]) / 100 / total if (rec_cpu := _cpu(rec, win)) else 0.0
    others = max(0.0, percent / 100 - own)
    busy = percent / 100 >= BUSY_MACHINE or load >= total
    return {"percent": percent, "load": load, "cores": float(total), "others": others, "busy": float(busy)}


_EXIT_ORDER = ("crashed", "interrupted", "stopped", "finished")


def _worst_exit(records: list[ProcessRecord]) -> str:
    """The end that matters most to the reader: a crash over an interruption over gpufeed's stop over the end."""
    if not records:
        return "no record"

    def rank(e: str) -> int:
        return next((i for i, k in enumerate(_EXIT_ORDER) if e.startswith(k)), len(_EXIT_ORDER))

    return min((r.exit for r in records), key=rank)
