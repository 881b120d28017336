"""Turning a user's ``device=`` into a usable ``torch.device``, with errors that say what to do."""

from __future__ import annotations

import os

import torch

from .errors import DeviceError

__all__ = ["environment", "resolve_device", "sync", "usable_cores"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers narrow), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU): before reading a host clock in a measurement."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Parse and check a device; ``None`` means CUDA when available, else the CPU.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"device={device!r} is not a device torch knows ({e}); use 'cpu' or 'cuda[:N]'") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device={device!r} but torch.cuda.is_available() is False here; use device='cpu'")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
        return torch.device("cuda", index)
    raise DeviceError(f"device={device!r}: gpufeed supports 'cpu' and 'cuda[:N]' devices")


def environment(device: torch.device, **extra: object) -> dict[str, object]:
    """Date, machine and versions: what every recorded figure is stated with (bench, train, benchmarks)."""
    import datetime as dt
    import platform

    import torchvision

    env: dict[str, object] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host_cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "device": str(device),
    }
    try:
        with open("/proc/cpuinfo") as f:
            env["host_cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    env.update(extra)
    return env
