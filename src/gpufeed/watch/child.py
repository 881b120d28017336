"""The user's command as a child process: its environment (the hook's folder first on ``PYTHONPATH``), its run to
the end or to ``--time`` (the signals forwarded, the process tree stopped), its exit status as a shell gives it, and
which records are the script's own. :mod:`.run` (the diagnosis) and :mod:`.verify` (the changed copy) both run it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from .record import FIRST_BATCH, ProcessRecord

__all__ = ["GRACE_S", "SIDE_S", "START_CAP_S", "child_env", "exit_status", "run_child", "script_records"]

START_CAP_S = 600.0  # --time starts anyway this long after the command, when no batch was asked for by then
SIDE_S = 20.0  # the side measurement's default budget, seconds (--side-seconds)
GRACE_S = 15.0  # after --time's SIGINT, the script's own cleanup (a checkpoint, the hook's flush) gets this long

SITE = Path(__file__).resolve().parent / "site"


def child_env(watch_dir: Path, steps: int, side: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ``base`` (default ours) with the hook's folder first on ``PYTHONPATH`` and the
    settings the hook reads.

    Example:
        >>> env = child_env(Path("/tmp/w"), 50, False, {"PYTHONPATH": "/mine"})
        >>> env["PYTHONPATH"].endswith(os.pathsep + "/mine"), env["GPUFEED_WATCH_STEPS"], env["GPUFEED_WATCH_SIDE"]
        (True, '50', '0')
    """
    env = dict(os.environ if base is None else base)
    paths = [str(SITE), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["GPUFEED_WATCH_DIR"] = str(watch_dir)
    env["GPUFEED_WATCH_STEPS"] = str(steps)
    env["GPUFEED_WATCH_SIDE"] = "1" if side else "0"
    env.setdefault("GPUFEED_WATCH_SIDE_SECONDS", str(SIDE_S))  # a caller's own budget (tests: a small one) is kept
    return env


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: killed by signal N is ``128 + N``.

    Example:
        >>> exit_status(-signal.SIGINT), exit_status(3)
        (130, 3)
    """
    return 128 - returncode if returncode < 0 else returncode


def script_records(records: list[ProcessRecord]) -> list[ProcessRecord]:
    """The records of the script's own processes. A launcher (torchrun's agent) runs the hook too, but it builds no
    loader and its world size is 1 where its workers' is larger: its record is left out."""
    world = max((r.world_size for r in records), default=1)
    return [r for r in records if r.loaders or r.world_size == world]


def run_child(cmd: list[str], env: dict[str, str], seconds: float | None, cwd: str | None = None) -> int:
    """Run the command to its end (or to ``seconds``) and return its exit status; a Ctrl-C (``KeyboardInterrupt``)
    is raised again once the command has ended.

    NOTE [Ctrl-C]: the command runs in our process group, so a Ctrl-C at the terminal reaches it (and torchrun's
    workers, and the loader's workers) as it would without gpufeed; we then wait for it to end, its hook flushing
    its record on the way. When the interrupt reached only us (no terminal in front of our group), we pass it on.
    A second Ctrl-C kills the command. --time interrupts the command's processes, never our group: that would
    interrupt whatever runs us (a test runner, a shell script) too.
    """
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd)
    except OSError as e:  # no such program: what the shell would say
        print(f"gpufeed diagnose: cannot run {cmd[0]!r}: {e.strerror or e}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126
    stopped = False
    with _terminate_forwarded(proc):
        try:
            try:
                if seconds is not None:
                    _wait_for_first_batch(proc, Path(env["GPUFEED_WATCH_DIR"]), seconds)
                proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                print(
                    f"gpufeed diagnose: --time {seconds:g} s reached (counted from the first batch), interrupting "
                    "the script",
                    file=sys.stderr,
                )
                stopped = True
                _signal_tree(proc, signal.SIGINT)
                _wait_or_kill(proc, GRACE_S)
        except KeyboardInterrupt:
            print("gpufeed diagnose: interrupted; waiting for the script (Ctrl-C again stops it now)", file=sys.stderr)
            if not _terminal_reached(proc):
                _signal_tree(proc, signal.SIGINT)
            try:
                proc.wait()
            except KeyboardInterrupt:
                _signal_tree(proc, signal.SIGKILL)
                proc.wait()
            raise  # the caller reports what was measured and ends with 130: nothing after this run starts
    return 0 if stopped else exit_status(proc.returncode)


def _wait_for_first_batch(proc: subprocess.Popen[Any], watch_dir: Path | None, seconds: float) -> None:
    """Wait until a process of the command has asked a loader for its first batch (the hook marks the request),
    the command ended, or ``START_CAP_S`` (at least ``seconds``) passed without one. NOTE: --time counts from
    there: what a script does before (imports, reading an index, downloading a model) can take minutes and is not
    what is measured, and a slow start (a loaded machine) must not end the script before its loop began; the cap
    keeps --time a bound on a script that never asks for a batch (a hang before its loop, no DataLoader)."""
    if watch_dir is None:
        return
    cap = time.monotonic() + max(seconds, START_CAP_S)
    while not (watch_dir / FIRST_BATCH).exists() and time.monotonic() < cap:
        try:
            proc.wait(timeout=0.2)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_or_kill(proc: subprocess.Popen[Any], grace: float) -> None:
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        print(f"gpufeed diagnose: the script did not stop within {grace:g} s; killing it", file=sys.stderr)
        _signal_tree(proc, signal.SIGKILL)
        proc.wait()


@contextmanager
def _terminate_forwarded(proc: subprocess.Popen[Any]) -> Iterator[None]:
    """While the command runs, a SIGTERM sent to us (a batch system cancelling the job) goes to the command too,
    and we still report; without this we would die at once and leave the command running unobserved."""

    def forward(signum: int, frame: FrameType | None) -> None:
        _signal_tree(proc, signal.SIGTERM)

    try:
        previous = signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminal_reached(proc: subprocess.Popen[Any]) -> bool:
    """Whether a Ctrl-C typed at a terminal reached the command itself: the command shares our process group and
    that group is the terminal's foreground group."""
    try:
        group = os.getpgid(proc.pid)
        return group == os.getpgrp() and os.tcgetpgrp(sys.stdin.fileno()) == group
    except (OSError, ValueError, AttributeError):  # no terminal, stdin closed or replaced
        return False


def _signal_tree(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the command and every process under it (torchrun's workers, the loader's workers), children
    first listed after their parent, as a Ctrl-C at a terminal would reach them all."""
    if proc.poll() is not None:
        return
    import psutil

    pids = [proc.pid]
    try:
        pids += [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:  # the command ended meanwhile
        return
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):  # ended meanwhile, or a setuid helper not ours to signal
            continue
