"""Names read from data stay inside their root: a crafted MDS ``index.json`` (a shard named ``../x``, an absolute
path, a symlink out, a NUL byte, a Windows path) is refused naming the index and the entry, before anything is
downloaded or read; nothing is written outside ``local``. The same for a conversion's parts, a cache manifest's
array files and a folder entry's recorded names (``gpufeed.inside``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import gpufeed as gf
from gpufeed.errors import CacheError, ConfigError, DataError
from gpufeed.inside import check_name, inside
from gpufeed.mds.shards import Shards

from .mds import payload, recipe, write_mds, write_photos
from .s3stub import S3Stub
from fakes import snapshot

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_mds(tmp_path_factory.mktemp("paths") / "mds", 40)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_photos(tmp_path_factory.mktemp("paths") / "photos", 24, size_limit=4096)


def _crafted(data: Path, out: Path, shard: int, name: str, key: str = "raw_data") -> Path:
    """A copy of ``data`` whose index lists ``name`` as shard ``shard``'s file (``key``: raw_data or zip_data)."""
    shutil.copytree(data, out)
    index = json.loads((out / "index.json").read_text())
    entry = index["shards"][shard]
    entry[key] = {**(entry.get(key) or {"bytes": 10, "hashes": {}}), "basename": name}
    (out / "index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize(
    "name, why",
    [
        ("../PWNED.mds", "climbs out with '..'"),
        ("a/../../PWNED.mds", "climbs out with '..'"),
        ("/tmp/PWNED.mds", "is an absolute path"),
        ("..\\..\\PWNED.mds", "is a Windows path"),
        ("C:PWNED.mds", "is a Windows path"),
        ("shard\x00.mds", "holds a NUL byte"),
        ("gpufeed.json", "is a file of the dataset, not a shard"),
        ("./index.json", "is a file of the dataset, not a shard"),  # the same file by another spelling
        (".//.gpufeed-claim", "is a file of the dataset, not a shard"),
        ("gpufeed-remote.json/", "is a file of the dataset, not a shard"),
        ("index.json/x.mds", "is a file of the dataset, not a shard"),
        ("", "names no file"),
        ("x" * 256 + ".mds", "has a part longer than a file name may be (255 bytes)"),  # was a network fault
    ],
)
def test_a_crafted_shard_name_downloads_nothing_anywhere_and_names_the_entry(photos, tmp_path, monkeypatch, name, why):
    # the outside trial: '../PWNED.mds' made gf.stream download a file into a sibling of local
    _crafted(photos, tmp_path / "bucket" / "mds", 1, name)
    (tmp_path / "bucket" / "PWNED.mds").write_bytes((photos / "shard.00001.mds").read_bytes())  # what it would fetch
    stub = S3Stub(tmp_path / "bucket")
    for k, v in stub.env.items():
        monkeypatch.setenv(k, v)
    local = tmp_path / "work" / "cache"
    local.parent.mkdir()
    before = snapshot(tmp_path)
    try:
        with pytest.raises(DataError) as refused:
            loader = gf.stream(f"{stub.url()}/mds", local, transform=recipe(), batch_size=4, device="cpu")
            list(loader)  # what the trial did: an epoch (its shard 1 fetched from where the index said)
    finally:
        stub.stop()
    text = str(refused.value)
    assert "index.json (shard 1, raw_data.basename) lists" in text and repr(name) in text and why in text
    assert "write the dataset again with gpufeed convert or streaming.MDSWriter" in text
    assert [key for _, key in stub.requests if key.endswith(".mds")] == []  # no shard was asked for
    after = snapshot(tmp_path)
    assert {p for p in after if not p.startswith("work/cache")} == set(before)  # nothing outside local
    assert not any(p.endswith(".mds") for p in after if p.startswith("work/cache"))


def test_a_crafted_zip_name_is_refused_as_the_shards_own(data, tmp_path):
    remote = _crafted(data, tmp_path / "remote", 2, "../z.mds.zstd", key="zip_data")
    with pytest.raises(DataError, match=r"\(shard 2, zip_data.basename\) lists '../z.mds.zstd', which climbs out"):
        Shards(tmp_path / "cache", str(remote))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "remote"]


def test_local_only_data_whose_index_names_a_file_outside_it_is_refused_not_read(data, tmp_path):
    # the outside trial: an absolute basename read a file outside the dataset
    outside = tmp_path / "elsewhere.mds"
    shutil.copyfile(data / "shard.00003.mds", outside)
    dataset = _crafted(data, tmp_path / "mds", 0, str(outside))
    with pytest.raises(DataError, match=rf"{dataset}/index.json \(shard 0, raw_data.basename\) lists '{outside}', wh"):
        Shards(dataset)
    with pytest.raises(DataError, match="is an absolute path"):
        gf.stream(local=dataset, transform=recipe(), batch_size=4, device="cpu")


def test_a_shard_that_is_a_symlink_out_of_the_dataset_is_refused_and_one_inside_it_is_read(data, tmp_path):
    dataset = shutil.copytree(data, tmp_path / "mds")
    outside = tmp_path / "outside"
    outside.mkdir()
    (dataset / "shard.00004.mds").rename(outside / "shard.00004.mds")
    (dataset / "shard.00004.mds").symlink_to(outside / "shard.00004.mds")
    with pytest.raises(DataError, match=rf"'shard.00004.mds', which resolves to {outside}/shard.00004.mds through a"):
        Shards(dataset)
    # a link that stays inside the dataset (a shard kept under another name) is the dataset's own business
    (dataset / "shard.00004.mds").unlink()
    (dataset / "kept").mkdir()
    shutil.move(outside / "shard.00004.mds", dataset / "kept" / "shard.00004.mds")
    (dataset / "shard.00004.mds").symlink_to(dataset / "kept" / "shard.00004.mds")
    with Shards(dataset) as shards:
        first = int(shards.index.starts[4])
        assert shards.read([first]).images == [payload(first)]
    # the dataset's folder itself reached through a link: its shards are inside it
    (tmp_path / "link").symlink_to(dataset)
    with Shards(tmp_path / "link") as shards:
        assert shards.read([first]).images == [payload(first)]


@pytest.mark.parametrize("kind", ["a directory", "a link loop"])
def test_a_shard_path_that_holds_no_file_is_a_data_error_naming_the_shard(data, tmp_path, kind):
    # a name that stays inside the dataset but is no file: it was a raw IsADirectoryError / OSError(ELOOP)
    dataset = shutil.copytree(data, tmp_path / "mds")
    shard = dataset / "shard.00002.mds"
    shard.unlink()
    if kind == "a directory":
        shard.mkdir()
    else:
        shard.symlink_to(shard)
    with Shards(dataset) as shards:
        first = int(shards.index.starts[2])
        shards.prepare(2)  # the prefetcher's read-ahead leaves it to the read
        with pytest.raises(DataError) as refused:
            shards.read([first])
        assert shards.read([0]).images == [payload(0)]  # the other shards are served
    text = str(refused.value)
    said = "it is a directory, not a file" if kind == "a directory" else "Too many levels of symbolic links"
    assert text.startswith(f"shard file {shard} (listed in {dataset}/index.json) cannot be read ({said}")
    assert text.endswith("the dataset is damaged: convert or copy it again")


def test_a_file_that_two_shards_list_is_refused_not_served_twice(data, tmp_path):
    # './shard.00000.mds' is shard 0's file: its samples were served as shard 1's too, and shard 1's never
    dataset = _crafted(data, tmp_path / "mds", 1, "./shard.00000.mds")
    with pytest.raises(DataError) as refused:
        Shards(dataset)
    text = str(refused.value)
    assert "(shard 1, raw_data.basename) lists './shard.00000.mds', which is the file shard 0's raw_data" in text
    assert "basename lists too (its samples would be served twice, the others never)" in text


def test_a_folder_of_a_remotes_local_that_links_out_is_never_downloaded_into(data, tmp_path):
    # a shard in a subfolder (as gpufeed convert's parts are), whose folder in local is a link out of it
    remote = shutil.copytree(data, tmp_path / "remote")
    (remote / "part.00000").mkdir()
    (remote / "shard.00001.mds").rename(remote / "part.00000" / "shard.00001.mds")
    index = json.loads((remote / "index.json").read_text())
    index["shards"][1]["raw_data"]["basename"] = "part.00000/shard.00001.mds"
    (remote / "index.json").write_text(json.dumps(index))
    with Shards(tmp_path / "good", str(remote)) as shards:  # the nested name itself is fine
        first = int(shards.index.starts[1])
        assert shards.read([first]).images == [payload(first)]
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "part.00000").symlink_to(outside)
    with pytest.raises(DataError, match=rf"'part.00000/shard.00001.mds', which resolves to {outside}/shard.00001.mds"):
        Shards(tmp_path / "cache", str(remote))
    assert list(outside.iterdir()) == []


def test_a_conversions_part_whose_index_climbs_out_is_refused_when_the_parts_are_joined(tmp_path):
    from PIL import Image

    from gpufeed.mds.convert import convert

    src = tmp_path / "src"
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (c * 100, i * 50, 0)).save(src / f"c{c}" / f"{i}.jpg")
    dst = tmp_path / "dst"
    convert(src, dst, samples_per_part=2, progress=False)
    (dst / "gpufeed.json").unlink()  # as if the run stopped before joining the parts
    part = json.loads((dst / "part.00001" / "index.json").read_text())
    part["shards"][0]["raw_data"]["basename"] = "../../PWNED.mds"  # nested: part.00001/../../PWNED.mds
    (dst / "part.00001" / "index.json").write_text(json.dumps(part))
    with pytest.raises(DataError, match=r"part.00001/index.json lists '../../PWNED.mds', which climbs out"):
        convert(src, dst, samples_per_part=2, progress=False)
    assert not (dst / "gpufeed.json").exists()


def test_a_cache_manifests_array_file_that_links_out_of_the_entry_is_refused(tmp_path):
    from gpufeed import build_cache, open_cache

    from fakes import cifar_like

    cache = build_cache(cifar_like(8), tmp_path / "entry", progress=False)
    secret = tmp_path / "secret.bin"
    shutil.copyfile(cache.path / "labels.bin", secret)  # same size and bytes: only the path check can tell
    (cache.path / "labels.bin").unlink()
    (cache.path / "labels.bin").symlink_to(secret)
    with pytest.raises(CacheError, match=r"manifest.json lists 'labels.bin', which resolves to .*secret.bin through"):
        open_cache(cache.path)


def test_the_check_refuses_every_way_out_and_keeps_names_inside():
    root = Path("/data/set")
    assert inside(root, "a/b.mds", listed_in="i") == root / "a" / "b.mds"
    assert inside(root, "a/./b.mds", listed_in="i", links=False) == root / "a" / "b.mds"
    for name in ("..", "a/..", "/", "./", "x/\\y", "D:\\x", "a\x00", 3, None, ["a"]):
        assert check_name(name) is not None, name
    with pytest.raises(CacheError, match=r"m.json lists '../x', which climbs out with '..': .* inside /data/set; fix"):
        inside(root, "../x", listed_in="m.json", error=CacheError, fix="fix")
    assert np.array_equal(np.array([check_name("shard.00000.mds")]), np.array([None]))
    assert check_name("é" * 125 + ".mds") is None and "(255 bytes)" in check_name("é" * 128)  # bytes, not characters
    with pytest.raises(DataError, match=r"m.json lists 'd/d/.*, which is 4,2\d\d bytes long below /data/set, longer"):
        inside(root, "d/" * 2100 + "s.mds", listed_in="m.json")


def test_a_folder_entrys_recorded_names_that_climb_out_of_the_folder_are_refused_not_read(tmp_path):
    # `gpufeed cache verify --data` re-reads each file an entry records, relative to the folder: a crafted name
    # would have it hash any file of the machine
    import torch

    from gpufeed.cache.content import compare_folder
    from gpufeed.cache.writer import write_cache

    folder = tmp_path / "photos"
    (folder / "cat").mkdir(parents=True)
    (folder / "cat" / "0.jpg").write_bytes(b"\xff\xd8\xff one")
    (tmp_path / "secret.txt").write_text("not the folder's\n")
    for name in ("../secret.txt", "/etc/hostname"):
        names = torch.frombuffer(bytearray(f"cat/0.jpg\0{name}".encode()), dtype=torch.uint8)
        arrays = {"labels": torch.zeros(2, dtype=torch.int64), "names": names, "digests": torch.zeros(2, 16).byte()}
        entry = tmp_path / f"entry-{len(name)}"
        write_cache(entry, "k", arrays, {"source": {"root": str(folder)}})
        with pytest.raises(CacheError, match=rf"names.bin lists '{name}', which (climbs out|is an absolute path)"):
            compare_folder(entry)


def test_a_remote_mark_in_local_that_is_a_link_or_damaged_is_refused_and_nothing_is_written_through_it(data, tmp_path):
    # local's gpufeed-remote.json planted as a link to another file: gpufeed wrote its record through it (the file
    # was overwritten); one that says nothing let any remote use local's cached index and shards
    local, victim = tmp_path / "cache", tmp_path / "notes.txt"
    local.mkdir()
    victim.write_text("precious\n")
    (local / "gpufeed-remote.json").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"gpufeed-remote.json does not say which remote local=.* caches"):
        Shards(local, str(data))
    assert victim.read_text() == "precious\n"
    (local / "gpufeed-remote.json").unlink()
    (local / "gpufeed-remote.json").write_text("")  # a write cut short (it was not atomic)
    with pytest.raises(ConfigError, match=r"delete .*gpufeed-remote.json and run again; else give this one another"):
        Shards(local, str(data))
    (local / "gpufeed-remote.json").unlink()
    with Shards(local, str(data)) as shards:
        assert shards.read([5]).images == [payload(5)]
    assert json.loads((local / "gpufeed-remote.json").read_text()) == {"remote": str(data)}
    assert not (local / "gpufeed-remote.json").is_symlink()
