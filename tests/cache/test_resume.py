"""A pixel-store build of a folder that is killed resumes where it stopped, and gives the same bytes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.datasets import ImageFolder

import gpufeed as gf
import gpufeed.pipeline.folder_store as folder_store
import gpufeed.store.encoded as encoded_module
from gpufeed.cache.manage import is_leftover, leftovers, remove_entry
from gpufeed.cache.partial import is_partial
from gpufeed.errors import CacheError
from gpufeed.read.files import read_files
from gpufeed.store.encoded import decode

CHUNK = 30_000  # bytes of pixels per recorded step: a few images each, so that a build has several steps
RECIPE = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.PILToTensor()])


def _folder(root: Path, n: int = 24) -> Path:
    rng = np.random.default_rng(3)
    for i in range(n):
        h, w = (int(v) for v in rng.integers(30, 80, 2))
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / f"c{i % 3}" / f"{i}.jpg")
    return root


_KILL = textwrap.dedent("""
    import os
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    import gpufeed as gf, gpufeed.pipeline.folder_store as folder_store, gpufeed.cache.partial as partial
    folder_store._CHUNK_BYTES, folder_store._PER_THREAD = {chunk}, 1
    partial._checkpoint = lambda done: os._exit(17) if done >= {kill_at} else None
    if {mid_chunk}:  # killed while a chunk is decoded, before it is recorded
        import gpufeed.store.encoded as encoded
        real, seen = encoded.decode_one, []
        def dying(e, i):
            seen.append(i)
            if len(seen) > {kill_at} + 2:
                os._exit(17)
            return real(e, i)
        encoded.decode_one = dying
    ds = ImageFolder({folder!r}, transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(),
                                                      T.PILToTensor()]))
    gf.accelerate(ds, batch_size=4, device="cpu", cache={root!r}, store="pixels", progress=False)
""")


def _kill_build(folder: Path, root: Path, kill_at: int, mid_chunk: bool = False) -> Path:
    script = _KILL.format(chunk=CHUNK, kill_at=kill_at, folder=str(folder), root=str(root), mid_chunk=mid_chunk)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 17
    (progress,) = [p for p in root.iterdir() if p.name.endswith(".partial")]
    return progress


def _counting_decodes(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = encoded_module.decode_one

    def counted(encoded, i):
        seen.append(int(encoded.index[i]) if encoded.index is not None else i)
        return real(encoded, i)

    monkeypatch.setattr(encoded_module, "decode_one", counted)
    return seen


@pytest.mark.parametrize("mid_chunk", [False, True], ids=["after a recorded chunk", "while decoding a chunk"])
def test_a_killed_build_resumes_where_it_stopped_and_stores_the_same_pixels(tmp_path, monkeypatch, mid_chunk):
    folder, root = _folder(tmp_path / "photos"), tmp_path / "cache"
    progress = _kill_build(folder, root, kill_at=8, mid_chunk=mid_chunk)
    assert is_partial(progress) and is_leftover(progress)
    import json

    done = json.loads((progress / "progress.json").read_text())["done"]
    assert (0 < done <= 10) if mid_chunk else (8 <= done < 24)  # mid-chunk: the last recorded chunk only

    monkeypatch.setattr(folder_store, "_CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(folder_store, "_PER_THREAD", 1)
    seen = _counting_decodes(monkeypatch)
    ds = ImageFolder(str(folder), transform=RECIPE)
    loader = gf.accelerate(ds, batch_size=4, device="cpu", cache=root, store="pixels", progress=False)
    assert sorted(seen) == list(range(done, 24))  # only what the killed build had not decoded
    assert f"resuming a stopped build at image {done} of 24" in loader.plan.ingest
    assert not progress.exists()  # the entry is written: its progress is gone
    stored = loader.images
    expected = decode(read_files(ds, progress=False)[0], torch.device("cpu"))
    assert torch.equal(stored.data, expected.data) and torch.equal(stored.shapes, expected.shapes)
    assert torch.equal(stored.starts, expected.starts)

    seen.clear()  # the next run is a hit: nothing decoded
    again = gf.accelerate(ds, batch_size=4, device="cpu", cache=root, store="pixels", progress=False)
    assert seen == [] and again.plan.ingest.startswith("cache hit")


def test_progress_of_another_build_of_the_entry_is_discarded_not_resumed(tmp_path, monkeypatch):
    folder, root = _folder(tmp_path / "photos"), tmp_path / "cache"
    progress = _kill_build(folder, root, kill_at=8)
    import json

    record = json.loads((progress / "progress.json").read_text())
    (progress / "progress.json").write_text(json.dumps({**record, "key": "0" * 40}))  # another build's
    monkeypatch.setattr(folder_store, "_CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(folder_store, "_PER_THREAD", 1)
    seen = _counting_decodes(monkeypatch)
    ds = ImageFolder(str(folder), transform=RECIPE)
    loader = gf.accelerate(ds, batch_size=4, device="cpu", cache=root, store="pixels", progress=False)
    assert sorted(seen) == list(range(24)) and "resuming" not in loader.plan.ingest
    expected = decode(read_files(ds, progress=False)[0], torch.device("cpu"))
    assert torch.equal(loader.images.data, expected.data)


def test_cache_clear_removes_a_stopped_builds_progress_and_nothing_named_like_it(tmp_path):
    folder, root = _folder(tmp_path / "photos", 9), tmp_path / "cache"
    progress = _kill_build(folder, root, kill_at=1)
    target = root / progress.name[1 : -len(".partial")]
    assert leftovers(target) == []  # not a leftover of a write: the writer leaves it to its build
    remove_entry(progress)
    assert not progress.exists()

    foreign = root / ".notes.partial"
    foreign.mkdir()
    (foreign / "progress.json").write_text('{"format": "something else"}')
    assert not is_partial(foreign) and not is_leftover(foreign)
    with pytest.raises(CacheError, match="not a gpufeed cache entry"):
        remove_entry(foreign)
    assert (foreign / "progress.json").exists()


def test_a_directory_in_the_progress_place_that_is_not_gpufeeds_is_never_touched(tmp_path, monkeypatch):
    folder, root = _folder(tmp_path / "photos", 6), tmp_path / "cache"
    ds = ImageFolder(str(folder), transform=RECIPE)
    from gpufeed.cache import entry_path
    from gpufeed.pipeline.translate import split_transform
    from gpufeed.read.fingerprint import cache_key

    key = cache_key(ds, split_transform(ds.transform).cached, {"kind": "pixels", "max_side": None})
    assert key is not None
    squatter = (
        entry_path(type(ds).__name__, key, root).parent / f".{entry_path(type(ds).__name__, key, root).name}.partial"
    )
    squatter.mkdir(parents=True)
    (squatter / "mine.txt").write_text("keep")
    with pytest.warns(UserWarning, match="is not a gpufeed build's progress"):
        loader = gf.accelerate(ds, batch_size=2, device="cpu", cache=root, store="pixels", progress=False)
    assert (squatter / "mine.txt").read_text() == "keep" and loader.plan.cache_path is None
    expected = decode(read_files(ds, progress=False)[0], torch.device("cpu"))
    assert torch.equal(loader.images.data, expected.data)


def test_no_room_for_the_progress_keeps_the_store_in_memory_and_says_so(tmp_path, monkeypatch):
    import errno
    import os

    folder, root = _folder(tmp_path / "photos", 6), tmp_path / "cache"

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    ds = ImageFolder(str(folder), transform=RECIPE)
    with pytest.warns(UserWarning, match=r"stays in memory.*No space left on device"):
        loader = gf.accelerate(ds, batch_size=2, device="cpu", cache=root, store="pixels", progress=False)
    assert loader.plan.cache_path is None and not any(p.name.endswith(".partial") for p in root.iterdir())
    expected = decode(read_files(ds, progress=False)[0], torch.device("cpu"))
    assert torch.equal(loader.images.data, expected.data)


def test_progress_with_a_record_but_no_pixels_yet_is_started_over(tmp_path, monkeypatch):
    """A kill between the record and the reserved file (the first moment the directory is gpufeed's)."""
    import json

    folder, root = _folder(tmp_path / "photos", 9), tmp_path / "cache"
    progress = _kill_build(folder, root, kill_at=1)
    (progress / "pixels.bin").unlink()
    record = json.loads((progress / "progress.json").read_text())
    (progress / "progress.json").write_text(json.dumps({**record, "done": 0}))
    seen = _counting_decodes(monkeypatch)
    ds = ImageFolder(str(folder), transform=RECIPE)
    loader = gf.accelerate(ds, batch_size=3, device="cpu", cache=root, store="pixels", progress=False)
    assert sorted(seen) == list(range(9)) and loader.plan.cache_path is not None and not progress.exists()


def test_the_progress_of_a_folder_that_changed_since_is_removed_by_its_next_build(tmp_path, monkeypatch):
    import os

    folder, root = _folder(tmp_path / "photos", 12), tmp_path / "cache"
    stale = _kill_build(folder, root, kill_at=1)
    one = next(folder.rglob("*.jpg"))
    os.utime(one, (one.stat().st_atime, one.stat().st_mtime + 60))  # the folder changed: another key
    ds = ImageFolder(str(folder), transform=RECIPE)
    loader = gf.accelerate(ds, batch_size=3, device="cpu", cache=root, store="pixels", progress=False)
    assert loader.plan.cache_path is not None and not stale.exists()
    assert [p.name for p in root.iterdir() if p.name.endswith(".partial")] == []


def test_the_decoded_file_is_moved_into_the_entry_so_one_copys_room_is_enough(tmp_path, monkeypatch):
    import gpufeed.cache.writer as writer

    folder, root = _folder(tmp_path / "photos", 9), tmp_path / "cache"
    ds = ImageFolder(str(folder), transform=RECIPE)
    pixels = int(decode(read_files(ds, progress=False)[0], torch.device("cpu")).data.numel())
    assert pixels > 20_000
    room = writer._MANIFEST_ALLOWANCE + 10_000  # the rest of the entry fits, a second copy of the pixels would not
    monkeypatch.setattr(writer, "_free_bytes", lambda path: room)
    loader = gf.accelerate(ds, batch_size=3, device="cpu", cache=root, store="pixels", progress=False)
    assert loader.plan.cache_path is not None
    entry = Path(loader.plan.cache_path)
    assert (entry / "pixels.bin").stat().st_size == pixels and not any(p.suffix == ".partial" for p in root.iterdir())
    from gpufeed.store.entry import verify_cache

    verify_cache(entry)  # every byte against the manifest's hashes
