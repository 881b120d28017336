"""When a loader's fused kernels took over from its eager ops, said for its plan (NOTE [ Compiled ops ] in
:mod:`gpufeed.augment.fusion`): the compile runs in the background while the eager ops serve the same pixels."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..augment import compiler

if TYPE_CHECKING:
    from ..augment.fusion import Watched, _Fused

__all__ = ["Takeover"]


class Takeover:
    """The fused functions a loader's transform called (compiling on), and the batch from which they served."""

    def __init__(self, fused: Iterable[_Fused], built: float) -> None:
        """``built``: ``time.monotonic()`` when the loader's construction began (before its transform's first run)."""
        self.fused = set(fused)
        self.built = built
        self.at: tuple[int, int, float] | None = None  # (epoch, batch, seconds after the loader was built)

    def after(self, epoch: int, batch: int, chunk: Watched) -> None:
        """Called after a chunk's transform ran: if it ran compiled and none of it waited for a compile, the fused
        kernels took over at its first batch."""
        self.fused |= chunk.fused
        if self.at is None and chunk.served and not chunk.waited:
            self.at = (epoch, batch, time.monotonic() - self.built)

    def note(self) -> str | None:
        """One line for the plan; None where nothing compiles (no fused op, or GPUFEED_COMPILE off)."""
        if not self.fused:
            return None
        jobs = [j for f in sorted(self.fused, key=lambda f: f.op) for j in f.kinds.values()]
        ops = ", ".join(dict.fromkeys(f"{j.op} for {j.device}" for j in jobs)) or ", ".join(f.op for f in self.fused)
        failed = next((e for e in [*(j.error for j in jobs), *(f.broken for f in self.fused)] if e), None)
        if failed:
            return f"fused kernels: {ops} could not compile ({failed}); the eager ops serve, the same pixels"
        mine = [j for j in jobs if j.queued >= self.built or j.finished is None or j.finished > self.built]
        if not mine:
            return f"fused kernels: {ops}, compiled earlier in this process"
        where = f"Inductor's cache: {compiler.cache_dir()}"
        pending = [j for j in mine if j.finished is None]
        if pending:
            since = time.monotonic() - min(j.queued for j in mine)
            return (
                f"fused kernels: {ops} compiling in the background ({since:.0f} s so far, not part of the data's "
                f"one-time cost; {where}); the eager ops serve until they are ready, the same pixels"
            )
        seconds = sum(j.seconds or 0.0 for j in mine)
        done = (
            f"fused kernels: {ops} compiled in {seconds:.1f} s, in the background (not part of the data's one-time cost"
        )
        if self.at is None:
            return f"{done}; {where}); they serve from the next batch"
        epoch, batch, after = self.at
        return (
            f"{done}; {where}); they took over at epoch {epoch}, batch {batch}, {after:.1f} s after the loader was "
            "built (the eager ops served the batches before it, the same pixels)"
        )
