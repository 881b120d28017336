"""``gpufeed convert``: image folders, Food101 and WebDataset tars to MDS shards, bytes untouched, resumable."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.errors import ConfigError, DataError
from gpufeed.mds.convert import convert

from .mds import parse_shards as _parse
from fakes import image_folder, snapshot

# find_spec, not importorskip: importing the engine takes seconds, paid by every worker that collects this file
pytestmark = pytest.mark.skipif(
    find_spec("streaming") is None, reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'"
)


# ---- data made here ----


def _jpeg(seed: int, size: tuple[int, int] = (20, 14)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (9, 11, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _mixed_folder(root: Path) -> Path:
    """An ImageFolder of 4 PNGs (fakes, in class0 and class1) and 6 JPEGs (class1 and zeta), written in the
    opposite order to their names (torchvision sorts classes, then files by name)."""
    image_folder(root, [(12, 10), (9, 14), (16, 16), (10, 10)])
    (root / "zeta").mkdir()
    for i in range(6):
        (root / ("class1" if i < 3 else "zeta") / f"j{5 - i}.jpg").write_bytes(_jpeg(i))
    return root


def _tar(path: Path, keys: list[str], labels: list[int | None], first_seed: int = 0, png_at: int = -1) -> None:
    """A WebDataset shard: ``__index__`` first, then per sample KEY.jpg (or .png), KEY.cls (unless None), KEY.json."""
    with tarfile.open(path, "w") as tf:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))

        add("__index__", b"metadata, not a sample")
        for i, (key, label) in enumerate(zip(keys, labels, strict=True)):
            if i == png_at:
                add(f"{key}.png", _png(first_seed + i))
            else:
                add(f"{key}.jpg", _jpeg(first_seed + i))
            if label is not None:
                add(f"{key}.cls", str(label).encode())
            add(f"{key}.json", json.dumps({"caption": f"sample {key}"}).encode())


def _tars(root: Path) -> Path:
    """Two shards, written in the opposite order to their names (read sorted by name): 5 + 4 samples."""
    root.mkdir(parents=True)
    _tar(root / "shard-001.tar", [f"b{i:03d}" for i in range(4)], [7, None, 2, 0], first_seed=50, png_at=2)
    _tar(root / "shard-000.tar", [f"a{i:03d}" for i in range(5)], [3, 1, 4, 1, 5], first_seed=0)
    return root


def _tar_expected(root: Path) -> list[tuple[str, int, bytes]]:
    out = []
    for tar in sorted(root.glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.name != "__index__"}
        for name in sorted({n.split(".")[0] for n in members}):
            image = members.get(f"{name}.jpg", members.get(f"{name}.png"))
            cls = members.get(f"{name}.cls")
            out.append((name, int(cls) if cls is not None else -1, image))
    return out


# ---- reading the result back, two ways ----


def _stream(dst: Path) -> list[dict]:
    """The samples as the engine serves them, in order."""
    from streaming import StreamingDataset

    ds = StreamingDataset(local=str(dst), remote=None, batch_size=4, num_canonical_nodes=1)
    return [{k: s[k] for k in ("image", "label", "key", "sha1", "sample_sha1")} for s in ds]


def _check_samples(dst: Path, expected: list[tuple[str, int, bytes]]) -> None:
    """Both readers give exactly ``expected`` (key, label, bytes), in order, each with its bytes' sha1 and the sha1
    of its bytes then its label (int64, little-endian: the digest that covers the label)."""
    want = [
        {"image": b, "label": y, "key": k, "sha1": hashlib.sha1(b).hexdigest(), "sample_sha1": _covering(b, y)}
        for k, y, b in expected
    ]
    assert _parse(dst) == want
    assert _stream(dst) == want


def _covering(image: bytes, label: int) -> str:
    return hashlib.sha1(image + label.to_bytes(8, "little", signed=True)).hexdigest()


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in [root, *root.rglob("*")]}


def _manifest(dst: Path) -> dict:
    return json.loads((dst / "gpufeed.json").read_text())


# ---- the tests ----


def test_an_image_folder_converts_byte_identical_in_imagefolder_order_and_src_is_untouched(tmp_path):
    from torchvision.datasets import ImageFolder

    src = _mixed_folder(tmp_path / "src")
    before, times = snapshot(src), _mtimes(src)
    result = convert(src, tmp_path / "dst", shard_size=600, samples_per_part=3, progress=False)

    samples = ImageFolder(str(src)).samples
    expected = [(Path(p).relative_to(src).as_posix(), y, Path(p).read_bytes()) for p, y in samples]
    assert [k for k, _, _ in expected][:4] == [
        "class0/0000.png",
        "class0/0002.png",
        "class1/0001.png",
        "class1/0003.png",
    ]
    _check_samples(tmp_path / "dst", expected)
    assert _manifest(tmp_path / "dst") == {
        "format": "gpufeed.mds/2",
        "classes": ["class0", "class1", "zeta"],
        "num_classes": 3,
        "source": str(src),
        "kind": "folder",
        "split": None,
        "samples": 10,
        "image_types": {"jpeg": 6, "png": 4},
        "skipped": [],
    }
    assert (result.samples, result.parts, result.reused_parts, result.finished) == (10, 4, 0, False)
    assert len(json.loads((tmp_path / "dst" / "index.json").read_text())["shards"]) > 4  # several shards per part
    assert snapshot(src) == before and _mtimes(src) == times


def test_webdataset_tars_convert_in_tar_order_with_cls_labels_keys_and_a_png(tmp_path):
    src = _tars(tmp_path / "wds")
    result = convert(src, tmp_path / "dst", shard_size=1 << 12, samples_per_part=3, progress=False)
    expected = _tar_expected(src)
    assert [(k, y) for k, y, _ in expected] == [
        ("a000", 3),
        ("a001", 1),
        ("a002", 4),
        ("a003", 1),
        ("a004", 5),
        ("b000", 7),
        ("b001", -1),
        ("b002", 2),
        ("b003", 0),
    ]
    _check_samples(tmp_path / "dst", expected)
    manifest = _manifest(tmp_path / "dst")
    assert (manifest["kind"], manifest["classes"], manifest["samples"]) == ("wds", None, 9)
    assert manifest["num_classes"] == 8  # numbered classes: the largest label written (7), plus one
    assert manifest["image_types"] == {"jpeg": 8, "png": 1}
    assert result.parts == 4  # 3 + 2 from the first tar, 3 + 1 from the second: a part never spans two tars

    one = convert(f"{src}/shard-001.*", tmp_path / "glob", progress=False)  # a glob picks tars by name
    assert one.samples == 4 and [s["key"] for s in _parse(tmp_path / "glob")] == ["b000", "b001", "b002", "b003"]


def test_food101_converts_the_split_in_torchvision_order(tmp_path):
    from torchvision.datasets import Food101

    root = tmp_path / "food-101"
    listed = {"tacos": ["tacos/3", "tacos/1"], "apple_pie": ["apple_pie/9", "apple_pie/2"]}  # not sorted, as Food101
    for seed, rel in enumerate(r for rels in listed.values() for r in rels):
        (root / "images" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "images" / f"{rel}.jpg").write_bytes(_jpeg(seed))
    (root / "meta").mkdir()
    (root / "meta" / "train.json").write_text(json.dumps(listed))
    (root / "meta" / "test.json").write_text(json.dumps({"apple_pie": ["apple_pie/2"], "tacos": []}))

    convert(root, tmp_path / "dst", progress=False)
    reference = Food101(str(tmp_path), split="train")
    expected = [
        (p.relative_to(root).as_posix(), y, p.read_bytes())
        for p, y in zip(reference._image_files, reference._labels, strict=True)
    ]
    assert [(k, y) for k, y, _ in expected] == [
        ("images/tacos/3.jpg", 1),
        ("images/tacos/1.jpg", 1),
        ("images/apple_pie/9.jpg", 0),
        ("images/apple_pie/2.jpg", 0),
    ]
    _check_samples(tmp_path / "dst", expected)
    manifest = _manifest(tmp_path / "dst")
    assert (manifest["kind"], manifest["split"], manifest["classes"]) == ("food101", "train", ["apple_pie", "tacos"])

    test = convert(root, tmp_path / "test", split="test", progress=False)
    assert (test.samples, [s["key"] for s in _parse(tmp_path / "test")]) == (1, ["images/apple_pie/2.jpg"])


# folder: 10 samples in parts of 3, stopped in the third part; tars: 5 + 4 samples, parts of 3, stopped in the
# second tar's second part, so the resume starts 3 samples into a tar
@pytest.mark.parametrize(("kind", "stop", "finished"), [("folder", "class1/j5.jpg", 2), ("wds", "b003", 3)])
def test_an_interruption_inside_the_writer_loop_resumes_to_the_uninterrupted_result(
    tmp_path, monkeypatch, kind, stop, finished
):
    import streaming

    src = _mixed_folder(tmp_path / "src") if kind == "folder" else _tars(tmp_path / "src")
    options = {"shard_size": 700, "samples_per_part": 3, "progress": False}
    convert(src, tmp_path / "whole", **options)
    real = streaming.MDSWriter.write

    def write(self, sample):
        if sample["key"] == stop:
            raise KeyboardInterrupt
        real(self, sample)

    monkeypatch.setattr(streaming.MDSWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "dst", **options)
    # the engine's writer was never finished for the interrupted part: no index of a partial dataset anywhere
    parts = [f"part.{i:05d}" for i in range(finished)]
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["gpufeed.convert.json", *parts]

    monkeypatch.setattr(streaming.MDSWriter, "write", real)
    result = convert(src, tmp_path / "dst", **options)
    assert (result.reused_parts, result.parts, result.samples) == (finished, 4, 10 if kind == "folder" else 9)
    assert snapshot(tmp_path / "dst") == snapshot(tmp_path / "whole")  # every file byte-identical


# The child writes 5 samples (two parts of 2 and one sample of the third: shard_size=300 flushes one shard per
# sample, so the third part's folder holds a shard), says so, and stalls there until it is killed.
_STALLING_CONVERT = """
import pathlib, sys, time
import streaming
from gpufeed.mds.convert import convert
real, written = streaming.MDSWriter.write, []
def write(self, sample):
    if len(written) == 5:
        pathlib.Path(sys.argv[3]).touch()
        time.sleep(600)
    written.append(sample["key"])
    real(self, sample)
streaming.MDSWriter.write = write
convert(sys.argv[1], sys.argv[2], shard_size=300, samples_per_part=2, progress=False)
"""


def test_a_tar_without_samples_between_two_does_not_break_the_resume(tmp_path, monkeypatch):
    import streaming

    src = _tars(tmp_path / "src")
    (src / "shard-001.tar").rename(src / "shard-002.tar")
    _tar(src / "shard-001.tar", [], [])  # only its __index__
    convert(src, tmp_path / "whole", samples_per_part=2, progress=False)
    real = streaming.MDSWriter.write

    def write(self, sample):
        if sample["key"] == "b003":  # the last part, after the empty tar's (absent) parts
            raise KeyboardInterrupt
        real(self, sample)

    monkeypatch.setattr(streaming.MDSWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "dst", samples_per_part=2, progress=False)
    monkeypatch.setattr(streaming.MDSWriter, "write", real)
    result = convert(src, tmp_path / "dst", samples_per_part=2, progress=False)
    assert (result.parts, result.reused_parts, result.samples) == (5, 4, 9)
    assert snapshot(tmp_path / "dst") == snapshot(tmp_path / "whole")


@pytest.mark.slow  # a child process that imports torch and the engine: ~10 s on 2 busy cores
def test_a_conversion_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path):
    src = _mixed_folder(tmp_path / "src")
    dst, stalled = tmp_path / "dst", tmp_path / "stalled"
    child = subprocess.Popen([sys.executable, "-c", _STALLING_CONVERT, str(src), str(dst), str(stalled)])
    try:
        convert(src, tmp_path / "whole", shard_size=300, samples_per_part=2, progress=False)  # while it starts
        deadline = time.monotonic() + 120
        while not stalled.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child ended or never got going"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    left = sorted(p.name for p in dst.iterdir())
    assert left == [".part.00002.partial", "gpufeed.convert.json", "part.00000", "part.00001"]
    assert [p.name for p in (dst / ".part.00002.partial").iterdir()] == ["shard.00000.mds"]  # a shard, no index
    result = convert(src, dst, shard_size=300, samples_per_part=2, progress=False)
    assert (result.reused_parts, result.parts, result.samples) == (2, 5, 10)
    assert snapshot(dst) == snapshot(tmp_path / "whole")


def test_a_dst_that_holds_something_else_is_refused_and_left_untouched(tmp_path):
    src = _mixed_folder(tmp_path / "src")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    before = snapshot(theirs)
    with pytest.raises(ConfigError, match=r"theirs holds files gpufeed did not write \(notes.txt\)"):
        convert(src, theirs, progress=False)
    assert snapshot(theirs) == before

    done = tmp_path / "done"
    convert(src, done, progress=False)
    other = _tars(tmp_path / "other")
    before = snapshot(done)
    with pytest.raises(ConfigError, match="holds the conversion of .*src .*not of .*other"):
        convert(other, done, progress=False)
    with pytest.raises(ConfigError, match="run the same command as before"):
        convert(src, done, shard_size=1 << 20, progress=False)
    with pytest.raises(ConfigError, match="is inside src"):
        convert(src, src / "mds", progress=False)
    for given in (f"{other}/*.tar", other / "shard-000.tar"):  # a glob or one tar: their folder is the dataset's
        with pytest.raises(ConfigError, match="is inside src"):
            convert(given, other / "mds", progress=False)
    assert snapshot(done) == before and not (src / "mds").exists() and not (other / "mds").exists()
    assert convert(src, done, progress=False).finished  # the same conversion again: nothing to do

    (src / "class0" / "new.png").write_bytes(_png(9))  # the source changed since
    with pytest.raises(ConfigError, match="before its files changed"):
        convert(src, done, progress=False)


def test_a_file_that_is_not_an_image_stops_the_conversion_unless_skip_bad(tmp_path):
    src = _mixed_folder(tmp_path / "src")
    bad = src / "class1" / "j9.jpg"  # sorts last in class1
    bad.write_bytes(b"this is not a JPEG at all")
    with pytest.raises(DataError, match=rf"{bad}: cannot be read as an image(.|\n)*--skip-bad"):
        convert(src, tmp_path / "dst", samples_per_part=3, progress=False)
    assert not (tmp_path / "dst" / "gpufeed.json").exists()

    result = convert(src, tmp_path / "dst", samples_per_part=3, skip_bad=True, progress=False)  # resumes
    assert (result.samples, result.reused_parts) == (10, 2)  # the bad file was in the third part
    manifest = _manifest(tmp_path / "dst")
    assert [s["key"] for s in manifest["skipped"]] == ["class1/j9.jpg"] and str(bad) in manifest["skipped"][0]["why"]
    keys = [s["key"] for s in _parse(tmp_path / "dst")]
    assert len(keys) == 10 and "class1/j9.jpg" not in keys and keys[6:8] == ["class1/j5.jpg", "zeta/j0.jpg"]


def test_a_tar_sample_without_an_image_or_with_a_bad_cls_is_named(tmp_path):
    src = tmp_path / "wds"
    src.mkdir()
    _tar(src / "s.tar", ["k0", "k1"], [1, 2])
    with tarfile.open(src / "s.tar", "a") as tf:
        for name, data in [("k2.txt", b"caption only"), ("k3.jpg", _jpeg(3)), ("k3.cls", b"cat")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=r"s.tar:k2: no image \(fields txt"):
        convert(src, tmp_path / "dst", progress=False)
    result = convert(src, tmp_path / "dst", skip_bad=True, progress=False)
    assert result.samples == 2 and [s["key"] for s in result.skipped] == ["k2", "k3"]
    assert "holds b'cat', not a class index" in result.skipped[1]["why"]


def test_wds_keys_split_at_the_first_dot_of_the_base_name_and_a_repeated_field_is_an_error(tmp_path):
    from gpufeed.mds import wds

    tar = tmp_path / "t.tar"
    with tarfile.open(tar, "w") as tf:
        for name in ["__meta__", "dir/a.b.seg.png", "dir/a.b.JPG", "c.jpg", "c.jpg"]:
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    found = wds.samples(tar)
    first = next(found)
    assert (first.key, sorted(first.fields), wds.image_field(first)) == ("dir/a", ["b.jpg", "b.seg.png"], None)
    with pytest.raises(DataError, match="member c.jpg repeats the field 'jpg'"):
        next(found)
    tar.write_bytes(tar.read_bytes()[:700])  # truncated inside a member
    with pytest.raises(DataError, match="cannot be read as a tar"):
        list(wds.samples(tar))


def test_a_src_that_is_no_dataset_is_refused_naming_the_fix(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    splits = tmp_path / "splits"
    for name in ("train", "val"):
        image_folder(splits / name, [(8, 8), (8, 8)])
    both = _tars(tmp_path / "both")
    (both / "class0").mkdir()
    cases = [
        (tmp_path / "missing", None, "no such folder or tar"),
        (tmp_path / "notes.txt", None, "is a file but not a WebDataset tar"),
        (f"{tmp_path}/*.tar", None, "the pattern matches no"),
        (splits, None, r"holds the splits train, val, not classes: convert each split on its own"),
        (both, None, r"holds both tars \(shard-000.tar, ...\) and folders \(class0, ...\)"),
        (both / "shard-000.tar", "test", "split='test' applies to a Food101 folder"),
    ]
    for src, split, message in cases:
        with pytest.raises(ConfigError, match=message):
            convert(src, tmp_path / "dst", split=split, progress=False)
    assert not (tmp_path / "dst").exists()


def test_the_cli_converts_and_says_what_it_wrote(tmp_path, capsys):
    from gpufeed.cli.main import main

    src = _mixed_folder(tmp_path / "src")
    assert main(["convert", str(src), str(tmp_path / "dst"), "--quiet", "--shard-size", "1K"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"converted {src} (image folder, 3 classes) -> {tmp_path / 'dst'}: 10 samples (jpeg 6, png 4) in 1 parts"
    )
    assert json.loads((tmp_path / "dst" / "index.json").read_text())["shards"][0]["size_limit"] == 1024
    assert main(["convert", str(src), str(tmp_path / "dst"), "--quiet", "--shard-size", "1K"]) == 0
    assert "already holds the conversion" in capsys.readouterr().out

    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"gpufeed convert: ConfigError: src='{tmp_path / 'missing'}': no such folder or tar" in err
    assert not (tmp_path / "out").exists()


def test_a_dst_under_a_symlink_loop_or_a_file_is_a_message_and_exit_2_without_a_traceback(tmp_path, capsys):
    # the outside trial: `gpufeed convert SRC LOOP/out` printed pathlib's RuntimeError traceback
    from gpufeed.cli.main import main

    src = Path(image_folder(tmp_path / "src", [(8, 8), (8, 8)]).root)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "file").write_text("notes\n")
    before = snapshot(tmp_path)
    cases = [
        (tmp_path / "loop" / "out", f"ConfigError: dst='{tmp_path / 'loop' / 'out'}' cannot be resolved"),
        (tmp_path / "a", f"ConfigError: dst='{tmp_path / 'a'}' cannot be resolved"),
        (tmp_path / "file" / "out", f"CacheWriteError: {tmp_path / 'file' / 'out'}: cannot be created"),
    ]
    for dst, said in cases:
        assert main(["convert", str(src), str(dst), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"gpufeed convert: {said}" in err and "Traceback" not in err, err
        assert "give a folder" in err or "choose a writable DST" in err
    assert snapshot(tmp_path) == before
