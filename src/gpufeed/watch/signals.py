"""The watched script's SIGINT and SIGTERM: the record is written first, then the signal ends the process as it
would have without the hook (or as the script's own handler decides).

NOTE [ who ends the process on a signal ]: the previous handler (Python's default for SIGINT raises
KeyboardInterrupt) is called after the record is written. Without one, the signal's default action is taken again
(``SIG_DFL``, then the signal re-sent), so the exit status is the one the shell would report. A handler the script
installed after the hook and that calls ours (Lightning's graceful SIGTERM: it stops the loop after the step and
ends the process itself) keeps that decision: ours returns.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["install_handlers"]


def install_handlers(on_signal: Callable[[], None], note: Callable[[str, BaseException], None]) -> None:
    """On SIGINT and SIGTERM: ``on_signal()`` (write the record), then the previous handler or the default ending.
    ``note`` receives what could not be installed (not the main thread, no such signal here)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue
            signal.signal(signum, _handler(previous, on_signal))
        except (ValueError, OSError) as e:
            note("signal handlers", e)


def _called_by_lightning() -> bool:
    """Whether the signal handler that called ours is Lightning's (its handler composition): it ends the process
    itself, after the step. Any other handler that chains to ours expects the default ending from it."""
    caller = sys._getframe(2)  # _called_by_lightning <- handle <- the handler that called it
    return str(caller.f_globals.get("__name__", "")).split(".")[0] in ("lightning", "pytorch_lightning")


def _handler(previous: Any, on_signal: Callable[[], None]) -> Any:
    def handle(signum: int, frame: FrameType | None) -> Any:
        on_signal()
        if callable(previous):
            return previous(signum, frame)
        if signal.getsignal(signum) is not handle and _called_by_lightning():
            return None  # see NOTE [ who ends the process on a signal ]
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None

    return handle
