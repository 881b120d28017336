"""Turning a user's ``device=`` into a usable ``torch.device``, with errors that say what to do."""

from __future__ import annotations

import os

import torch

from .errors import DeviceError

__all__ = ["resolve_device", "usable_cores"]


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers narrow), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
