"""Which code path a batch takes: the host's (CPU) or the device's (CUDA and the rest).

A few ops compute the same pixels two ways: on the CPU by sample subsets, cache-sized chunks or the library's own
per-image kernel (fewer passes over memory), on a GPU as a few whole-batch kernels with no host read. Each asks
:func:`host_path`. :func:`device_path` makes CPU batches take the device's path, so that the GPU's code can be
checked on any machine: its pixels against the host path's (tests/augment/test_paths.py), and its operator count
per batch, which on a GPU is its kernel launches (benchmarks/launches.py).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Protocol

import torch

__all__ = ["device_path", "host_path"]


class _OnDevice(Protocol):  # a tensor, or a Ragged batch of images
    @property
    def device(self) -> torch.device: ...


_DEVICE_PATH = contextvars.ContextVar("gpufeed_device_path", default=False)


def host_path(x: _OnDevice) -> bool:
    """Whether ``x`` takes the host's path: it is on the CPU, outside :func:`device_path`."""
    return x.device.type == "cpu" and not _DEVICE_PATH.get()


@contextlib.contextmanager
def device_path() -> Iterator[None]:
    """Within this block, CPU batches take the path a GPU batch takes (same pixels, GPU-shaped work)."""
    token = _DEVICE_PATH.set(True)
    try:
        yield
    finally:
        _DEVICE_PATH.reset(token)
