"""The prefetcher race check: can a batch's memory be overwritten while the consumer still reads it?

A consumer stream much slower than the copies (a device sleep of ``consumer_ms`` before it reads
each batch, against a fraction of a millisecond per copy) reads every batch's checksum; the batch is
dropped right after its reads are queued. Without ``record_stream`` the caching allocator hands that
memory to a later copy before the queued reads run, and checksums come out wrong; without the
event wait, a read runs before its copy lands. Either shows as corrupted batches.

``broken=True`` runs a prefetcher with ``record_stream`` disabled: the check must catch it (that is
what shows it can fail). Used by ``gpu_check.py`` and by the CUDA tests.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from unittest import mock

import torch

import gpufeed as gf

__all__ = ["race_check"]


def race_check(
    device: str = "cuda", batches: int = 1000, depth: int = 3, consumer_ms: float = 5.0, broken: bool = False
) -> dict:
    """Run the check; ``ok`` is True when no batch was corrupted."""
    shape = (256, 3, 32, 32)
    source = ((torch.full(shape, float(i % 997)), torch.tensor([i])) for i in range(batches))
    sums = torch.zeros(batches, dtype=torch.float64, device=device)
    labels = torch.zeros(batches, dtype=torch.int64, device=device)
    cycles = _cycles_per_ms() * consumer_ms if device == "cuda" else 0
    patch = mock.patch.object(torch.Tensor, "record_stream", lambda self, stream: None) if broken else nullcontext()
    t0 = time.perf_counter()
    timed = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if device == "cuda" else []
    if timed:
        timed[0].record()
    with patch:
        for i, (x, y) in enumerate(gf.prefetch(source, device=device, depth=depth)):
            if cycles:
                torch.cuda._sleep(int(cycles))  # the consumer lags far behind the copies
            sums[i] = x.double().sum()
            labels[i] = y[0]
            del x, y  # hand the memory back at once: the allocator must still not reuse it early
        if timed:
            timed[1].record()
            torch.cuda.synchronize()
    expected = torch.tensor([float(i % 997) * 256 * 3 * 32 * 32 for i in range(batches)], dtype=torch.float64)
    bad = (sums.cpu() != expected) | (labels.cpu() != torch.arange(batches))
    return {
        "batches": batches,
        "depth": depth,
        "consumer_ms": consumer_ms,
        # What the GPU really spent per batch: well under consumer_ms would mean the lag was not there to test.
        "gpu_ms_per_batch": round(timed[0].elapsed_time(timed[1]) / batches, 2) if timed else None,
        "broken_prefetcher": broken,
        "corrupted": int(bad.sum()),
        "ok": not bool(bad.any()),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _cycles_per_ms() -> float:
    """GPU clock cycles in a millisecond, measured with ``torch.cuda._sleep`` (clocks differ by GPU).

    Measured after half a second of spinning: an idle GPU clocks several times lower than a busy one,
    and a calibration on a cold GPU would make the consumer's lag far shorter than asked."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        torch.cuda._sleep(5_000_000)
        torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / max(start.elapsed_time(end), 1e-3)
