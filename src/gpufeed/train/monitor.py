"""GPU utilisation sampled by NVML (nvidia-ml-py) in a background thread; absent without it."""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["UtilisationMonitor", "nvml_index"]


def nvml_index(device: torch.device) -> int:
    """NVML's index of ``device``: CUDA numbers only the visible GPUs, NVML all of them, so under
    ``CUDA_VISIBLE_DEVICES=2,3`` CUDA's device 0 is NVML's 2 (torch maps it, UUIDs included)."""
    return torch.cuda._get_nvml_device_index(device)


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
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(self.device))
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
