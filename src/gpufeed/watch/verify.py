"""``gpufeed diagnose --verify -- CMD``: the suggested change, applied to a copy of the script and run, measured
against the original, run for run.

The user's files are never written. The file that builds the loader is copied, changed (:func:`file_change`), into
a scratch folder that mirrors the script's folder: every other entry there is a link to the user's own (so the
script's sibling modules import, and paths found from ``__file__`` lead to the same data), and the folders on the
way to the changed file are real folders holding links. The original command and the command with the copy in the
script's place then run interleaved, A B B A A B (NOTE [ interleaving ] in :mod:`.spread`), each for the same steps
under the same hook, without the side measurement, with gpufeed's cache in the scratch folder (one per run: each
changed run reads the data in as a first run does; its size is measured, then it goes) and no bytecode written.
Each run's time per step is taken after a warm-up (its first tenth of batches); the machine's load while its steps
ran comes from its record. Each side gives a median and a range, the pairs give the gain's range, and the
prediction is judged on the time per step (NOTE [ agreeing ]). The time to the first batch's difference is the
fix's one-time cost (importing gpufeed, reading the data in), timed inside the changed runs.

Example:
    >>> script_of(["python", "-u", __file__, "--lr", "0.1"]) == Path(__file__).resolve()
    True
    >>> script_of(["python", "-m", "pkg.train"]) is None
    True
"""

from __future__ import annotations

import os
import shlex
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .diff import file_change
from .spread import CHANGED, ORIGINAL, VERIFY_RUNS, VERIFY_S, Spread, pair_fits
from .verify_text import verify_text

if TYPE_CHECKING:
    from .analyse import WatchReport
    from .record import ProcessRecord
    from .summary import LoaderSummary

__all__ = ["VERIFY_RUNS", "VERIFY_S", "diff_name", "prepare", "script_of", "summarise", "verify", "verify_text"]

WARM_UP = 10  # each run's first tenth of batches (at least one) is left out of its time per step


def script_of(cmd: list[str]) -> Path | None:
    """The Python file the command runs (``python [opts] FILE``, ``torchrun [opts] FILE``, ``./FILE``), resolved;
    None for ``python -m module`` or when no argument is an existing ``.py`` file."""
    for token in cmd:
        if token in ("-m", "--module", "-c"):
            return None
        if token.endswith(".py") and not token.startswith("-") and os.path.isfile(token):
            return Path(token).resolve()
    return None


def diff_name(file: str) -> tuple[Path, str]:
    """``(root, name)``: the folder ``patch -p1`` runs in and the changed file's name in the diff, relative to it
    (a diff names its files ``a/NAME``, ``b/NAME``): the current directory when the file is inside it, else the
    file's own folder (an absolute name would give ``a//abs/path``, which applies from nowhere)."""
    path = Path(file).resolve()
    cwd = Path.cwd().resolve()
    if path.is_relative_to(cwd):
        return cwd, str(path.relative_to(cwd))
    return path.parent, path.name


def _apply_command(root: Path, diff: Path) -> str:
    """The shell command that applies ``diff`` to the user's files from any directory: ``cd ROOT && patch -p1 <
    DIFF``, both absolute and quoted for the shell."""
    return f"cd {shlex.quote(str(root))} && patch -p1 < {shlex.quote(str(diff.resolve()))}"


def prepare(report: WatchReport, out: Path) -> tuple[str, str] | None:
    """``(changed text, diff)`` of the report's change, the diff written to ``out/fix.diff`` and named in the
    report; None when the report has no change or its file cannot be read as it was (the script changed since)."""
    from .analyse import change_of

    change, c = change_of(report), report.change
    if change is None or c is None or not c.get("file") or not c.get("line"):
        return None
    try:
        text = Path(c["file"]).read_text()
        root, name = diff_name(c["file"])
        new, diff = file_change(text, c["line"], change, name)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as e:
        report.notes.append(f"the code change could not be applied to {c['file']}: {type(e).__name__}: {e}")
        return None
    out.mkdir(parents=True, exist_ok=True)
    (out / "fix.diff").write_text(diff)
    c["diff"] = str(out / "fix.diff")
    c["apply"] = _apply_command(root, out / "fix.diff")
    return new, diff


def verify(
    cmd: list[str],
    before: WatchReport,
    changed: str,
    steps: int,
    seconds: float | None,
    runs: int = VERIFY_RUNS,
    budget_s: float | None = VERIFY_S,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run the original ``cmd`` and a copy with the change applied, interleaved (A B B A A B for 6 ``runs``: see
    NOTE [ interleaving ] in :mod:`.spread`), each for the same ``steps``, while the next pair fits in
    ``budget_s`` (the first pair always runs); ``runs=1``: the changed copy once, against ``before``'s run. Returns
    each run's figures, each side's medians and spread, the gain with its range and the prediction's agreement (a
    dict, JSON-ready; ``error`` when it could not run). Each run's raw records go to ``out/records-verify/``.

    A Ctrl-C stops the runs (the one under way ends first, as without gpufeed) and returns what was measured, with
    ``interrupted`` saying which run it stopped.
    """
    from .spread import order

    file = Path(before.change["file"]).resolve() if before.change else None
    script = script_of(cmd)
    root = script.parent if script is not None else Path.cwd().resolve()
    if file is None or not file.is_relative_to(root):
        return {"error": f"the loader is built in {file}, outside the script's folder {root}: change it there by hand"}
    sides = order(runs) if runs > 1 else [CHANGED]
    done: list[dict[str, Any]] = []
    stopped: str | None = None
    interrupted: str | None = None
    scratch = Path(tempfile.mkdtemp(prefix="gpufeed-verify-"))
    try:
        mirror = scratch / "script"
        _mirror(root, mirror, file.relative_to(root), changed)
        commands = {ORIGINAL: (list(cmd), None), CHANGED: _changed_command(cmd, script, root, mirror)}
        print(
            f"gpufeed diagnose --verify: {len(sides)} run(s), the original and a copy with the change ({mirror}) "
            f"interleaved: {' '.join('A' if s == ORIGINAL else 'B' for s in sides)}",
            flush=True,
        )
        t0 = time.monotonic()
        for number, side in enumerate(sides, 1):
            spent = [(r["side"], r["seconds"]) for r in done]
            if number > 2 and number % 2 == 1 and not pair_fits(time.monotonic() - t0, spent, budget_s):
                stopped = "budget"
                break
            what = "the original script" if side == ORIGINAL else "the changed copy"
            print(f"gpufeed diagnose --verify: run {number} of {len(sides)}: {what}", flush=True)
            try:
                done.append(_run(commands[side], side, number, scratch, steps, seconds, out, mirror))
            except KeyboardInterrupt:
                interrupted = f"run {number} of {len(sides)} ({what})"
                break
            if "error" in done[-1]:
                stopped = "error"
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = summarise(done, before if runs == 1 else None, before.prediction)
    result.update(
        command=commands[CHANGED][0], planned=len(sides), budget_s=budget_s, stopped=stopped, interrupted=interrupted
    )
    return result


def summarise(
    runs: list[dict[str, Any]], diagnosis: WatchReport | None, predicted: dict[str, Any] | None
) -> dict[str, Any]:
    """The verification from its runs' figures (:func:`_run`'s): each side's medians (``before``, ``after``) and
    spread, the gain (the medians' ratio) with the range of the pairs' gains, the prediction's agreement (judged on
    the time per step: :func:`.spread.judge`) and the runs the machine was busy in; an error where a run failed, or
    where a changed run built no loader of gf.accelerate (``ineffective``: the change did not reach the loop).
    ``diagnosis``: the original's figures come from the diagnosis run (``--verify-runs 1``)."""
    from .spread import busy_runs, judge, pair_gains

    failed = next((r for r in runs if "error" in r), None)
    if failed is not None:
        return {"error": f"run {failed['run']} ({failed['side']}): {failed['error']}", "status": failed["status"],
                "runs": runs}  # fmt: skip
    if not runs:
        return {"error": "no run was made (interrupted before the first)", "runs": runs}
    unfixed = next((r for r in runs if r["side"] == CHANGED and not r["fixed"]), None)
    if unfixed is not None:  # e.g. a line that changed another object than the one the loop reads from
        return {
            "error": f"run {unfixed['run']} (changed) read {unfixed['loader']}, no loader of gf.accelerate: the "
            "change did not reach the loop, so the runs compare the script's loader with itself",
            "status": unfixed["status"], "runs": runs, "ineffective": True,
        }  # fmt: skip
    original = [r for r in runs if r["side"] == ORIGINAL]
    changed = [r for r in runs if r["side"] == CHANGED]
    before = _figures(diagnosis) if diagnosis is not None else _medians(original)
    after = _medians(changed)
    out: dict[str, Any] = {
        "status": next((r["status"] for r in changed if r["status"]), 0),
        "before": before,
        "after": after,
        "after_exit": _worst([r["exit"] for r in changed]) if changed else None,
        "predicted": predicted,
        "cache_bytes": max((r.get("cache_bytes", 0) for r in changed), default=0),
        "runs": runs,
        "before_from": "the diagnosis run" if diagnosis is not None else "the original runs",
        "busy": busy_runs([r.get("machine") for r in runs]),
        "spread": None,
        "agreement": None,
    }
    a = [r["step_s"] for r in original if r.get("step_s")] or ([before["step_s"]] if before.get("step_s") else [])
    b = [r["step_s"] for r in changed if r.get("step_s")]
    if not a or not b:
        return out
    sa, sb = Spread(tuple(a)), Spread(tuple(b))
    gains = pair_gains([(r["side"], r.get("step_s")) for r in runs]) if diagnosis is None else [sa.median / sb.median]
    out["spread"] = {
        ORIGINAL: _spread(sa),
        CHANGED: _spread(sb),
        "gain": {
            "median": sa.median / sb.median,
            "low": min(gains, default=None),
            "high": max(gains, default=None),
            "pairs": len(gains),
        },  # fmt: skip
    }
    if predicted and predicted.get("new_step_s"):
        out["agreement"] = judge(predicted["new_step_s"], sa, sb).to_dict()
    return out


def _spread(s: Spread) -> dict[str, Any]:
    return {"median": s.median, "low": s.low, "high": s.high, "n": s.n, "relative": s.relative, "known": s.known}


def _changed_command(cmd: list[str], script: Path | None, root: Path, mirror: Path) -> tuple[list[str], str | None]:
    """The command with the copy in the script's place; for ``python -m``, the same command run from the copy's
    folder (the modules are found from the current directory)."""
    if script is None:
        return list(cmd), str(mirror)
    run_cmd = list(cmd)
    at = next(i for i, t in enumerate(cmd) if t.endswith(".py") and Path(t).resolve() == script)
    run_cmd[at] = str(mirror / script.relative_to(root))
    return run_cmd, None


def _run(
    command: tuple[list[str], str | None],
    side: str,
    number: int,
    scratch: Path,
    steps: int,
    seconds: float | None,
    out: Path | None,
    mirror: Path,
) -> dict[str, Any]:
    """One run of the original or the changed command under the hook, without the side measurement, with a cache
    of its own (each changed run reads the data in as a user's first run does) and no bytecode written (not beside
    a linked module of the user's: a prefix for the whole cache would recompile torch's thousands of modules and
    count it in the one-time cost); its figures. ``KeyboardInterrupt`` goes on once the command has ended."""
    from .analyse import report
    from .child import child_env, run_child, script_records
    from .record import read_records

    watch_dir, cache = scratch / f"watch-{number}", scratch / f"cache-{number}"
    watch_dir.mkdir()
    env = child_env(watch_dir, steps, False)
    env.update(GPUFEED_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    env.update(GPUFEED_VERIFY_RUN=str(number), GPUFEED_VERIFY_SIDE=side)  # a script (a test) can tell the runs apart
    t0 = time.monotonic()
    status = run_child(command[0], env, seconds, command[1])
    took = time.monotonic() - t0
    records = script_records(read_records(watch_dir))
    if records and out is not None:
        kept = out / "records-verify" / f"run-{number}-{side}"
        kept.mkdir(parents=True, exist_ok=True)
        for path in watch_dir.glob("record-*.json"):
            shutil.copy(path, kept / path.name)
    cache_bytes = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    shutil.rmtree(cache, ignore_errors=True)
    figures: dict[str, Any] = {"run": number, "side": side, "status": status, "seconds": took}
    if not records:
        return {**figures, "error": f"the {side} script wrote no record (exit status {status})"}
    after = report(records)
    main = after.main
    step_s, wait_s = _steady(records, main)
    for summary in after.loaders:  # the copy's lines are the user's file's lines: named as the user's
        if summary.built_at:
            summary.built_at = summary.built_at.replace(f"{mirror}{os.sep}", "")
    # the one-time cost as the changed run paid it: importing gf.accelerate and its calls, timed in the script
    # (rank 0's); the first batch's time also moves by the script's own start-up, which varies by a second
    fix_s = next((r.fix_s for r in records if r.rank == 0 and r.fix_s), {})
    return {
        **figures,
        **_figures(after),
        "exit": after.exit,
        "step_s": step_s,
        "rest_s": step_s - wait_s if step_s is not None and wait_s is not None else None,
        "wait_fraction": wait_s / step_s if step_s and wait_s is not None else None,
        "warm_up": _warm_up(main.batches) if main else 0,
        "machine": after.machine,
        "one_time_s": sum(fix_s.values()) if fix_s else None,
        "one_time": fix_s,
        "cache_bytes": cache_bytes,
        "fixed": any(s.init_of.startswith("gpufeed.") for s in after.loaders),  # gf.accelerate's loader was built
    }


def _warm_up(batches: int) -> int:
    """The batches left out at the start of each run: the first tenth, at least the first (the workers' start-up,
    a compiled kernel's first call).

    Example:
        >>> _warm_up(8), _warm_up(100)
        (1, 10)
    """
    return max(1, batches // WARM_UP)


def _steady(records: list[ProcessRecord], main: LoaderSummary | None) -> tuple[float | None, float | None]:
    """The main loader's time per step and wait per step after the warm-up (:func:`_warm_up`) and before the last
    batch (no step follows it), on the slowest rank: ``(None, None)`` with too few batches."""
    if main is None:
        return None, None
    best: tuple[float | None, float | None] = (None, None)
    for rec in records:
        for ld in rec.loaders:
            n = ld.batches
            if (ld.id, ld.built_at) != (main.id, main.built_at) or n - 1 - _warm_up(n) < 1:
                continue
            t, k = ld.timeline(), _warm_up(n)
            step = (t.requested[n - 1] - t.requested[k]) / (n - 1 - k)
            if best[0] is None or step > best[0]:
                best = (step, sum(t.waits[k : n - 1]) / (n - 1 - k))
    return best


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures: the median over its runs of each time and rate; the one-time cost of the run whose cost
    is the lower median (its parts stay that run's); the loader and the batches of the first run."""

    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    first = runs[0] if runs else {}
    once = [r for r in runs if r.get("one_time_s") is not None]
    middle = sorted(once, key=lambda r: r["one_time_s"])[(len(once) - 1) // 2] if once else {}
    return {
        "verdict": first.get("verdict"),
        "step_s": median("step_s"),
        "rest_s": median("rest_s"),
        "wait_fraction": median("wait_fraction"),
        "img_s": median("img_s"),
        "first_batch_s": median("first_batch_s"),
        "batches": first.get("batches", 0),
        "loader": first.get("loader"),
        "workers": first.get("workers"),
        "one_time_s": middle.get("one_time_s"),
        "one_time": middle.get("one_time", {}),
        "runs": len(runs),
    }


def _worst(exits: list[str]) -> str:
    order = ("crashed", "interrupted", "stopped", "finished")
    return min(exits, key=lambda e: next((i for i, k in enumerate(order) if e.startswith(k)), len(order)))


def _figures(r: WatchReport) -> dict[str, Any]:
    main = r.main
    return {
        "verdict": r.verdict,
        "step_s": r.step_s,
        "rest_s": r.step_s - r.wait_s if r.step_s is not None and r.wait_s is not None else None,
        "wait_fraction": r.data_wait_fraction,
        "img_s": main.img_s if main else None,
        "first_batch_s": main.first_batch_s if main else None,
        "batches": main.batches if main else 0,
        "loader": f"{main.cls} at {main.name}" if main else None,
        "workers": main.num_workers if main else None,
    }


def _mirror(root: Path, mirror: Path, changed_rel: Path, text: str) -> None:
    """``mirror``: ``root``'s entries as links, but real folders down to ``changed_rel``, which holds ``text``."""
    here, target = root, mirror
    parts = changed_rel.parts
    for depth, part in enumerate(parts):
        target.mkdir(parents=True, exist_ok=True)
        for entry in here.iterdir():
            if entry.name in (part, "__pycache__"):
                continue
            (target / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
        if depth == len(parts) - 1:
            (target / part).write_text(text)
            shutil.copymode(here / part, target / part)
        here, target = here / part, target / part
