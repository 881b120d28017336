"""The device time of a watched loop: a CUDA event at each batch's return, read without stalling the script.

NOTE [ bounded and never blocking ]: the events of a long run are read as they complete (``query``, every
``READ_EVERY`` batches) and dropped, so a run without ``--steps`` holds a few hundred events, not one per batch;
the only synchronisation is at the flush, once. The hook imports this module without torch: the events come from
the script's torch, passed in.

Example:
    >>> clock = DeviceClock()
    >>> clock.steps(3)  # no CUDA: no device times
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["READ_EVERY", "DeviceClock", "nvml_index"]

READ_EVERY = 128  # batches between reads of the completed events


class DeviceClock:
    """CUDA seconds between consecutive batches' returns, per batch."""

    def __init__(self) -> None:
        self.events: list[tuple[int, Any]] = []  # (batch, torch.cuda.Event recorded at its return), not yet read
        self.device: list[float] = []  # per batch k: CUDA seconds to batch k + 1's return (NaN: unknown)

    def mark(self, batch: int, cuda: Any) -> None:
        """Batch ``batch`` returned: record an event on the current stream (``cuda`` is ``torch.cuda``)."""
        event = cuda.Event(enable_timing=True)
        event.record()
        self.events.append((batch, event))
        if len(self.events) >= READ_EVERY:
            self.read(wait=False)

    def read(self, wait: bool) -> None:
        """Turn recorded events into step times and drop them (the last is kept for the next pair): only completed
        ones (``query``: no synchronisation in the script's loop), or all of them with ``wait`` (at the flush)."""
        events = self.events
        if wait and events:
            events[-1][1].synchronize()
        read = 0
        for (a, start), (b, stop) in zip(events, events[1:], strict=False):
            if not wait and not (start.query() and stop.query()):
                break
            if b == a + 1:  # both batches were marked (CUDA was up for both)
                self.device.extend([math.nan] * (a + 1 - len(self.device)))
                self.device[a] = start.elapsed_time(stop) / 1000
            read += 1
        del events[:read]

    def steps(self, batches: int) -> list[float] | None:
        """One device time per pair of ``batches`` consecutive batches (NaN where unknown); None without CUDA."""
        self.read(wait=True)
        if not self.device:
            return None
        steps = max(batches - 1, 0)
        return (self.device + [math.nan] * steps)[:steps]


def nvml_index(device: int) -> int:
    """The NVML index of CUDA device ``device`` of this process (``CUDA_VISIBLE_DEVICES`` renumbers them)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device < len(visible) and visible[device].isdigit():
        return int(visible[device])
    return device
