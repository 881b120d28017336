"""A daemon thread that samples the CPU use of a process and of its children, and the GPU's use through NVML.

The children are the ``DataLoader``'s worker processes (and anything else the script started), so the record can
tell a loader's workers from the main process. NVML (``pynvml``, from ``nvidia-ml-py``) is optional: without it, or
without a GPU, ``gpu`` stays empty.

Example:
    >>> import os, time
    >>> s = Sampler(os.getpid(), interval=0.01, gpu=False)
    >>> s.start(); time.sleep(1.0); s.stop()
    >>> len(s.cpu) > 0, s.gpu, s.notes
    (True, [], [])
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Sampler", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Sampler(threading.Thread):
    """Every ``interval`` seconds: ``(t, main %, children %)`` into ``cpu``, ``(t, machine %, load)`` into
    ``machine`` and ``(t, util %, MiB)`` into ``gpu``.

    ``t`` is ``time.perf_counter() - origin``; the process percentages are of one core (psutil's convention), so 4
    busy workers read 400; the machine's is of all its cores, every process counted (another job, a test suite),
    with the 1-minute load average beside it. ``gpu_index`` is called at each sample: the NVML index of the GPU
    the script uses.
    """

    def __init__(
        self,
        pid: int,
        interval: float = 0.5,
        origin: float | None = None,
        gpu: bool = True,
        gpu_index: Callable[[], int] = lambda: 0,
    ) -> None:
        super().__init__(name="gpufeed-watch-sampler", daemon=True)
        self.pid = pid
        self.interval = interval
        self.origin = time.perf_counter() if origin is None else origin
        self.cpu: list[tuple[float, float, float]] = []
        self.gpu: list[tuple[float, float, float]] = []
        self.machine: list[tuple[float, float, float]] = []
        self.notes: list[str] = []
        self._want_gpu = gpu
        self._gpu_index = gpu_index
        self._done = threading.Event()
        self._children: dict[int, Any] = {}  # pid -> psutil.Process, kept: cpu_percent needs the previous call

    def stop(self) -> None:
        """Stop sampling (returns once the thread has ended, or after two intervals)."""
        self._done.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=2 * self.interval + 0.5)

    def run(self) -> None:
        try:
            import psutil

            main = psutil.Process(self.pid)
            main.cpu_percent(None)  # the first call only starts the interval
            psutil.cpu_percent(None)
        except Exception as e:  # noqa: BLE001 - a sampler that cannot start must not stop the script
            self.notes.append(f"no CPU samples: {type(e).__name__}: {e}")
            return
        nvml = self._nvml() if self._want_gpu else None
        while not self._done.wait(self.interval):
            try:
                self.cpu.append(self._cpu(main))
                self.machine.append(self._machine())
            except Exception as e:  # noqa: BLE001 - the process is exiting; keep what was sampled
                self.notes.append(f"CPU sampling ended: {type(e).__name__}: {e}")
                return
            if nvml is not None:
                try:
                    self.gpu.append(self._gpu(nvml))
                except Exception as e:  # noqa: BLE001 - NVML errors end GPU sampling only
                    self.notes.append(f"GPU sampling ended: {type(e).__name__}: {e}")
                    nvml = None

    def _cpu(self, main: Any) -> tuple[float, float, float]:
        import psutil

        own = main.cpu_percent(None)
        t = time.perf_counter() - self.origin
        total, alive = 0.0, {}
        for child in main.children(recursive=True):
            proc = self._children.get(child.pid, child)
            try:
                total += proc.cpu_percent(None)  # 0.0 on a child's first sample
                alive[child.pid] = proc
            except psutil.Error:
                continue  # exited between the listing and the read
        self._children = alive
        return (t, own, total)

    def _machine(self) -> tuple[float, float, float]:
        import psutil

        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
        return (time.perf_counter() - self.origin, float(psutil.cpu_percent(None)), float(load))

    def _nvml(self) -> Any:
        try:
            import pynvml  # type: ignore[import-not-found,unused-ignore]

            pynvml.nvmlInit()
            return pynvml
        except Exception:  # noqa: BLE001 - no NVML or no driver: gpu stays [], which the report reads as "not measured"
            return None

    def _gpu(self, nvml: Any) -> tuple[float, float, float]:
        handle = nvml.nvmlDeviceGetHandleByIndex(self._gpu_index())
        util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        used = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        return (time.perf_counter() - self.origin, float(util), float(used))
