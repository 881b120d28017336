"""Entries over time: the key sees a file replaced under a restored mtime, `cache verify --data` compares the
folder's bytes, a newer build of the same data replaces the older entry (never one in use), the cache root
keeps to GPUFEED_CACHE_LIMIT (least recently used first), and `cache info` says what each entry holds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import Subset, TensorDataset, random_split
from torchvision.datasets import ImageFolder

import gpufeed as gf
from gpufeed.cache.manage import list_entries
from gpufeed.cache.usage import enforce_limit, in_use, last_use, parse_size
from gpufeed.cli.main import main
from gpufeed.read.fingerprint import cache_key
from gpufeed.store.entry import verify_cache

from fakes import snapshot

RECIPE = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.PILToTensor()])
KW = dict(batch_size=4, device="cpu", progress=False, store="pixels")


def _folder(root: Path, n: int = 9, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for i in range(n):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16 + i, 20, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


def _same_size_same_mtime(path: Path) -> None:
    """Replace ``path`` by other bytes of the same length and put its mtime back, as rsync -t or a restore does."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # inside the last chunk's data: same size, other content
    tmp = path.with_suffix(".new")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_a_file_replaced_by_one_of_the_same_size_with_its_mtime_restored_changes_the_key(tmp_path):
    root = _folder(tmp_path)
    before = cache_key(ImageFolder(str(root)), [])
    _same_size_same_mtime(root / "c1" / "4.png")
    assert cache_key(ImageFolder(str(root)), []) != before


def test_a_file_rewritten_in_place_with_its_mtime_restored_changes_the_key(tmp_path):
    root = _folder(tmp_path)
    path = root / "c1" / "4.png"
    before, st = cache_key(ImageFolder(str(root)), []), path.stat()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    with open(path, "r+b") as f:  # same inode: only its change time tells
        f.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache_key(ImageFolder(str(root)), []) != before


def test_cache_verify_data_names_the_files_that_differ_from_what_the_entry_was_built_from(tmp_path, capsys):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)
    args = ["cache", "--cache-dir", str(cache), "verify", "--data", str(root)]
    assert main(args) == 0
    assert f"its 9 files in {root.resolve()} are the ones it was built from" in capsys.readouterr().out

    _same_size_same_mtime(root / "c1" / "4.png")
    (root / "c2" / "5.png").unlink()
    Image.new("RGB", (9, 9)).save(root / "c0" / "new.png")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "DIFFERS" in err and "3 files of" in err
    assert f"{root.resolve()}/c1/4.png: its bytes differ from those the entry was built from" in err
    assert f"{root.resolve()}/c2/5.png: missing" in err
    assert f"{root.resolve()}/c0/new.png: added since the entry was built" in err


@pytest.mark.parametrize(
    "recipe",
    [
        T.Compose([T.Resize(10), T.CenterCrop(8), T.ToTensor()]),  # an evaluation pipeline: dense, read per sample
        T.Compose([T.Resize(12), T.RandomResizedCrop(8), T.ToTensor()]),  # resized first: ragged, read per sample
    ],
    ids=["eval", "resize-then-crop"],
)
def test_cache_verify_data_checks_an_entry_read_sample_by_sample_too(tmp_path, capsys, recipe):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    loader = gf.accelerate(ImageFolder(str(root), transform=recipe), cache=cache, **KW)
    assert loader.plan.ingest.startswith("per-sample")
    args = ["cache", "--cache-dir", str(cache), "verify", "--data", str(root)]
    assert main(args) == 0
    assert f"its 9 files in {root.resolve()} are the ones it was built from" in capsys.readouterr().out
    _same_size_same_mtime(root / "c1" / "4.png")
    assert main(args) == 1
    assert f"{root.resolve()}/c1/4.png: its bytes differ from those the entry was built from" in capsys.readouterr().err


def test_cache_verify_data_compares_a_part_of_the_folder_with_its_own_files_only(tmp_path, capsys):
    # An entry of a random_split part holds some of the folder's files: the others are not "added since".
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    part, _ = random_split(ImageFolder(str(root), transform=RECIPE), [5, 4], torch.Generator().manual_seed(0))
    gf.accelerate(part, cache=cache, **KW)
    args = ["cache", "--cache-dir", str(cache), "verify", "--data", str(root)]
    assert main(args) == 0
    assert f"its 5 files in {root.resolve()} are the ones it was built from" in capsys.readouterr().out
    _same_size_same_mtime(Path(part.dataset.samples[part.indices[0]][0]))  # one of the part's own files
    assert main(args) == 1
    assert "its bytes differ from those the entry was built from" in capsys.readouterr().err


def test_cache_verify_data_on_a_folder_no_entry_holds_says_so(tmp_path, capsys):
    assert main(["cache", "--cache-dir", str(tmp_path / "cache"), "verify", "--data", str(tmp_path)]) == 1
    assert "no cache entry under" in capsys.readouterr().err


def test_a_new_build_of_a_changed_folder_replaces_the_superseded_entry(tmp_path, capsys):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)
    (old,) = list_entries(cache)
    Image.new("RGB", (9, 9)).save(root / "c0" / "new.png")  # a file added: a new key
    loader = gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)
    assert list_entries(cache) == [Path(loader.plan.cache_path)] and not old.exists()
    assert f"removed the cache entry {old}" in capsys.readouterr().err
    # another pipeline of the same folder is another entry, kept
    other = T.Compose([T.RandomResizedCrop(8), T.PILToTensor()])
    gf.accelerate(ImageFolder(str(root), transform=other), cache=cache, batch_size=4, device="cpu", progress=False,
                  store="jpeg")  # fmt: skip
    assert len(list_entries(cache)) == 2


def test_two_parts_of_one_folder_keep_their_own_entries_and_a_changed_folder_still_supersedes(tmp_path, capsys):
    # random_split's train and validation parts share the folder's class, root and transform: neither is a newer
    # build of the other, so neither entry may remove the other's (each run would otherwise rebuild both).
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    train, val = random_split(ImageFolder(str(root), transform=RECIPE), [5, 4], torch.Generator().manual_seed(0))
    first = gf.accelerate(train, cache=cache, **KW).plan.cache_path
    second = gf.accelerate(val, cache=cache, **KW).plan.cache_path
    assert first != second and sorted(list_entries(cache)) == sorted([Path(first), Path(second)])
    assert "removed the cache entry" not in capsys.readouterr().err
    assert gf.accelerate(train, cache=cache, **KW).plan.ingest.startswith("cache hit")
    # the same part of a changed folder is a newer build of that part: it replaces that part's entry only
    old = Path(
        gf.accelerate(Subset(ImageFolder(str(root), transform=RECIPE), [0, 1, 2]), cache=cache, **KW).plan.cache_path
    )
    Image.new("RGB", (20, 16), "red").save(root / "c0" / "0.png")  # sample 0 of the folder: the part's key changes
    new = gf.accelerate(Subset(ImageFolder(str(root), transform=RECIPE), [0, 1, 2]), cache=cache, **KW).plan.cache_path
    assert sorted(list_entries(cache)) == sorted([Path(first), Path(second), Path(new)]) and not old.exists()


def test_an_entry_in_use_is_not_removed_and_goes_once_it_is_not(tmp_path, capsys):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    first = gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)  # alive: it maps the entry
    (old,) = list_entries(cache)
    assert in_use(old)
    Image.new("RGB", (9, 9)).save(root / "c0" / "new.png")
    gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)
    assert old.exists() and len(list_entries(cache)) == 2
    assert sum(len(y) for _, y in first) == 9  # still served from the old entry
    del first
    assert not in_use(old)
    Image.new("RGB", (9, 9)).save(root / "c0" / "new2.png")
    gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)
    assert not old.exists() and len(list_entries(cache)) == 1


_READER = textwrap.dedent("""
    import sys, time
    import gpufeed as gf
    cache = gf.open_cache(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
""")


def test_an_entry_another_process_reads_is_in_use_until_that_process_exits(tmp_path):
    ds = TensorDataset(torch.zeros(6, 3, 4, 4, dtype=torch.uint8), torch.arange(6))
    entry = gf.build_cache(ds, tmp_path / "entry", transform=T.RandomHorizontalFlip(), progress=False).path
    assert not in_use(entry)
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(entry)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert reader.stdout.readline().strip() == "ready"
        assert in_use(entry)
        assert enforce_limit(tmp_path, keep=tmp_path / "other", limit=0)[-1].startswith("gpufeed: the cache root")
        assert entry.exists()
    finally:
        reader.communicate("\n", timeout=60)
    assert not in_use(entry)


def _tensor_entries(root: Path, n: int, first: int = 0) -> list[Path]:
    paths = []
    for i in range(first, first + n):
        ds = TensorDataset(torch.full((64, 3, 16, 16), i, dtype=torch.uint8), torch.arange(64))
        paths.append(gf.build_cache(ds, root=root, transform=T.RandomHorizontalFlip(), progress=False).path)
    return paths


def test_the_cache_limit_removes_least_recently_used_entries_first_never_the_new_one(tmp_path, monkeypatch, capsys):
    root = tmp_path / "cache"
    a, b, c = _tensor_entries(root, 3)
    size = sum(f.stat().st_size for f in a.iterdir())
    for age, entry in zip((300, 100, 200), (a, b, c), strict=True):  # last use: a longest ago, then c, then b
        t = last_use(entry) - age
        os.utime(entry / "manifest.json", (t, t))
    monkeypatch.setenv("GPUFEED_CACHE_LIMIT", str(2 * size + size // 2))  # room for two entries
    (d,) = _tensor_entries(root, 1, first=3)
    assert sorted(list_entries(root)) == sorted([b, d]) and not a.exists() and not c.exists()
    err = capsys.readouterr().err
    assert err.count("removed the cache entry") == 2 and "least recently used" in err and "GPUFEED_CACHE_LIMIT" in err


def test_the_cache_limit_never_removes_what_gpufeed_did_not_write(tmp_path, capsys):
    (entry,) = _tensor_entries(tmp_path, 1)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"format": "someone-else", "size": 1}')
    (foreign / "data.bin").write_bytes(b"x" * 100_000)
    (tmp_path / "link").symlink_to(entry)
    before = snapshot(tmp_path)
    lines = enforce_limit(tmp_path, keep=entry, limit=0)  # over any limit: only gpufeed's own entries may go
    assert snapshot(tmp_path) == before and lines[-1].startswith("gpufeed: the cache root")


def test_opening_an_entry_records_its_last_use(tmp_path):
    (entry,) = _tensor_entries(tmp_path, 1)
    os.utime(entry / "manifest.json", (1_000_000, 1_000_000))
    verify_cache(entry)  # a check is not a use: GPUFEED_CACHE_LIMIT's order stays as it was
    assert main(["cache", "--cache-dir", str(tmp_path), "verify"]) == 0
    assert last_use(entry) == 1_000_000
    gf.open_cache(entry)
    assert last_use(entry) > 1_000_000


def test_an_entry_on_a_file_system_without_flock_opens_with_one_warning(tmp_path, monkeypatch):
    import errno
    import fcntl

    import gpufeed.cache.usage as usage

    (entry,) = _tensor_entries(tmp_path, 1)
    expected = gf.open_cache(entry).images.clone()

    def no_flock(f, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(usage, "_unmarked", set())
    with pytest.warns(UserWarning, match="cannot mark the cache entry .* in use .*no flock"):
        opened = gf.open_cache(entry)
    assert torch.equal(opened.images, expected)


@pytest.mark.parametrize(
    ("text", "size"), [("20G", 20 << 30), ("500M", 500 << 20), ("1.5T", 3 << 39), ("20GiB", 20 << 30), ("123", 123)]
)
def test_cache_limit_sizes_are_read_with_suffixes(text, size):
    assert parse_size(text) == size


def test_a_cache_limit_that_is_not_a_size_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_CACHE_LIMIT", "lots")
    ds = TensorDataset(torch.zeros(4, 3, 4, 4, dtype=torch.uint8), torch.arange(4))
    with pytest.raises(gf.ConfigError, match=r"GPUFEED_CACHE_LIMIT='lots' must be a size in bytes, e.g. 20G"):
        gf.build_cache(ds, root=tmp_path, transform=T.RandomHorizontalFlip(), progress=False)


def test_cache_info_shows_the_folder_each_entry_holds_its_kind_size_and_last_use(tmp_path, capsys):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, **KW)
    capsys.readouterr()
    assert main(["cache", "--cache-dir", str(cache), "info"]) == 0
    out = capsys.readouterr().out
    assert f"source: ImageFolder {root.resolve()}" in out
    assert "store: decoded pixels, each image its own size, 9 images" in out
    assert "last use 20" in out and "MiB" in out and "1 entries" in out
