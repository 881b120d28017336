"""Run a user's training command under the hook, then report: what ``gpufeed diagnose -- CMD ...`` does.

The command runs as it is, its output going straight to ours; the measurement rides on ``PYTHONPATH`` (the
``watch/site`` folder first: its ``sitecustomize`` installs :mod:`gpufeed.watch.hook` in every Python process the
command starts), so ``python train.py``, ``python -m pkg.mod`` and ``torchrun ... train.py`` all work, the last
because torchrun hands its environment to its workers. Each process writes its record into a fresh folder; the
report is built from whatever records exist once the command has ended, however it ended.

Example::

    report, status = watch(["python", "train.py", "--lr", "0.1"], steps=100, seconds=None, out=Path("diag"))
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .child import GRACE_S, SIDE_S, child_env, exit_status, run_child, script_records
from .record import read_records
from .spread import VERIFY_RUNS, VERIFY_S

if TYPE_CHECKING:
    from .analyse import WatchReport

__all__ = ["GRACE_S", "SIDE_S", "child_env", "exit_status", "watch"]


def watch(
    cmd: list[str],
    steps: int,
    seconds: float | None,
    out: Path,
    side: bool = True,
    verify: bool = False,
    side_seconds: float | None = None,
    verify_runs: int = VERIFY_RUNS,
    verify_seconds: float | None = VERIFY_S,
) -> tuple[WatchReport | None, int]:
    """Run ``cmd`` with the hook, stop it after ``steps`` batches of a loader (0: no limit) or ``seconds``, then
    print the report, save it to ``out`` (with the raw records under ``out/records`` and the code change as
    ``out/fix.diff``) and return it with the command's exit status (0 when gpufeed stopped it). ``None`` when no
    process wrote a record.

    ``side``: after the measured steps, the script's process measures what ``gf.accelerate`` does with its dataset
    (see :mod:`gpufeed.watch.side`) within ``side_seconds``. ``verify``: then the original command and a copy of
    the script with the change applied run interleaved, ``verify_runs`` runs while they fit in ``verify_seconds``
    (:mod:`gpufeed.watch.verify`), and the report compares the two sides with the prediction.

    A Ctrl-C (NOTE [Ctrl-C] in :mod:`.child`) ends the run under way, skips what was still to run, prints and saves
    what was measured, says what it interrupted, and returns status 130.
    """
    watch_dir = Path(tempfile.mkdtemp(prefix="gpufeed-watch-"))
    env = child_env(watch_dir, steps, side)
    if side_seconds is not None:
        env["GPUFEED_WATCH_SIDE_SECONDS"] = str(side_seconds)
    interrupted: str | None = None
    try:
        try:
            status = run_child(cmd, env, seconds)
        except KeyboardInterrupt:
            status, interrupted = 130, "the script's run"
        records = script_records(read_records(watch_dir))
        if records:
            kept = out / "records"
            kept.mkdir(parents=True, exist_ok=True)
            for path in watch_dir.glob("record-*.json"):
                shutil.copy(path, kept / path.name)
    finally:
        shutil.rmtree(watch_dir, ignore_errors=True)
    if not records:
        if interrupted is not None:
            return None, _interrupted(interrupted)
        print(
            f"gpufeed diagnose: nothing was measured: no Python process of {cmd[0]!r} ran gpufeed's hook (is "
            "gpufeed installed in the Python that runs the script? did the script start at all?)",
            file=sys.stderr,
        )
        return None, status
    from .analyse import report
    from .verify import prepare

    result = report(records)
    result.status = status
    if interrupted is not None and side and result.exit == "stopped" and result.side is None:
        interrupted = "the side measurement (the script's steps were measured)"  # the hook's stop came first
    prepared = prepare(result, out)
    if verify and interrupted is None:
        if prepared is None:
            why = result.no_change_reason or "no code change was suggested"
            result.verify = {"error": f"nothing to apply: {why}"}
        else:
            from .verify import verify as run_verify

            result.verify = run_verify(cmd, result, prepared[0], steps, seconds, verify_runs, verify_seconds, out)
            if result.verify.get("interrupted"):
                interrupted = f"the verification, {result.verify['interrupted']}"
    print(result, flush=True)
    result.save(out)
    print(f"wrote {out}", flush=True)
    if interrupted is not None:
        return result, _interrupted(interrupted)
    return result, status


def _interrupted(what: str) -> int:
    """Say what a Ctrl-C interrupted, that the user's files are as they were; the status a shell gives it."""
    print(
        f"gpufeed diagnose: interrupted during {what}; nothing was changed in your files (the changed copy, if "
        "any, was in a scratch folder, removed)",
        file=sys.stderr,
        flush=True,
    )
    return 130
