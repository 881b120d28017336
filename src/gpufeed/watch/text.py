"""A :class:`~gpufeed.watch.analyse.WatchReport` as a person reads it, and its timeline plot.

The verdict block is ``gf.diagnose``'s own (:func:`gpufeed.report.diagnosis_text`); around it: how the script
ended, every rank, every loader, the main loader as found, and the fix as measured in the script's process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..report import diagnosis_text, format_table, timeline_plot
from .source import source_lines
from .summary import NO_LOADER, TOO_FEW, LoaderSummary, ReportData
from .verify_text import verify_text
from .worth import offers_change, suggest_verify, worth

__all__ = ["report_text", "save_plot"]

_LOADER_COLUMNS = [
    ("name", "loader", "s"),
    ("cls", "class", "s"),
    ("dataset", "dataset", "s"),
    ("batch_size", "batch", "d"),
    ("num_workers", "workers", "d"),
    ("batches", "batches", "d"),
    ("wait_fraction", "waiting", ".0%"),
    ("img_s", "img/s", ".0f"),
]
_RANK_COLUMNS = [
    ("rank", "rank", "d"),
    ("batches", "batches", "d"),
    ("wait_s", "waiting s", ".2f"),
    ("wall_s", "wall s", ".2f"),
    ("wait_fraction", "waiting", ".0%"),
    ("first_wait_s", "first batch s", ".2f"),
    ("exit", "end", "s"),
]


def report_text(r: ReportData) -> str:
    """The printed report: how the script ended, the verdict and its evidence, the loaders, the fix, the notes."""
    lines = [f"gpufeed diagnose: {' '.join(r.command)}", *_ending(r.exit, r.status, r.verdict == NO_LOADER), ""]
    if r.verdict == NO_LOADER:
        lines += [
            "verdict: no loader found: no DataLoader was iterated",
            "  the script ran without taking a single batch from a torch.utils.data.DataLoader (or a loader wrapping "
            "one: Lightning's, Accelerate's, gf.prefetch), so there is no wait for data to measure",
        ]
        lines += [f"  built but never iterated: {s.name} ({s.cls} over {s.dataset})" for s in r.loaders]
    elif r.verdict == TOO_FEW or r.diagnosis is None:
        lines.append(f"verdict: {TOO_FEW}: nothing to judge on (see the notes)")
    else:
        verdict = diagnosis_text(r.diagnosis).splitlines()
        evidence = next((i for i, line in enumerate(verdict) if not line.startswith(("verdict", "  "))), len(verdict))
        if r.cpu is not None:  # with the evidence, before the findings
            state = "saturated by the script" if r.cpu["saturated"] else "not saturated by the script"
            machine = ""
            if r.machine is not None:
                busy = "busy" if r.machine["busy"] else "not busy"
                machine = (
                    f"; the machine {r.machine['percent']:.0f}% of its {r.machine['cores']:.0f} cores, every process "
                    f"counted (load {r.machine['load']:.1f}): {busy}"
                )
            verdict.insert(
                evidence,
                f"  CPU while the steps ran: main process {r.cpu['main_percent']:.0f}%, loader workers "
                f"{r.cpu['workers_percent']:.0f}% of one core; {r.cpu['cores']:.0f} usable cores {state}{machine}",
            )
        if not r.diagnosis.findings:  # gf.diagnose's "no findings" line: the worth line below says it better
            verdict = [line for line in verdict if not line.startswith("- no findings")]
        lines += verdict
    if r.world_size > 1 and r.ranks:
        lines += [
            "",
            f"ranks ({r.world_size} processes):",
            _indent(format_table([vars(x) for x in r.ranks], _RANK_COLUMNS)),
        ]
        if r.slowest_rank is not None:
            lines.append(f"  slowest rank: {r.slowest_rank} (it waited most for data; the others wait for it)")
    if r.loaders:
        rows = [{**vars(s), "name": ("* " if s.main else "  ") + s.name} for s in r.loaders]
        lines += ["", "loaders (* the main one):", _indent(format_table(rows, _LOADER_COLUMNS))]
    if r.main is not None and r.main.batches:
        lines += ["", *_as_found(r.main)]
    lines += _fix(r)
    lines += [f"note: {n}" for n in r.notes]
    if r.verify is not None:
        lines += ["", *verify_text(r.verify)]
    if r.diagnosis is not None:
        lines += ["", f"worth doing: {worth(r)}"]
        if suggest_verify(r):
            lines.append(f"  check it on this script: gpufeed diagnose --verify -- {' '.join(r.command)}")
    return "\n".join(lines)


def save_plot(r: ReportData, path: Path) -> None:
    """The main loader's timeline (gf.diagnose's plot), or a figure saying why there is none."""
    if r.diagnosis is not None:
        timeline_plot(r.diagnosis, path)
        return
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, f"gpufeed diagnose: {r.verdict}", ha="center", va="center", fontsize=12)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ending(exit: str, status: int | None = None, nothing: bool = False) -> list[str]:
    if status not in (None, 0) and nothing and exit == "finished":
        return [
            f"!! the command exited with status {status} before taking a batch: did it start? (its own output "
            "above says why: a missing file, a bad argument)"
        ]
    if exit.startswith("crashed"):
        return [f"!! the script crashed ({exit.partition(': ')[2]}); what follows is what was measured before it"]
    if exit.startswith("interrupted"):
        return [
            "!! the script was interrupted (Ctrl-C, --time or a signal); what follows is what was measured until then"
        ]
    if exit == "no record":
        return ["!! no process of the script wrote a record"]
    if exit == "finished" and status not in (None, 0):
        return [f"(the script finished with exit status {status})"]
    return [f"(the script {'was stopped by gpufeed after the measured steps' if exit == 'stopped' else exit})"]


def _as_found(s: LoaderSummary) -> list[str]:
    lines = [f"the main loader, as found ({s.name}, {s.cls}):"]
    if s.source:
        lines += [f"    {line}" for line in source_lines(s.source)]
    settings = (
        f"batch_size={s.batch_size} num_workers={s.num_workers} pin_memory={s.pin_memory} "
        f"persistent_workers={s.persistent_workers} prefetch_factor={s.prefetch_factor} sampler={s.sampler} "
        f"drop_last={s.drop_last}"
    )
    return [
        *lines,
        f"  dataset:   {s.dataset}",
        f"  transform: {s.transform or 'none'}",
        f"  settings:  {settings}",
        f"  served:    {s.batches} batches over {s.epochs} epoch(s)",
    ]


def _fix(r: ReportData) -> list[str]:
    """The side measurement's figures, the prediction for the loop and the code change, under the heading the
    verdict gives them."""
    side, lines = r.side, []
    data_bound = r.verdict == "data-bound"
    if side is not None:
        head = "the fix, measured" if data_bound else "for reference (the loader is not the limit here)"
        if "error" in side:
            lines += ["", f"{head}: the side measurement failed: {side['error']}"]
        else:
            k, n = side.get("samples"), side.get("dataset_samples")
            of = f" of {n:,}" if n and n != k else ""
            spent = f"; {side['seconds']:.1f} s of a {side['budget_s']:g} s budget" if "budget_s" in side else ""
            lines += ["", f"{head}: {k:,}{of} samples on {side.get('device')} after the script's steps{spent}"]
            lines += _side_figures(side)
    if r.prediction is not None:
        lines += ["", *_prediction(r.prediction)]
    if data_bound or offers_change(r):
        if r.code_change is not None:
            caveat = (
                "" if side and "accelerate" in side else " (not measured: accelerate may still refuse the pipeline)"
            )
            where = f" at {r.change['built_at']}" if r.change and r.change.get("built_at") else ""
            lines += ["", f"code change{where} (with `import gpufeed as gf`){caveat}:"]
            lines += [f"    {line}" for line in r.code_change.splitlines()]
            lines += [f"  ({n})" for n in (r.change or {}).get("notes", [])]
            diff = (r.change or {}).get("diff")
            if diff:
                apply = (r.change or {}).get("apply") or f"patch -p1 < {diff}"
                lines.append(f"  the whole diff: {diff} (apply with: {apply})")
        elif r.no_change_reason:
            lines += ["", f"no code change suggested: {r.no_change_reason}"]
    return lines


def _prediction(p: dict[str, Any]) -> list[str]:
    """The loop now and with the fix, the one-time cost and what the fix stores where."""
    fix = "gf.accelerate" if p["fix"] == "accelerate" else "the tuned settings"
    lines = [
        f"the loop, predicted with {fix}:",
        f"  now:      {p['step_s'] * 1e3:.2f} ms a step ({p['wait_s'] * 1e3:.2f} ms waiting for data, "
        f"{p['rest_s'] * 1e3:.2f} ms the rest)",
        f"  with it:  {p['new_step_s'] * 1e3:.2f} ms a step ({p['new_wait_s'] * 1e3:.2f} ms making the batch): "
        f"{p['speedup']:.2f}x; at most {p['bound']:.2f}x if the data cost nothing (the rest of the step unchanged)",
    ]
    if p["fix"] == "accelerate" and p.get("free_speedup") is not None:
        lines.append(
            f"            up to {p['free_speedup']:.2f}x ({p['free_step_s'] * 1e3:.2f} ms a step) with the cores the "
            f"script's workers used ({p['contended']:.1f} while the steps ran) given to the rest of the step "
            "(predicted from the CPU shares: an upper figure)"
        )
    elif p["fix"] == "accelerate" and p.get("contended", 0) >= 0.25:
        lines.append(
            f"            (the script's workers used {p['contended']:.1f} cores while the steps ran: without them the "
            "rest of the step may shrink too, which is not predicted; the gain can exceed both figures)"
        )
    if p.get("one_time_s"):
        steps = p.get("payback_steps")
        repaid = "never (no step is saved)" if steps is None else f"after {steps:,.0f} steps"
        if steps is not None and p.get("steps_per_epoch"):
            repaid += f" ({steps / p['steps_per_epoch']:.2g} epochs of {p['steps_per_epoch']:,} steps)"
        scale = f", extrapolated {p['scale']:.3g}x from the part measured" if p.get("scale", 1) > 1.001 else ""
        lines.append(f"  once:     {p['one_time_s']:.1f} s before the first batch (importing gpufeed, reading the "
                     f"dataset in{scale}); repaid {repaid}")  # fmt: skip
    if p.get("memory_bytes") is not None:
        on = "in memory" if p.get("device", "cpu").startswith("cpu") else f"on {p['device']}"
        where = {"device": on, "pinned": "in pinned host memory", "mmap": "in a memory-mapped file"}
        held = f"  stores:   {_bytes(p['memory_bytes'])} {where.get(p.get('storage') or '', 'held')}"
        if p.get("disk_bytes"):
            held += f", and writes {_bytes(p['disk_bytes'])} of cache under {p.get('cache_root')} (cache=False: none)"
        else:
            held += ", nothing on disk"
        if p.get("files_bytes"):
            held += f"; the image files take {_bytes(p['files_bytes'])}"
        lines.append(held)
    return lines


def _bytes(n: int) -> str:
    from ..device import fmt_bytes

    return fmt_bytes(n)


def _side_figures(side: dict[str, Any]) -> list[str]:
    script = side.get("script_loader", {}).get("img_s")
    own = "-" if script is None else f"{script:.0f} img/s"
    lines = []
    if "accelerate" in side:
        fast = side["accelerate"]
        lines += ["  gf.accelerate's plan:", *[f"      {x}" for x in str(fast["plan"]).splitlines()]]
        lines.append(
            f"  the loader alone: gf.accelerate {fast['img_s']:.0f} img/s (after {fast['build_s']:.1f} s reading the "
            f"samples in); the script's DataLoader settings {own}"
        )
    elif "refused" in side:
        lines.append(f"  gf.accelerate refused it: {side['refused']['error']}: {side['refused']['reason']}")
    tuned = side.get("tuned")
    if tuned:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in tuned.get("kwargs", {}).items())
        rate = "-" if tuned.get("img_s") is None else f"{tuned['img_s']:.0f} img/s"
        lines.append(
            f"  tune_dataloader ({tuned.get('budget_s', 0):.0f} s): {kwargs or '-'}: {rate}; "
            f"the script's settings: {own}"
        )
    lines += [f"  ({n})" for n in side.get("notes", [])]
    return lines


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
