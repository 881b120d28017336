"""Plan: what a loader was built from and why, as ``print(loader.plan)`` shows it.

:func:`gpufeed.accelerate` fills one from its stages (the split of the transform, the storage tier, the read or
the cache hit) and hands it to the loader it constructs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..device import process_cores

__all__ = ["Plan"]


def _cores_now() -> str:
    return str(process_cores())


@dataclass(frozen=True)
class Plan:
    """What :func:`gpufeed.accelerate` decided, and why; ``print(loader.plan)`` shows it."""

    cached: tuple[str, ...]
    batched: tuple[str, ...]
    storage: str  # "device", "pinned", "mmap", "fallback" or "stream"
    stored_shape: tuple[int, ...]
    stored_dtype: str
    bytes: int
    ingest: str
    cache_path: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    device: str = ""  # where batches are made
    workers: int = 0  # the fallback's DataLoader workers
    layout: str = ""  # images of different sizes: how they are stored (stored_shape is then (N, C))
    cores: str = field(default_factory=_cores_now)  # the cores counted as usable, and why (affinity, quota)

    def _where(self) -> str:
        if self.storage == "fallback":
            return (
                f"not stored: your pipeline runs per sample, unchanged, in {self.workers} DataLoader worker(s), "
                f"batches copied ahead to {self.device or 'the device'}"
            )
        gib = self.bytes / 2**30
        size = f"{gib:.2f} GiB" if gib >= 0.1 else f"{self.bytes / 2**20:.1f} MiB"
        if self.storage == "stream":
            return f"not stored: {size} of shards, each batch read, decoded and augmented on {self.device}"
        what = f"{size}, {self.stored_dtype} {self.layout or tuple(self.stored_shape)}"
        if self.storage == "device":
            where = "in memory (the CPU is the device)" if self.device.startswith("cpu") else f"on {self.device}"
        elif self.storage == "pinned":
            where = f"in pinned host memory, each chunk copied to {self.device} ahead of use"
        else:
            where = f"in a memory-mapped file, each chunk read and copied to {self.device or 'the device'} ahead of use"
        return f"{where} ({what})"

    def __str__(self) -> str:
        lines = [
            f"storage:  {self._where()}",
            f"ingest:   {self.ingest}",
            f"cached:   {', '.join(self.cached) or 'nothing (stored as read)'}",
            f"batched:  {', '.join(self.batched) or 'nothing'}",
        ]
        if self.cache_path:
            lines.append(f"cache:    {self.cache_path}")
        if self.cores:
            threads = (
                "; the batched ops on the CPU run on 1 thread or torch's setting (at most the usable cores), "
                "whichever is faster now, measured as they run (GPUFEED_THREADS)"
                if self.device.startswith("cpu") and self.storage != "fallback"
                else ""
            )
            lines.append(f"cores:    {self.cores}{threads}")
        lines += [f"note:     {n}" for n in self.notes]
        return "\n".join(lines)
