"""The on-disk cache: atomic writes, every fault detected before a sample is served, keys that change."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import TensorDataset

from gpufeed import CacheError, ConfigError, build_cache, open_cache
from gpufeed.cache import default_cache_dir
from gpufeed.cache.format import MANIFEST
from gpufeed.read.fingerprint import cache_key, dataset_identity

from fakes import cifar_like


@pytest.fixture
def built(tmp_path):
    ds = cifar_like(40, transform=T.Compose([T.Resize(16), T.RandomCrop(16, padding=2), T.ToTensor()]))
    return ds, build_cache(ds, tmp_path / "entry", num_workers=0, progress=False)


def test_build_stores_the_cached_part_and_reopens_identically(built, tmp_path):
    ds, cache = built
    assert cache.images.shape == (40, 3, 16, 16) and cache.images.dtype == torch.uint8
    assert sorted(p.name for p in (tmp_path / "entry").iterdir()) == ["images.bin", "labels.bin", MANIFEST]
    again = open_cache(tmp_path / "entry")
    assert torch.equal(again.images, cache.images) and again.labels.tolist() == [i % 10 for i in range(40)]
    assert json.loads((tmp_path / "entry" / MANIFEST).read_text())["meta"]["cached"] == [repr(T.Resize(16))]


def test_rebuild_with_the_same_key_reuses_the_entry(built, tmp_path):
    ds, cache = built
    mtime = (tmp_path / "entry" / "images.bin").stat().st_mtime_ns
    assert build_cache(ds, tmp_path / "entry", progress=False).key == cache.key
    assert (tmp_path / "entry" / "images.bin").stat().st_mtime_ns == mtime


def _corrupt(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(data[:-1])
    elif how == "bitflip":
        data[len(data) // 2] ^= 0x10
        path.write_bytes(data)
    elif how == "zero tail":
        data[-100:] = bytes(100)
        path.write_bytes(data)
    elif how == "missing":
        path.unlink()


@pytest.mark.parametrize(
    "how, match",
    [("truncate", "truncated"), ("bitflip", "do not match"), ("zero tail", "do not match"), ("missing", "missing")],
)
def test_damaged_array_files_are_detected_with_file_and_remedy(built, tmp_path, how, match):
    _corrupt(tmp_path / "entry" / "images.bin", how)
    with pytest.raises(CacheError, match=match) as e:
        open_cache(tmp_path / "entry")
    assert "images.bin" in str(e.value) and "gpufeed cache clear" in str(e.value)


def test_a_file_swapped_in_from_another_cache_is_detected(built, tmp_path):
    other = build_cache(cifar_like(40, seed=1, transform=T.Resize(16)), tmp_path / "other", progress=False)
    assert other.images.shape == built[1].images.shape
    (tmp_path / "entry" / "images.bin").write_bytes((tmp_path / "other" / "images.bin").read_bytes())
    with pytest.raises(CacheError, match="images.bin.*do not match"):
        open_cache(tmp_path / "entry")


@pytest.mark.parametrize(
    "content, match",
    [
        ("", "not valid JSON"),
        ('{"format": "something-else"}', "not a gpufeed cache manifest"),
        ('{"format": "gpufeed-cache", "version": 99}', "format version 99"),
        ('{"format": "gpufeed-cache", "version": 1, "key": "k"}', "format version 1"),
        ('{"format": "gpufeed-cache", "version": 2, "key": "k"}', "does not match its own digest"),
        ("[1, 2]", "not a gpufeed cache"),
    ],
)
def test_empty_or_foreign_manifests_are_rejected(built, tmp_path, content, match):
    (tmp_path / "entry" / MANIFEST).write_text(content)
    with pytest.raises(CacheError, match=match):
        open_cache(tmp_path / "entry")


def test_a_directory_without_manifest_is_not_a_cache(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(CacheError, match="manifest.json is missing"):
        open_cache(tmp_path / "x")


def test_a_damaged_entry_is_rebuilt_with_a_warning(built, tmp_path):
    ds, cache = built
    expected = cache.images.clone()
    _corrupt(tmp_path / "entry" / "images.bin", "bitflip")
    with pytest.warns(UserWarning, match="rebuilding the cache"):
        rebuilt = build_cache(ds, tmp_path / "entry", progress=False)
    assert torch.equal(rebuilt.images, expected)


_KILL = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    import gpufeed.cache.writer as writer
    from fakes import cifar_like
    import torchvision.transforms as T
    from gpufeed import build_cache
    phase = {phase!r}
    writer._checkpoint = lambda p: os._exit(17) if p == phase else None
    build_cache(cifar_like(40, transform=T.Resize(16)), {target!r}, progress=False)
""")


@pytest.mark.parametrize("phase", ["wrote images.bin", "wrote labels.bin", "wrote manifest"])
def test_a_build_killed_between_phases_leaves_nothing_valid_and_the_next_build_succeeds(tmp_path, phase):
    from pathlib import Path

    target = tmp_path / "entry"
    script = _KILL.format(tests=str(Path(__file__).parent.parent), phase=phase, target=str(target))
    assert subprocess.run([sys.executable, "-c", script]).returncode == 17
    assert not target.exists()
    assert len(list(tmp_path.glob(".entry.building-*"))) == 1
    with pytest.raises(CacheError):
        open_cache(target)
    cache = build_cache(cifar_like(40, transform=T.Resize(16)), target, progress=False)
    assert cache.images.shape == (40, 3, 16, 16)
    assert list(tmp_path.glob(".entry.building-*")) == []  # the dead build's directory is cleaned up


def test_key_covers_source_transform_params_and_format(monkeypatch):
    ds = cifar_like(20)
    key = cache_key(ds, [T.Resize(16)])
    assert key == cache_key(cifar_like(20), [T.Resize(16)])
    assert key != cache_key(ds, [T.Resize(17)])
    assert key != cache_key(ds, [T.Resize(16, antialias=False)])
    assert key != cache_key(cifar_like(20, seed=1), [T.Resize(16)])
    changed = cifar_like(20)
    changed.data[3, 0, 0, 0] ^= 1
    assert key != cache_key(changed, [T.Resize(16)])
    monkeypatch.setattr("gpufeed.read.fingerprint.VERSION", 3)
    assert key != cache_key(ds, [T.Resize(16)])


def test_opaque_sources_and_transforms_have_no_key():
    class Custom(torch.utils.data.Dataset):
        def __len__(self):
            return 3

    assert dataset_identity(Custom()) is None
    assert cache_key(cifar_like(4), [T.Lambda(lambda x: x)]) is None
    with pytest.raises(ConfigError, match="cannot be fingerprinted"):
        build_cache(cifar_like(4, transform=T.Lambda(lambda x: x)), cache_lambda=True, progress=False)


def test_tensor_datasets_are_identified_by_content():
    a = TensorDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    b = TensorDataset(torch.ones(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    assert cache_key(a, []) != cache_key(b, []) and cache_key(a, []) is not None


def test_default_location_follows_xdg_and_can_be_overridden(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUFEED_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "gpufeed"
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_opened_cache_is_memory_mapped_and_never_writes_the_file(built, tmp_path):
    _, cache = built
    before = (tmp_path / "entry" / "images.bin").read_bytes()
    cache.images[0].fill_(7)  # copy-on-write mapping: the change stays in this process
    assert bool((cache.images[0] == 7).all()) and not bool((cache.images[1] == 7).all())
    assert (tmp_path / "entry" / "images.bin").read_bytes() == before
    assert open_cache(tmp_path / "entry").images[0].ne(7).any()  # a fresh mapping sees the built bytes


_BUILDER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import gpufeed.pipeline.build as cache_mod
    import gpufeed.cache.writer as writer
    from fakes import cifar_like
    import torchvision.transforms as T
    import gpufeed.read.samples as ingest_mod
    original = ingest_mod.ingest
    def counted(*a, **k):
        with open({log!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        time.sleep(0.5)  # a slow build, so the others arrive while it runs
        return original(*a, **k)
    ingest_mod.ingest = counted
    if {die!r}:
        writer._checkpoint = lambda p: os._exit(17) if p == "wrote images.bin" else None
    c = cache_mod.build_cache(cifar_like(40, transform=T.Resize(16)), {target!r}, progress=False)
    print(c.images.shape[0])
""")


def _builder(tmp_path, die=False):
    from pathlib import Path

    script = _BUILDER.format(
        tests=str(Path(__file__).parent.parent),
        log=str(tmp_path / "builds.log"),
        target=str(tmp_path / "entry"),
        die=die,
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_concurrent_builders_build_once_and_all_get_the_entry(tmp_path):
    procs = [_builder(tmp_path) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0] and outs == ["40", "40", "40"]
    assert len((tmp_path / "builds.log").read_text().split()) == 1  # one ingest for three processes


def test_a_builder_that_dies_does_not_block_the_next(tmp_path):
    dead = _builder(tmp_path, die=True)
    dead.wait(timeout=120)
    assert dead.returncode == 17
    alive = _builder(tmp_path)
    assert alive.communicate(timeout=120)[0].strip() == "40" and alive.returncode == 0
    assert len((tmp_path / "builds.log").read_text().split()) == 2


def test_datasets_read_by_their_own_code_or_loader_have_no_key(tmp_path):
    from torchvision.datasets import ImageFolder

    from fakes import image_folder

    folder = image_folder(tmp_path / "images", [(8, 8)] * 4)
    assert cache_key(folder, [T.Resize(4)]) is not None  # torchvision's own reading: files identify it
    gray = ImageFolder(str(tmp_path / "images"), loader=lambda p: __import__("PIL").Image.open(p).convert("L"))
    assert cache_key(gray, [T.Resize(4)]) is None  # another loader: the files no longer say what it yields

    class Mine(ImageFolder):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return image, int(label == 0)

    assert dataset_identity(Mine(str(tmp_path / "images"))) is None

    class Listed(torch.utils.data.Dataset):  # a custom dataset with a samples list, as many users write
        def __init__(self):
            self.samples = folder.samples

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            return folder[i]

    assert dataset_identity(Listed()) is None
