"""The verification of ``gpufeed diagnose --verify`` as a person reads it: each run, both sides' medians and ranges
beside the prediction, the gain with its range, whether the prediction agrees (judged on the time per step) and
whether the machine was busy. Plain text of the verification's dict: it imports nothing of the report's modules.
"""

from __future__ import annotations

from typing import Any

from .spread import AGREE_FLOOR, ORIGINAL

__all__ = ["AGREE", "gain_text", "verify_text"]

AGREE = 0.25  # a verified one-time cost this close to the prediction (relative) confirms it


def verify_text(v: dict[str, Any]) -> list[str]:
    """The verification as a person reads it.

    Example:
        >>> run = {"step_s": 0.02, "rest_s": 0.005, "wait_fraction": 0.75, "img_s": 800.0, "first_batch_s": 3.0,
        ...        "batches": 40, "loader": "DataLoader at train.py:9"}
        >>> after = {**run, "step_s": 0.01, "wait_fraction": 0.5, "img_s": 1600.0, "loader": "DeviceLoader at t.py:9"}
        >>> runs = [{"run": 1, "side": "original", **run}, {"run": 2, "side": "changed", **after}]
        >>> spread = {"original": {"median": 0.02, "low": 0.02, "high": 0.02, "n": 1, "known": False},
        ...           "changed": {"median": 0.01, "low": 0.01, "high": 0.01, "n": 1, "known": False},
        ...           "gain": {"median": 2.0, "low": 2.0, "high": 2.0, "pairs": 1}}
        >>> agreement = {"verdict": "agrees", "predicted_s": 0.011, "tolerance": 0.25, "low_s": 0.0075,
        ...              "high_s": 0.0125, "spread_known": False}
        >>> lines = verify_text({"status": 0, "before": run, "after": after, "after_exit": "finished", "runs": runs,
        ...     "predicted": {"new_step_s": 0.011, "speedup": 1.82, "rest_s": 0.005}, "spread": spread,
        ...     "agreement": agreement, "busy": [], "planned": 2, "budget_s": 600.0, "stopped": None})
        >>> print(lines[-3][:55])
          agrees with the prediction: 11.00 ms a step predicted
        >>> lines[-3].endswith("within the changed run's 10.00 ms widened by 25% (one pair: the spread is unknown)")
        True
        >>> print(lines[-1])
          one pair was run (--verify-runs 2): the spread is unknown; two pairs or more (--verify-runs 4) measure it
    """
    if "error" in v:
        done = "not completed" if v.get("runs") else "not run"  # runs made before the one that failed are listed
        done = "the change did not take effect" if v.get("ineffective") else done
        return [f"verified: {done}: {v['error']}", *_runs(v.get("runs") or [])]
    b, a, p = v["before"], v["after"], v.get("predicted") or {}
    runs = v.get("runs") or []
    if a["step_s"] is None or b["step_s"] is None:
        return [
            f"verified: the changed script ran ({a['batches']} batches, {v['after_exit']}): too few to compare",
            *_runs(runs),
        ]
    lines = [_heading(v), *_runs(runs)]

    def row(name: str, before: str, after: str, predicted: str = "") -> str:
        return f"  {name:<18}{before:>19}{after:>19}{predicted:>12}".rstrip()

    spread = v.get("spread") or {}
    lines += [
        row("", "original", "changed", "predicted"),
        row("step (median)", _ms(b["step_s"]), _ms(a["step_s"]), _ms(p.get("new_step_s"))),
        row("range", _range(spread.get(ORIGINAL)), _range(spread.get("changed"))),
        row("rest of the step", _ms(b.get("rest_s")), _ms(a.get("rest_s")), _ms(p.get("rest_s"))),
        row("waiting", _pct(b.get("wait_fraction")), _pct(a.get("wait_fraction"))),
        row("samples/s", _rate(b.get("img_s")), _rate(a.get("img_s"))),
        row("first batch at", _s(b.get("first_batch_s")), _s(a.get("first_batch_s"))),
    ]
    once = a.get("one_time_s")
    later = (a.get("first_batch_s") or 0.0) - (b.get("first_batch_s") or 0.0)
    predicted_once = p.get("one_time_s")
    lines.append(
        row(
            "one-time cost",
            "",
            _s(once) if once is not None else f"{later:+.1f} s",
            _s(predicted_once) if predicted_once is not None else "",
        )  # fmt: skip
    )
    lines.append(row("gain", "", f"{spread['gain']['median']:.2f}x" if spread else "-", _x(p.get("speedup"))))
    if once is not None:
        parts = a.get("one_time") or {}
        lines.append(
            f"  (one-time: importing gf.accelerate {parts.get('import_s', 0.0):.1f} s and its call, reading the data "
            f"in, {parts.get('accelerate_s', 0.0):.1f} s, timed in the changed run; its first batch came "
            f"{abs(later):.1f} s {'later' if later >= 0 else 'sooner'}, start-up included)"
        )
    lines.append(f"  the loop's loader after: {a['loader']}; {a['batches']} batches a run")
    if v.get("cache_bytes"):
        from ..device import fmt_bytes

        lines.append(
            f"  each changed run wrote {fmt_bytes(v['cache_bytes'])} of cache (in the scratch folder, removed)"
        )
    lines += _gain(spread) + _agreement(v, p) + _machine(v, spread) + _budget(v, spread)
    if once is not None and predicted_once:
        off = once / predicted_once - 1
        within = f"within {AGREE:.0%}" if abs(off) <= AGREE else f"{off:+.0%}"
        lines.append(f"  one-time cost: {once:.1f} s verified against {predicted_once:.1f} s predicted ({within})")
    return lines


def gain_text(v: dict[str, Any]) -> str | None:
    """The verified gain in one phrase (the worth line's): the medians' ratio, the pairs' range and the times per
    step; None without a measured gain.

    Example:
        >>> gain_text({"before": {"step_s": 0.03}, "after": {"step_s": 0.02}, "spread": {"gain": {"median": 1.5,
        ...     "low": 1.4, "high": 1.6, "pairs": 2}}})
        '1.50x (1.40x to 1.60x over 2 pairs; 20.0 ms a step against 30.0 ms)'
    """
    spread = v.get("spread") if "error" not in v else None
    if not spread:
        return None
    g, b, a = spread["gain"], v["before"]["step_s"], v["after"]["step_s"]
    span = f"{g['low']:.2f}x to {g['high']:.2f}x over {g['pairs']} pairs" if g["pairs"] > 1 else "one pair: no spread"
    return f"{g['median']:.2f}x ({span}; {a * 1e3:.1f} ms a step against {b * 1e3:.1f} ms)"


def _heading(v: dict[str, Any]) -> str:
    runs = v.get("runs") or []
    if v.get("before_from") == "the diagnosis run":
        how = "the changed copy once against the diagnosis run (--verify-runs 1)"
    else:
        sides = " ".join("A" if r["side"] == ORIGINAL else "B" for r in runs)
        how = f"{len(runs)} runs, the original (A) and the changed copy (B) interleaved: {sides}"
    batches = v["after"]["batches"]
    return (
        f"verified on this script (exit status {v['status']}): {how}; {batches} batches a run, each timed after its "
        "warm-up (the first tenth, at least one); the change ran from a copy, your files unchanged:"
    )


def _runs(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return []
    lines = [f"  {'run':>3}  {'script':<9}{'step':>10}{'rest':>10}{'waiting':>9}{'exit':>12}  the machine while it ran"]
    for r in runs:
        lines.append(
            f"  {r['run']:>3}  {r['side']:<9}{_ms(r.get('step_s')):>10}{_ms(r.get('rest_s')):>10}"
            f"{_pct(r.get('wait_fraction')):>9}{_exit(r):>12}  {_load(r.get('machine'))}"
        )
    return lines


def _gain(spread: dict[str, Any]) -> list[str]:
    if not spread:
        return []
    g, a, b = spread["gain"], spread[ORIGINAL], spread["changed"]
    if g["pairs"] > 1:
        span = f"{g['low']:.2f}x to {g['high']:.2f}x over {g['pairs']} pairs"
    else:
        span = "one pair: the spread is unknown"
    return [
        f"  measured gain: {g['median']:.2f}x ({span}); the runs' spread: original {a['relative']:.0%}, changed "
        f"{b['relative']:.0%} of their medians"
        if a.get("known") and b.get("known")
        else f"  measured gain: {g['median']:.2f}x ({span})"
    ]


def _agreement(v: dict[str, Any], p: dict[str, Any]) -> list[str]:
    """Whether the predicted time per step lies within the changed runs' range (NOTE [ agreeing ] in
    :mod:`.spread`); where not, what moved that the prediction held fixed (the rest of the step)."""
    if not p:
        return ["  (no prediction to compare with: the side measurement was not made, or measured no fix)"]
    agreement = v.get("agreement")
    if not agreement:
        return []
    c = v["spread"]["changed"]
    runs = (
        f"the changed runs' {_ms(c['low'])} to {_ms(c['high'])}" if c["n"] > 1 else f"the changed run's {_ms(c['low'])}"
    )
    if agreement["spread_known"]:
        why = f"the tolerance: the runs' spread, at least {AGREE_FLOOR:.0%}"
    else:
        why = "one pair: the spread is unknown"
    widened = f"{runs} widened by {agreement['tolerance']:.0%} ({why})"
    predicted = f"{_ms(agreement['predicted_s'])} a step predicted"
    if agreement["verdict"] == "agrees":
        return [f"  agrees with the prediction: {predicted}, within {widened}"]
    if agreement["verdict"] == "inconclusive":
        return [
            f"  inconclusive: {predicted} lies within {widened}, but so does the original's "
            f"{_ms(v['before']['step_s'])}: the runs spread too much to tell the change from none"
        ]
    line = f"  disagrees with the prediction: {predicted}, outside {widened}"
    rest_b, rest_a = v["before"].get("rest_s"), v["after"].get("rest_s")
    if rest_b and rest_a and abs(rest_a / rest_b - 1) > AGREE_FLOOR:
        line += f"; the rest of the step went from {_ms(rest_b)} to {_ms(rest_a)}, which the prediction holds fixed"
        workers = v["before"].get("workers")
        if rest_a < rest_b and workers:  # with none, nothing said here knows what moved
            line += f" (the script's {workers} loader workers no longer compete with it)"
    if p.get("bound") and v["spread"]["gain"]["median"] > p["bound"]:
        line += f"; above the {p['bound']:.2f}x a data-side fix gives with the rest unchanged"
    return [line]


def _machine(v: dict[str, Any], spread: dict[str, Any]) -> list[str]:
    """Which runs the machine was busy in (other processes' share of its cores), and what it did to the spread."""
    busy, runs = v.get("busy") or [], {r["run"]: r for r in v.get("runs") or []}
    if not busy:
        sampled = [r for r in runs.values() if r.get("machine")]
        if not sampled:
            return ["  (the machine's load was not sampled: each run's steps took under the sampler's 0.5 s)"]
        return [f"  the machine was quiet: other processes used under a quarter of its cores in every run sampled "
                f"({len(sampled)} of {len(runs)})"]  # fmt: skip
    machines = [runs[n]["machine"] for n in busy if n in runs]
    cores = machines[0]["cores"]
    used = max(m["others"] * m["cores"] for m in machines)
    load = max(m["load"] for m in machines)
    wide = max(spread[ORIGINAL]["relative"], spread["changed"]["relative"]) if spread else 0.0
    effect = f"the spread is wide ({wide:.0%})" if wide > AGREE_FLOOR else f"the spread stayed within {AGREE_FLOOR:.0%}"
    return [
        f"  the machine was busy: other processes used up to {used:.1f} of {cores:.0f} cores during "
        f"{_numbers(busy, len(runs))} (load up to {load:.1f}); {effect}"
    ]


def _budget(v: dict[str, Any], spread: dict[str, Any]) -> list[str]:
    runs, planned = len(v.get("runs") or []), v.get("planned", 0)
    lines = []
    if v.get("interrupted"):
        lines.append(f"  interrupted (Ctrl-C) during {v['interrupted']}: {runs} of {planned} runs measured")
    elif v.get("stopped") == "budget":
        lines.append(
            f"  {runs} of {planned} runs fit in the {v['budget_s']:g} s budget (--verify-seconds): the next pair "
            "would have gone over"
        )
    if v.get("before_from") == "the diagnosis run":
        return lines
    known = spread and spread[ORIGINAL].get("known") and spread["changed"].get("known")
    if not known:
        why = "the budget fit one pair" if v.get("stopped") == "budget" else f"{runs} run(s) were made"
        if planned == 2 and not v.get("stopped") and not v.get("interrupted"):
            why = "one pair was run (--verify-runs 2)"
        lines.append(f"  {why}: the spread is unknown; two pairs or more (--verify-runs 4) measure it")
    return lines


def _numbers(runs: list[int], of: int = 0) -> str:
    """``[2, 3]`` as "runs 2 and 3"; every one of ``of`` runs as "every run"."""
    if len(runs) == of > 1:
        return "every run"
    if len(runs) == 1:
        return f"run {runs[0]}"
    return f"runs {', '.join(map(str, runs[:-1]))} and {runs[-1]}"


def _exit(r: dict[str, Any]) -> str:
    return str(r.get("exit") or f"status {r.get('status')}").split(":")[0]


def _load(m: dict[str, float] | None) -> str:
    if not m:
        return "not sampled"
    return f"others {m['others'] * m['cores']:.1f} of {m['cores']:.0f} cores, load {m['load']:.1f}"


def _ms(x: float | None) -> str:
    return f"{x * 1e3:.2f} ms" if x is not None else "-"


def _range(s: dict[str, Any] | None) -> str:
    if not s or s["n"] < 2:
        return "-"
    return f"{s['low'] * 1e3:.2f}-{s['high'] * 1e3:.2f} ms"


def _pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "-"


def _rate(x: float | None) -> str:
    return f"{x:.0f}" if x else "-"


def _s(x: float | None) -> str:
    return f"{x:.1f} s" if x is not None else "-"


def _x(x: float | None) -> str:
    return f"{x:.2f}x" if x is not None else ""
