"""What a watched script should change, as ``gf.diagnose``'s findings: each with its fix and what it is worth to the
training loop.

The worth comes from :mod:`gpufeed.watch.predict`: the loop's measured steps with the fix's own time per batch
(measured on the side, in the script's process, on its data and device), bounded by what the loop waits. A fix
measured no better than the script's own settings is not offered; advice about workers comes from measured rates.
"""

from __future__ import annotations

from typing import Any

from ..findings import Finding
from .predict import bound
from .summary import ReportData

__all__ = ["fixes", "worth"]


def fixes(r: ReportData, cores: int) -> list[Finding]:
    """The findings for the main loader of report ``r`` (its verdict, wait fraction, side measurement and
    prediction set).

    Example:
        >>> from gpufeed.watch.analyse import LoaderSummary, WatchReport
        >>> main = LoaderSummary(0, "DataLoader", "t.py:3", None, "CIFAR10", None, 64, 0, False, False, None,
        ...                      "RandomSampler", False, batches=10, epochs=1, wait_fraction=0.6, img_s=100.0)
        >>> r = WatchReport("data-bound", 0.6, "finished", ["python", "t.py"], 1, "cpu", loaders=[main])
        >>> [f.kind for f in fixes(r, cores=2)]
        ['data-bound', 'too-few-workers']
    """
    main, cpu = r.loaders[0], r.cpu
    out = []
    if r.verdict == "data-bound":
        out.append(_data_bound(r))
    if r.verdict == "data-bound" and main.num_workers < cores:
        out.append(_workers(r, cores))
    machine = r.machine or {}
    if machine.get("busy"):
        out.append(
            Finding(
                "machine-busy",
                f"while the steps ran the machine's CPU was {machine['percent']:.0f}% busy over its "
                f"{machine['cores']:.0f} cores (load {machine['load']:.1f}; other processes than the script "
                f"{machine['others']:.0%} of the cores): every figure here is slower than on a quiet machine",
                "measure again when the machine is quiet, or give the script cores of its own",
                "unknown: the other processes' share changes from run to run",
            )
        )
    elif r.verdict != "data-bound" and cpu is not None and cpu["saturated"]:
        used = (cpu["main_percent"] + cpu["workers_percent"]) / 100
        out.append(
            Finding(
                "cpu-saturated",
                f"while the steps ran the main process used {cpu['main_percent']:.0f}% and the loader's workers "
                f"{cpu['workers_percent']:.0f}% of one core: {used:.1f} of the {cores} usable cores; the workers may "
                "slow the training step itself (not measured: see the note on CPU contention)",
                "take the per-sample work off the CPU (gf.accelerate(dataset, ...)), or give the loader fewer "
                "workers: gpufeed.tune_dataloader(dataset, batch_size, step_s=...)",
                "unknown: the step was not timed with the loader idle",
            )
        )
    if main.num_workers > cores:
        out.append(
            Finding(
                "too-many-workers",
                f"num_workers={main.num_workers} exceeds the {cores} usable cores: workers compete with each other "
                "and with the training loop",
                f"num_workers <= {cores}; measure with gpufeed.tune_dataloader(dataset, batch_size)",
                "less contention; memory per worker saved",
            )
        )
    return out


def worth(r: ReportData) -> str:
    """The one thing worth doing, with its predicted worth to the loop: the last line of every report.

    Example:
        >>> from gpufeed.watch.analyse import WatchReport
        >>> print(worth(WatchReport("compute-bound", 0.13, "finished", ["python", "t.py"], 1, "cpu")))
        the data side is worth at most 1.15x to this loop (it waits 13% of the time): the step itself is the cost
    """
    text = _worth(r)
    v = r.verify or {}
    if "error" not in v and v.get("after", {}).get("step_s") and v.get("before", {}).get("step_s"):
        b, a = v["before"]["step_s"], v["after"]["step_s"]
        text += f"; verified on this script: {b / a:.2f}x ({a * 1e3:.1f} ms a step against {b * 1e3:.1f} ms)"
    return text


def _worth(r: ReportData) -> str:
    fraction = r.data_wait_fraction or 0.0
    ceiling = f"at most {bound(fraction):.2f}x to this loop (it waits {fraction:.0%} of the time)"
    p = r.prediction
    if r.verdict != "data-bound":
        text = f"the data side is worth {ceiling}: the step itself is the cost"
        if p is not None and p["speedup"] >= 1.05:
            text += f"; {_name(p)} would still give about {p['speedup']:.2f}x (predicted)"
        return text
    if p is None:
        if r.change is not None and r.verify:
            return f"the code change to gf.accelerate above: a faster loader is worth {ceiling}"
        return f"a faster loader is worth {ceiling}; no fix was measured (see above)"
    if p["speedup"] < 1.05:
        predicted = f"{_name(p)} predicts {p['speedup']:.2f}x"
        return f"no fix measured here is worth doing: {predicted}; the data side is {ceiling}"
    one_time = ""
    if p.get("one_time_s"):
        one_time = f", after {p['one_time_s']:.1f} s once{_payback(p)}"
    return (
        f"{_name(p)}: predicted {p['speedup']:.2f}x the loop's speed ({p['new_step_s'] * 1e3:.1f} ms a step against "
        f"{p['step_s'] * 1e3:.1f} ms now){one_time}; the data side is {ceiling}"
    )


def _name(p: dict[str, Any]) -> str:
    return "the code change to gf.accelerate" if p["fix"] == "accelerate" else "the tuned DataLoader settings"


def _payback(p: dict[str, Any]) -> str:
    steps, epochs = p.get("payback_steps"), p.get("payback_epochs")
    if steps is None:
        return " (never repaid: the step is no faster)"
    if epochs is not None and p.get("steps_per_epoch"):
        return f" (repaid after {steps:,.0f} steps, {epochs:.2g} epochs)"
    return f" (repaid after {steps:,.0f} steps)"


def _data_bound(r: ReportData) -> Finding:
    main, side, p = r.loaders[0], r.side, r.prediction
    fraction = r.data_wait_fraction or 0.0
    waiting = f"the loop waits for {main.name}'s batches {fraction:.0%} of the time"
    ceiling = f"at most {bound(fraction):.2f}x to the loop if the data cost nothing"
    if side is None or "error" in side:
        why = "not made (--no-side, or the script did not end normally)" if side is None else f"failed: {side['error']}"
        return Finding(
            "data-bound",
            waiting,
            "gf.accelerate(dataset, batch_size=..., shuffle=...) where it accepts the pipeline, else "
            "DataLoader(dataset, **gpufeed.tune_dataloader(dataset, batch_size).kwargs)",
            f"{ceiling}; not measured: the side measurement was {why}",
        )
    where = _where(side)
    if "accelerate" in side:
        return Finding(
            "accelerate",
            f"{waiting}; gf.accelerate takes its dataset and transform (its plan below)",
            "the code change below"
            if r.code_change is not None
            else "loader = gf.accelerate(dataset, batch_size=..., shuffle=...) "
            "(the call cannot be rewritten as it is: see below)",
            _predicted(p, ceiling, where),
        )
    refused, tuned = side.get("refused", {}), side.get("tuned") or {}
    script = (side.get("script_loader") or {}).get("img_s")
    if p is not None and p["fix"] == "tuned":
        kwargs = ", ".join(f"{k}={v!r}" for k, v in tuned.get("kwargs", {}).items())
        return Finding(
            "tuned-dataloader",
            f"{waiting}; gf.accelerate cannot run this pipeline batched ({refused.get('error')}: "
            f"{refused.get('reason')})",
            f"DataLoader(dataset, batch_size={main.batch_size}, {kwargs})",
            f"{_predicted(p, ceiling, where)}; {_rate(tuned.get('img_s'))} with these settings against "
            f"{_rate(script)} with the script's",
        )
    return Finding(
        "data-bound",
        f"{waiting}; gf.accelerate cannot run this pipeline batched ({refused.get('error')}: {refused.get('reason')})",
        "make the transform cheaper, or one gf.accelerate can batch (gpufeed.augment's ops): no DataLoader setting "
        f"measured better than the script's own ({_rate(tuned.get('img_s'))} tuned against {_rate(script)})",
        f"{ceiling}; nothing measured reaches it",
    )


def _workers(r: ReportData, cores: int) -> Finding:
    """Too few workers for a data-bound loop: the gain from more, as measured by tune_dataloader on the side."""
    main, side = r.loaders[0], r.side or {}
    tuned, script = side.get("tuned") or {}, (side.get("script_loader") or {}).get("img_s")
    kwargs = tuned.get("kwargs") or {}
    message = f"the loop is data-bound with num_workers={main.num_workers} while {cores} cores are usable"
    if tuned.get("img_s") and script:
        better = tuned["img_s"] > script * 1.05 and kwargs.get("num_workers", 0) > main.num_workers
        gain = (
            f"the loader alone: {_rate(tuned['img_s'])} with num_workers={kwargs.get('num_workers')} against "
            f"{_rate(script)} with {main.num_workers}, measured on {_where(side)}"
        )
        if not better:
            return Finding(
                "too-few-workers",
                message,
                f"more workers measured no better here ({gain}): the workers would share the cores with the step",
                "none measured",
            )
        return Finding(
            "too-few-workers", message, f"DataLoader(..., {', '.join(f'{k}={v!r}' for k, v in kwargs.items())})", gain
        )
    return Finding(
        "too-few-workers",
        message,
        "more workers, chosen by measurement: gpufeed.tune_dataloader(dataset, batch_size).kwargs",
        "not measured (no side measurement of worker counts); the workers share the cores with the step",
    )


def _predicted(p: dict[str, Any] | None, ceiling: str, where: str) -> str:
    if p is None:
        return f"{ceiling}; not predicted"
    return (
        f"predicted {p['speedup']:.2f}x the loop ({p['new_step_s'] * 1e3:.1f} ms a step against "
        f"{p['step_s'] * 1e3:.1f} ms; {ceiling}), from {where}"
    )


def _where(side: dict[str, Any]) -> str:
    n, k = side.get("dataset_samples"), side.get("samples")
    of = f" of {n:,}" if n and n != k else ""
    return f"{k:,}{of} samples measured on {side.get('device')}"


def _rate(img_s: float | None) -> str:
    return "-" if img_s is None else f"{img_s:.0f} img/s"
