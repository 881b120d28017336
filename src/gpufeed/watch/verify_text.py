"""The verification of ``gpufeed diagnose --verify`` as a person reads it: before, after and predicted side by side,
and whether they agree. Plain text of the verification's dict: it imports nothing of the report's modules."""

from __future__ import annotations

from typing import Any

__all__ = ["AGREE", "verify_text"]

AGREE = 0.25  # a verified speed-up this close to the prediction (relative) confirms it


def verify_text(v: dict[str, Any]) -> list[str]:
    """The verification as a person reads it: before, after and predicted side by side, and whether they agree.

    Example:
        >>> run = {"step_s": 0.02, "rest_s": 0.005, "wait_fraction": 0.75, "img_s": 800.0, "first_batch_s": 3.0,
        ...        "batches": 40, "loader": "DataLoader at train.py:9"}
        >>> after = {**run, "step_s": 0.01, "rest_s": 0.005, "wait_fraction": 0.5, "img_s": 1600.0,
        ...          "first_batch_s": 3.5, "loader": "DeviceLoader at train.py:12"}
        >>> p = {"new_step_s": 0.011, "speedup": 1.82, "rest_s": 0.005, "one_time_s": 0.6, "bound": 4.0}
        >>> lines = verify_text({"status": 0, "before": run, "after": after, "after_exit": "finished",
        ...                      "predicted": p})
        >>> print(lines[5]); print(lines[-1])
          speed-up                             2.00x       1.82x
          agrees with the prediction: 2.00x verified against 1.82x predicted (within 25%)
    """
    if "error" in v:
        return [f"verified: not run: {v['error']}"]
    b, a, p = v["before"], v["after"], v.get("predicted") or {}
    if a["step_s"] is None or b["step_s"] is None:
        return [f"verified: the changed script ran ({a['batches']} batches, {v['after_exit']}): too few to compare"]
    measured = b["step_s"] / a["step_s"]
    later = (a["first_batch_s"] or 0.0) - (b["first_batch_s"] or 0.0)  # the changed run's first batch, start-up in
    once = a.get("one_time_s")

    def row(name: str, before: str, after: str, predicted: str = "") -> str:
        return f"  {name:<18}{before:>12}{after:>12}{predicted:>12}"

    def ms(x: float | None) -> str:
        return f"{x * 1e3:.2f} ms" if x is not None else "-"

    lines = [
        f"verified on this script (exit status {v['status']}; the change ran from a copy, your files unchanged):",
        row("", "before", "after", "predicted"),
        row("step", ms(b["step_s"]), ms(a["step_s"]), ms(p["new_step_s"]) if p else ""),
        row("rest of the step", ms(b.get("rest_s")), ms(a.get("rest_s")), ms(p["rest_s"]) if p else ""),
        row("waiting", f"{b['wait_fraction']:.0%}", f"{a['wait_fraction']:.0%}"),
        row("speed-up", "", f"{measured:.2f}x", f"{p['speedup']:.2f}x" if p else ""),
        row("samples/s", f"{b['img_s']:.0f}" if b["img_s"] else "-", f"{a['img_s']:.0f}" if a["img_s"] else "-"),
        row("first batch at", f"{b['first_batch_s']:.1f} s", f"{a['first_batch_s']:.1f} s"),
        row(
            "one-time cost",
            "",
            f"{once:.1f} s" if once is not None else f"{later:+.1f} s",
            f"{p['one_time_s']:.1f} s" if p.get("one_time_s") is not None else "",
        ),
    ]
    if once is not None:
        parts = a.get("one_time") or {}
        lines.append(
            f"  (one-time: importing gf.accelerate {parts.get('import_s', 0.0):.1f} s and its call, reading the data "
            f"in, {parts.get('accelerate_s', 0.0):.1f} s, timed in the changed run; its first batch came "
            f"{abs(later):.1f} s {'later' if later >= 0 else 'sooner'}, start-up included)"
        )
    lines.append(f"  the loop's loader after: {a['loader']}; {a['batches']} batches measured")
    if v.get("cache_bytes"):
        from ..device import fmt_bytes

        lines.append(f"  the changed run wrote {fmt_bytes(v['cache_bytes'])} of cache (in the scratch folder, removed)")
    lines += _agreement(measured, b, a, p)
    if once is not None and p.get("one_time_s"):
        off = once / p["one_time_s"] - 1
        within = f"within {AGREE:.0%}" if abs(off) <= AGREE else f"{off:+.0%}"
        lines.append(f"  one-time cost: {once:.1f} s verified against {p['one_time_s']:.1f} s predicted ({within})")
    return lines


def _agreement(measured: float, b: dict[str, Any], a: dict[str, Any], p: dict[str, Any]) -> list[str]:
    """Whether the verified speed-up confirms the prediction; where not, what moved that the prediction held
    fixed (the rest of the step)."""
    if not p:
        return ["  (no prediction to compare with: the side measurement was not made, or measured no fix)"]
    off = measured / p["speedup"] - 1
    if abs(off) <= AGREE:
        return [
            f"  agrees with the prediction: {measured:.2f}x verified against {p['speedup']:.2f}x predicted (within "
            f"{AGREE:.0%})"
        ]
    line = f"  differs from the prediction by {off:+.0%}: {measured:.2f}x verified against {p['speedup']:.2f}x"
    rest_b, rest_a = b.get("rest_s"), a.get("rest_s")
    if rest_b and rest_a and abs(rest_a / rest_b - 1) > 0.1:
        line += (
            f"; the rest of the step went from {rest_b * 1e3:.2f} to {rest_a * 1e3:.2f} ms, which the prediction "
            "holds fixed"
        )
        if rest_a < rest_b:
            line += " (fewer processes compete with it for the cores: the script's loader workers, if it had any)"
    if measured > p.get("bound", float("inf")):
        line += f"; above the {p['bound']:.2f}x a data-side fix gives with the rest unchanged"
    return [line]
