"""glibc's malloc thresholds for loaders that make batches image by image on the CPU."""

from __future__ import annotations

import sys

import pytest
import torch

import gpufeed.loading.hostmem as hostmem
from gpufeed import DeviceLoader
from gpufeed.augment import Compose, RandomResizedCrop
from gpufeed.store.ragged import Ragged


def _fake_libc(monkeypatch, libc) -> None:
    """``libc`` for C's library, as keep_freed_buffers looks it up; any other library loads (torchvision's ops are
    loaded through ctypes too, the first time a test here needs them)."""
    real, name = hostmem.ctypes.CDLL, hostmem.ctypes.util.find_library("c") or "libc.so.6"
    monkeypatch.setattr(hostmem.ctypes, "CDLL", lambda path, *a, **k: libc if path == name else real(path, *a, **k))


def _ragged(n: int = 6) -> Ragged:
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 20 + 3 * i, 30 - 2 * i), dtype=torch.uint8, generator=g) for i in range(n)]
    return Ragged.stack(images)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_cpu_loader_of_images_of_different_sizes_fixes_the_thresholds_above_its_chunk(monkeypatch):
    calls: list[tuple[int, int]] = []

    class Libc:
        @staticmethod
        def mallopt(option: int, value: int) -> int:
            calls.append((option, value))
            return 1

    _fake_libc(monkeypatch, Libc)
    monkeypatch.setattr(hostmem, "_set", 0)
    loader = DeviceLoader(_ragged(), torch.arange(6), batch_size=2, transform=Compose([RandomResizedCrop(8)]))
    chunk = loader.config.chunk_batches * 2 * 3 * 8 * 8 * 4  # float32 batches of 3x8x8
    want = max(32 << 20, 2 * chunk)
    assert calls == [(-3, want), (-1, 2 * want)]
    assert f"reuses freed buffers up to {want / 2**20:.0f} MiB" in loader.host_memory_note
    DeviceLoader(_ragged(), torch.arange(6), batch_size=2, transform=Compose([RandomResizedCrop(8)]))
    assert len(calls) == 2  # set once: a loader that needs no more leaves it

    monkeypatch.setenv("GPUFEED_KEEP_MALLOC", "0")
    monkeypatch.setattr(hostmem, "_set", 0)
    off = DeviceLoader(_ragged(), torch.arange(6), batch_size=2, transform=Compose([RandomResizedCrop(8)]))
    assert off.host_memory_note is None and len(calls) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_cpu_loader_fixes_the_thresholds_only_when_it_makes_batches(monkeypatch):
    # Patched where keep_freed_buffers reads it (hostmem.ctypes.CDLL, looked up at each call), so any call the loader
    # makes is seen; a dense store with a transform makes each chunk of batches afresh, as a ragged one does.
    calls: list[tuple[int, int]] = []

    class Libc:
        @staticmethod
        def mallopt(option: int, value: int) -> int:
            calls.append((option, value))
            return 1

    _fake_libc(monkeypatch, Libc)
    monkeypatch.setattr(hostmem, "_set", 0)
    monkeypatch.delenv("GPUFEED_KEEP_MALLOC", raising=False)
    dense = torch.zeros(4, 3, 12, 12, dtype=torch.uint8)
    plain = DeviceLoader(dense, torch.arange(4), batch_size=2)  # batches are rows of the store: nothing to fix
    assert plain.host_memory_note is None and calls == []
    made = DeviceLoader(dense, torch.arange(4), batch_size=2, transform=Compose([RandomResizedCrop(8)]))
    want = max(32 << 20, 2 * made.config.chunk_batches * 2 * 3 * 8 * 8 * 4)  # float32 batches of 3x8x8
    assert calls == [(-3, want), (-1, 2 * want)]
    assert f"reuses freed buffers up to {want / 2**20:.0f} MiB" in made.host_memory_note


def test_a_buffer_handed_back_is_taken_again_for_a_batch_it_holds_and_a_larger_one_is_new():
    buffers = hostmem.Recycled(keep=2)
    first = buffers.take(1000)
    assert first.numel() == 1000 and first.untyped_storage().nbytes() == 1125  # an eighth over, for a next batch
    buffers.give(first, [torch.zeros(3)])  # what was made from it is other memory
    again = buffers.take(1100)
    assert again.numel() == 1100 and again.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    larger = buffers.take(2000)  # the one kept is taken: a new one
    assert larger.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()


def test_a_buffer_whose_memory_was_handed_on_is_not_taken_again_and_at_most_keep_are_kept():
    buffers = hostmem.Recycled(keep=2)
    data = buffers.take(64)
    buffers.give(data, [data[8:16].view(2, 4)])  # the caller holds a view of it: never reused
    assert buffers.take(64).untyped_storage().data_ptr() != data.untyped_storage().data_ptr()
    made = [buffers.take(n) for n in (10, 20, 30)]
    for b in made:
        buffers.give(b, [])
    kept = {buffers.take(1).untyped_storage().data_ptr(), buffers.take(1).untyped_storage().data_ptr()}
    assert kept == {b.untyped_storage().data_ptr() for b in made[1:]}  # the two largest; the third is new
    assert buffers.take(1).untyped_storage().data_ptr() not in kept


def test_a_buffer_seen_through_numpy_by_what_was_served_is_not_taken_again():
    buffers = hostmem.Recycled(keep=2)
    data = buffers.take(1000)
    other_storage = torch.from_numpy(data.numpy()[12:24])  # the same bytes through another storage object
    buffers.give(data, [torch.zeros(2), other_storage])
    assert buffers.take(1000).untyped_storage().data_ptr() != data.untyped_storage().data_ptr()
