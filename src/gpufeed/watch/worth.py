"""The one thing worth doing, with its predicted worth to the loop: the last line of every report.

NOTE [ one verdict ]: each claim here is read from the one place that decides it, never re-derived, so the lines
of a report cannot contradict each other: which fix the side measurement found (the prediction's ``fix``, decided by
:func:`gpufeed.watch.predict.predict` and :func:`~gpufeed.watch.predict.tuned_better`), whether a code change
exists (the report's ``code_change``), whether the workers compete with the step (:mod:`.contention`), and what the
verification measured (its gain's range: :func:`.verify_text.gain_text`). "The step itself is the cost" is said
only when neither the workers' competition nor a verified gain beyond the data side's bound says otherwise; "the
code change" only when there is one.

Example:
    >>> from gpufeed.watch.analyse import WatchReport
    >>> print(worth(WatchReport("compute-bound", 0.13, "finished", ["python", "t.py"], 1, "cpu")))
    the data side is worth at most 1.15x to this loop (it waits 13% of the time): the step itself is the cost
"""

from __future__ import annotations

from typing import Any

from .contention import Contention, contention
from .predict import bound
from .spread import AGREE_FLOOR
from .summary import ReportData
from .verify_text import gain_text

__all__ = ["WORTH", "fix_name", "offers_change", "suggest_verify", "verified_beyond", "worth"]

WORTH = 1.05  # a predicted gain under this is not worth a change


def worth(r: ReportData) -> str:
    """The last line of the report: the fix worth doing and its predicted gain, or why none is; the verified gain
    with its range after it."""
    text = _worth(r)
    verified = gain_text(r.verify or {})
    if verified is not None:
        text += f"; verified on this script: {verified}"
    return text


def fix_name(r: ReportData) -> str:
    """The fix the prediction is for, named as the report offers it: "the code change to gf.accelerate" only where
    a change was written, else gf.accelerate with why no change was written."""
    p = r.prediction or {}
    if p.get("fix") == "tuned":
        return "the tuned DataLoader settings"
    if r.code_change is not None:
        return "the code change to gf.accelerate"
    why = r.no_change_reason or "the call that built the loader could not be rewritten"
    return f"serving the loop from gf.accelerate (no code change was written: {why})"


def suggest_verify(r: ReportData) -> bool:
    """Whether the report ends by suggesting ``--verify``: a change exists, it was not verified, and it is worth
    checking (a data-bound loop the change is predicted to speed up, or workers that compete with the step)."""
    if r.change is None or r.verify is not None or r.diagnosis is None:
        return False
    if _contention(r) is not None:
        return True
    p = r.prediction
    return r.verdict == "data-bound" and (p is None or p["speedup"] >= WORTH)


def offers_change(r: ReportData) -> bool:
    """Whether the report shows its code change: in a data-bound loop, where the loader's workers compete with the
    step (the change to gf.accelerate takes them away), where the change is predicted worth doing (the last line
    names it) and where ``--verify`` ran it."""
    if r.code_change is None:
        return False
    p = r.prediction
    worth_it = p is not None and p["speedup"] >= WORTH
    return r.verdict == "data-bound" or _contention(r) is not None or worth_it or r.verify is not None


def verified_beyond(r: ReportData) -> float | None:
    """The verified gain's low end when it is beyond what the data side alone can give (the bound, widened by
    :data:`~gpufeed.watch.spread.AGREE_FLOOR`): the change moved more than the data. None otherwise."""
    measured = _measured(r)
    ceiling = bound(r.data_wait_fraction or 0.0)
    return measured[0] if measured is not None and measured[0] > ceiling * (1 + AGREE_FLOOR) else None


def _measured(r: ReportData) -> tuple[float, float] | None:
    """The verified gain's range over its pairs (one pair: its gain at both ends); None without one."""
    spread = (r.verify or {}).get("spread") if "error" not in (r.verify or {}) else None
    if not spread:
        return None
    gain = spread["gain"]
    if gain.get("pairs", 0) > 1 and gain.get("low") is not None:
        return gain["low"], gain["high"]
    return gain["median"], gain["median"]


def _contention(r: ReportData) -> Contention | None:
    main = r.main
    return contention(r.cpu, main.num_workers, r.device) if main is not None else None


def _worth(r: ReportData) -> str:
    fraction = r.data_wait_fraction or 0.0
    ceiling = f"at most {bound(fraction):.2f}x to this loop (it waits {fraction:.0%} of the time)"
    p = r.prediction
    c = _contention(r)
    if r.verdict != "data-bound":
        if c is not None:
            return _competing(r, c, p, ceiling)
        beyond = verified_beyond(r)
        if beyond is not None:
            return (
                f"the data side alone is worth {ceiling}, yet the change measured at least {beyond:.2f}x on this "
                "script: it moved more than the data (the loader's work off the cores the step uses)"
            )
        text = f"the data side is worth {ceiling}: the step itself is the cost"
        measured = _measured(r)
        if p is not None and p["speedup"] >= WORTH and measured is not None and measured[1] < WORTH:
            text += f"; {_measured_less(r, p, measured)}"
        elif p is not None and p["speedup"] >= WORTH:
            text += f"; {fix_name(r)} would still give about {p['speedup']:.2f}x (predicted)"
        return text
    if p is None:
        if r.change is not None and r.verify:
            return f"the code change to gf.accelerate above: a faster loader is worth {ceiling}"
        if r.side is not None and "refused" in r.side and "error" not in r.side:
            return (
                f"a faster loader is worth {ceiling}; no fix measured better here: gf.accelerate refused the "
                "pipeline and no DataLoader setting beat the script's own (see above)"
            )
        return f"a faster loader is worth {ceiling}; no fix was measured (see above)"
    measured = _measured(r)  # NOTE [ one verdict ]: where the change was run, what it measured decides
    if max(p["speedup"], p.get("free_speedup") or 0.0) < WORTH:
        if measured is not None and measured[0] >= WORTH:
            return (
                f"{fix_name(r)}: predicted {p['speedup']:.2f}x, yet measured at least {measured[0]:.2f}x on this "
                f"script (the verification above); the data side is {ceiling}"
            )
        predicted = f"{fix_name(r)} predicts {p['speedup']:.2f}x"
        return f"no fix measured here is worth doing: {predicted}; the data side is {ceiling}"
    if measured is not None and measured[1] < WORTH:
        return f"nothing here: {_measured_less(r, p, measured)}; the data side is {ceiling}"
    one_time = f", after {p['one_time_s']:.1f} s once{_payback(p)}" if p.get("one_time_s") else ""
    upper = _upper(p, c)
    return (
        f"{fix_name(r)}: predicted {p['speedup']:.2f}x{upper} the loop's speed ({p['new_step_s'] * 1e3:.1f} ms a step "
        f"against {p['step_s'] * 1e3:.1f} ms now){one_time}; the data side is {ceiling}"
    )


def _measured_less(r: ReportData, p: dict[str, Any], measured: tuple[float, float]) -> str:
    return (
        f"{fix_name(r)} predicted {p['speedup']:.2f}x, yet measured at most {measured[1]:.2f}x on this script (the "
        "verification above)"
    )


def _competing(r: ReportData, c: Contention, p: dict[str, Any] | None, ceiling: str) -> str:
    """A loop that barely waits, whose loader's workers take cores its step could use."""
    head = (
        f"the loader's {c.workers} workers compete with the step for the {c.cores:.0f} cores (they used "
        f"{c.workers_cores:.1f} and the main process {c.main_cores:.1f} while the steps ran)"
    )
    if p is not None and p.get("free_speedup") is not None and p["fix"] == "accelerate":
        return (
            f"{head}: {fix_name(r)}, which has no workers, predicted {p['speedup']:.2f}x{_upper(p, c)} the loop's "
            f"speed; the data side alone is worth {ceiling}"
        )
    rest = (r.step_s or 0.0) - (r.wait_s or 0.0)
    return (
        f"{head}: without them the rest of the step may take down to {c.rest_factor:.0%} of its "
        f"{rest * 1e3:.1f} ms (predicted from the CPU shares, not measured); gf.accelerate serves the batches without "
        f"workers, or fewer workers: gpufeed.tune_dataloader(dataset, batch_size, step_s=...); the data side alone "
        f"is worth {ceiling}"
    )


def _upper(p: dict[str, Any], c: Contention | None) -> str:
    if c is None or p.get("free_speedup") is None or p["free_speedup"] <= p["speedup"] * (1 + AGREE_FLOOR / 2):
        return ""
    return f" to {p['free_speedup']:.2f}x (the workers' cores given back to the step)"


def _payback(p: dict[str, Any]) -> str:
    steps, epochs = p.get("payback_steps"), p.get("payback_epochs")
    if steps is None:
        return " (never repaid: the step is no faster)"
    if epochs is not None and p.get("steps_per_epoch"):
        return f" (repaid after {steps:,.0f} steps, {epochs:.2g} epochs)"
    return f" (repaid after {steps:,.0f} steps)"
