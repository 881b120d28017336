"""GPU utilisation sampled by NVML (nvidia-ml-py) in a background thread; absent without it."""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["UtilisationMonitor"]


class UtilisationMonitor:
    """``with UtilisationMonitor(device) as m: ...``; then ``m.mean`` is the mean GPU busy % (or None).

    ``m.unavailable`` says why there is no figure (a CPU device, or nvidia-ml-py not installed).
    """

    def __init__(self, device: torch.device, interval_s: float = 0.05) -> None:
        self.device, self.interval_s = device, interval_s
        self.samples: list[int] = []
        self.timeline: list[tuple[float, float, float]] = []  # (seconds since start, GPU %, memory used MiB)
        self.unavailable: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None

    def __enter__(self) -> UtilisationMonitor:
        if self.device.type != "cuda":
            self.unavailable = "not a CUDA device"
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device.index or 0)
        except Exception as e:  # ImportError, or an NVML error on a machine without the driver library
            self.unavailable = f"NVML unavailable ({type(e).__name__}); pip install nvidia-ml-py"
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import time

        import pynvml

        t0 = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            util = pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            used = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20
            self.samples.append(util)
            self.timeline.append((time.perf_counter() - t0, float(util), float(used)))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
