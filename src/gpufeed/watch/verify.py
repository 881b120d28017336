"""``gpufeed diagnose --verify -- CMD``: the suggested change, applied to a copy of the script and run, measured.

The user's files are never written. The file that builds the loader is copied, changed (:func:`file_change`), into
a scratch folder that mirrors the script's folder: every other entry there is a link to the user's own (so the
script's sibling modules import, and paths found from ``__file__`` lead to the same data), and the folders on the
way to the changed file are real folders holding links. The command runs again with the copy in the script's
place, for the same steps, under the same hook, with gpufeed's cache in the scratch folder (its size is measured,
then it goes with the folder) and no bytecode written. Before and after are then compared: the step
(its wait and the rest), samples per second, and the time to the first batch, whose difference is the fix's
one-time cost (importing gpufeed, reading the data in); beside what the report predicted.

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
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .advice import file_change
from .verify_text import verify_text

if TYPE_CHECKING:
    from .analyse import WatchReport

__all__ = ["diff_name", "prepare", "script_of", "verify", "verify_text"]


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
    side_s: float,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` with the change applied to a copy and return before, after and the prediction side by side (a
    dict, JSON-ready; ``error`` when it could not run). The changed run's raw records go to ``out/records-verify``."""
    from .analyse import report
    from .child import child_env, run_child, script_records
    from .record import read_records

    file = Path(before.change["file"]).resolve() if before.change else None
    script = script_of(cmd)
    root = script.parent if script is not None else Path.cwd().resolve()
    if file is None or not file.is_relative_to(root):
        return {"error": f"the loader is built in {file}, outside the script's folder {root}: change it there by hand"}
    scratch = Path(tempfile.mkdtemp(prefix="gpufeed-verify-"))
    try:
        mirror = scratch / "script"
        _mirror(root, mirror, file.relative_to(root), changed)
        run_cmd, cwd = list(cmd), None
        if script is not None:
            run_cmd[run_cmd.index(next(t for t in cmd if t.endswith(".py") and Path(t).resolve() == script))] = str(
                mirror / script.relative_to(root)
            )
        else:
            cwd = str(mirror)  # python -m: the modules are found from the current directory
        watch_dir = scratch / "watch"
        watch_dir.mkdir()
        env = child_env(watch_dir, steps, False)
        # bytecode is read as usual but not written: not beside a linked module of the user's (a prefix for the
        # whole cache would recompile torch's thousands of modules and count it in the one-time cost)
        env.update(GPUFEED_CACHE_DIR=str(scratch / "cache"), PYTHONDONTWRITEBYTECODE="1")
        env["GPUFEED_WATCH_SIDE_SECONDS"] = str(side_s)
        print(f"gpufeed diagnose --verify: running the command again on a copy with the change ({mirror})", flush=True)
        status = run_child(run_cmd, env, seconds, cwd)
        records = script_records(read_records(watch_dir))
        if records and out is not None:
            kept = out / "records-verify"
            kept.mkdir(parents=True, exist_ok=True)
            for path in watch_dir.glob("record-*.json"):
                shutil.copy(path, kept / path.name)
        cache = sum(p.stat().st_size for p in (scratch / "cache").rglob("*") if p.is_file())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not records:
        return {"error": f"the changed script wrote no record (exit status {status})", "status": status}
    after = report(records)
    for summary in after.loaders:  # the copy's lines are the user's file's lines: named as the user's
        if summary.built_at:
            summary.built_at = summary.built_at.replace(f"{mirror}{os.sep}", "")
    # the one-time cost as the changed run paid it: importing gf.accelerate and its calls, timed in the script
    # (rank 0's); the first batch's time also moves by the script's own start-up, which varies by a second
    fix_s = next((r.fix_s for r in records if r.rank == 0 and r.fix_s), {})
    return {
        "status": status,
        "command": run_cmd,
        "before": _figures(before),
        "after": {**_figures(after), "one_time_s": sum(fix_s.values()) if fix_s else None, "one_time": fix_s},
        "after_exit": after.exit,
        "predicted": before.prediction,
        "cache_bytes": cache,
    }


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
