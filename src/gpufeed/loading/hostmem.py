"""Host memory for batches made on the CPU: freed buffers kept for the next batch, not handed back.

A batch of images of different sizes is cropped and resized image by image on the CPU, each step
allocating buffers of a few hundred KiB to a few MiB (the crop, the resize's passes, the batch).
glibc's malloc serves such sizes from fresh ``mmap`` pages, or trims them back to the kernel as they
are freed, unless its thresholds have grown past them, which depends on what the process happened to
free before: the same loader ran at 1,770 or 2,950 images/s on 2 cores depending on it (about a
million extra page faults per 6,000 images). Fixing the thresholds above the loader's largest
buffer (twice the batches it makes at once, at least 32 MiB; trimming at twice that) makes freed
buffers reused whatever came before; the process keeps that much freed heap. The same holds for
every batch a CPU loader makes: a 256x256 float batch (200 MB) from fresh pages cost 3x the crop,
flip and Normalize that filled it (benchmarks/image_sizes.py). The thresholds hold for the main heap: a
loader iterated in another thread allocates from that thread's arena, where glibc still maps buffers
above its heap size (64 MiB) fresh each time.
``GPUFEED_KEEP_MALLOC=0`` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Iterable

import torch

__all__ = ["Recycled", "keep_freed_buffers"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_MIN_BYTES = 32 << 20
_INT_MAX = 2**31 - 1
_set = 0  # the mmap threshold set so far (0: none)


def keep_freed_buffers(chunk_bytes: int) -> str | None:
    """Fix glibc's malloc thresholds above ``2 * chunk_bytes`` (Linux with glibc; raised, never lowered, by
    later loaders); the plan's note, or None where nothing was changed (another C library, or
    ``GPUFEED_KEEP_MALLOC=0``)."""
    global _set
    if not sys.platform.startswith("linux") or os.environ.get("GPUFEED_KEEP_MALLOC", "1") == "0":
        return None
    # mallopt takes a C int; glibc refuses thresholds past its own maximum anyway (a batch_size of 2**62 asks
    # for more than any address space), so a larger want is the largest int, refused there like any too large
    want = min(max(_MIN_BYTES, 2 * chunk_bytes), _INT_MAX)
    if want > _set:
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
        except (OSError, AttributeError):  # musl and others have no mallopt
            return None
        if not mallopt(_M_MMAP_THRESHOLD, want):
            return None
        mallopt(_M_TRIM_THRESHOLD, 2 * want)  # the mmap threshold is what matters; trimming is a refinement
        _set = want
    return (
        f"host memory: glibc's malloc reuses freed buffers up to {_set / 2**20:.0f} MiB (mallopt; twice the batches "
        "made at once), so per-image crops and each batch do not page-fault; GPUFEED_KEEP_MALLOC=0 leaves it as it is"
    )


class Recycled:
    """Host buffers made in one thread and handed back by another once done with, for the next batch.

    A stream's reader thread decodes each batch into a new buffer (a 224 px recipe's photos: about 140 MB a batch
    of 256). glibc maps a thread's buffers over 64 MiB fresh each time (the thresholds above hold for the main heap
    only), so every page faulted in once a batch: 125 faults an image, a tenth of the stream's CPU time. Buffers
    handed back (:meth:`give`) are taken again (:meth:`take`), at most ``keep`` of them (the batches in flight),
    until :meth:`clear`.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of uint8 host memory (a view of a kept buffer, or of a new one an eighth larger, so that a
        batch of slightly larger images fits it next time); its contents are undefined."""
        with self._lock:
            fits = [k for k, b in enumerate(self._free) if b.numel() >= nbytes]  # kept largest first
            if fits:
                return self._free.pop(fits[-1])[:nbytes]
        return torch.empty(nbytes + nbytes // 8, dtype=torch.uint8)[:nbytes]

    def give(self, data: torch.Tensor, made: Iterable[object]) -> None:
        """Hand back the buffer ``data`` views, unless a tensor in ``made`` (what was made from it, handed on to
        the caller) lies in its memory (a view, or a tensor over the same bytes through numpy or DLPack); the
        smallest buffers go first past ``keep``. Whoever made ``made`` must keep no other reference to ``data``."""
        storage = data.untyped_storage()
        first, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        for t in made:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                theirs = t.untyped_storage()
                if theirs.data_ptr() < end and first < theirs.data_ptr() + theirs.nbytes():
                    return
        whole = torch.empty(0, dtype=torch.uint8).set_(storage)
        with self._lock:
            self._free.append(whole)
            self._free.sort(key=lambda b: b.numel(), reverse=True)
            del self._free[self.keep :]

    def clear(self) -> None:
        """Free the buffers kept."""
        with self._lock:
            self._free.clear()
