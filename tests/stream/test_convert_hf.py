"""``gpufeed convert`` of a Hugging Face dataset on disk (a ``save_to_disk`` folder, Parquet files) to MDS shards:
the encoded bytes untouched, the rows' order, labels and class names kept, the dataset only read."""

from __future__ import annotations

import hashlib
import io
import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from gpufeed.errors import ConfigError, DataError
from gpufeed.mds.convert import convert

from .mds import parse_shards as _parse
from fakes import snapshot

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.skipif(
    find_spec("streaming") is None, reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'"
)

NAMES = ["cat", "dog", "fox"]
FEATURES = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})


def _encoded(seed: int, fmt: str, exif_orientation: int | None = None) -> bytes:
    """A small image, each seed its own size (14-21 x 10-13) and pixels."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (10 + seed % 4, 14 + seed % 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    im = Image.fromarray(pixels)
    if exif_orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        im.save(out, fmt, exif=exif)
    else:
        im.save(out, fmt)
    return out.getvalue()


def _images(n: int) -> list[bytes]:
    """``n`` images, every third a PNG, the rest JPEGs."""
    return [_encoded(i, "PNG" if i % 3 == 2 else "JPEG") for i in range(n)]


def _dataset(images: list[bytes], labels: list[int] | None = None) -> datasets.Dataset:
    labels = labels if labels is not None else [i % len(NAMES) for i in range(len(images))]
    rows = {"image": [{"bytes": b, "path": None} for b in images], "label": labels}
    return datasets.Dataset.from_dict(rows, features=FEATURES)


def _expected(images: list[bytes], labels: list[int]) -> list[dict]:
    width = len(str(len(images) - 1))
    return [
        {
            "image": b,
            "label": y,
            "key": f"{i:0{width}d}",
            "sha1": hashlib.sha1(b).hexdigest(),
            "sample_sha1": hashlib.sha1(b + y.to_bytes(8, "little", signed=True)).hexdigest(),
        }
        for i, (b, y) in enumerate(zip(images, labels, strict=True))
    ]


def _manifest(dst: Path) -> dict:
    return json.loads((dst / "gpufeed.json").read_text())


EVAL = T.Compose([T.Resize(12), T.CenterCrop(8), T.PILToTensor()])


def test_a_saved_dataset_converts_byte_identical_in_row_order_with_its_class_names(tmp_path):
    import gpufeed as gf

    images = _images(7)
    labels = [2, 0, 1, 1, 0, 2, 0]
    _dataset(images, labels).save_to_disk(str(tmp_path / "saved"))
    before = snapshot(tmp_path / "saved")
    result = convert(tmp_path / "saved", tmp_path / "dst", samples_per_part=3, shard_size=800, progress=False)

    assert _parse(tmp_path / "dst") == _expected(images, labels)
    assert _manifest(tmp_path / "dst") == {
        "format": "gpufeed.mds/2",
        "classes": NAMES,
        "num_classes": len(NAMES),
        "source": str(tmp_path / "saved"),
        "kind": "hf",
        "split": None,
        "samples": 7,
        "image_types": {"jpeg": 5, "png": 2},
        "skipped": [],
    }
    assert (result.samples, result.parts, result.classes) == (7, 3, tuple(NAMES))
    assert snapshot(tmp_path / "saved") == before  # read only: no cache file, no lock beside the data

    # read back by gf.stream: the labels in row order, each image's pixels as PIL decodes its bytes
    with gf.stream(local=str(tmp_path / "dst"), transform=EVAL, batch_size=4, shuffle=False, drop_last=False,
                   device="cpu") as loader:  # fmt: skip
        served = list(loader)
        assert loader.shards.classes == NAMES
    assert torch.cat([y for _, y in served]).tolist() == labels
    x = torch.cat([x for x, _ in served])
    for i, raw in enumerate(images):
        with Image.open(io.BytesIO(raw)) as im:
            assert torch.equal(x[i], EVAL(im.convert("RGB"))), f"row {i}"


def test_a_shuffled_selection_is_read_through_its_indices_in_the_views_order(tmp_path):
    from gpufeed.mds import hf

    images = _images(9)
    view = _dataset(images).shuffle(seed=4).select([5, 0, 7, 2, 8])
    order = view._indices.column(0).to_pylist()
    assert order != sorted(order)  # a real mapping, not the identity
    items = list(hf.saved_rows(view, "image", "label", 2, 1, "view"))  # from row 2 on, as a resume reads it
    assert [(it.key, it.data, it.label) for it in items] == [
        (str(i), images[r], r % 3) for i, r in list(enumerate(order))[2:]
    ]
    assert items[0].where == "view row 2"

    view.save_to_disk(str(tmp_path / "view"))  # save_to_disk writes the view's rows in its order
    convert(tmp_path / "view", tmp_path / "dst", progress=False)
    assert _parse(tmp_path / "dst") == _expected([images[r] for r in order], [r % 3 for r in order])


def test_a_datasetdict_converts_the_split_asked_train_by_default(tmp_path):
    images = _images(6)
    train, test = _dataset(images[:4]), _dataset(images[4:], [2, 1])
    datasets.DatasetDict(train=train, test=test).save_to_disk(str(tmp_path / "dd"))
    assert convert(tmp_path / "dd", tmp_path / "train", progress=False).split == "train"
    assert _parse(tmp_path / "train") == _expected(images[:4], [0, 1, 2, 0])
    result = convert(tmp_path / "dd", tmp_path / "test", split="test", progress=False)
    assert (result.split, result.samples, _manifest(tmp_path / "test")["split"]) == ("test", 2, "test")
    assert _parse(tmp_path / "test") == _expected(images[4:], [2, 1])
    with pytest.raises(ConfigError, match=r"split='validation': .* has the splits \['train', 'test'\]; pass one"):
        convert(tmp_path / "dd", tmp_path / "x", split="validation", progress=False)

    datasets.DatasetDict(a=train, b=test).save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(ConfigError, match=r"none is named train: .* has the splits \['a', 'b'\]; pass one"):
        convert(tmp_path / "ab", tmp_path / "x", progress=False)
    train.save_to_disk(str(tmp_path / "one"))
    with pytest.raises(ConfigError, match="split='test': .* is one dataset, not a DatasetDict"):
        convert(tmp_path / "one", tmp_path / "x", split="test", progress=False)
    assert not (tmp_path / "x").exists()


def test_parquet_files_convert_as_one_dataset_and_an_interruption_resumes_mid_file(tmp_path, monkeypatch):
    import streaming

    images = _images(10)
    ds = _dataset(images)
    (tmp_path / "pq").mkdir()
    ds.select(range(6, 10)).to_parquet(str(tmp_path / "pq" / "part-1.parquet"), batch_size=2)  # row groups of 2
    ds.select(range(6)).to_parquet(str(tmp_path / "pq" / "part-0.parquet"), batch_size=2)
    before = snapshot(tmp_path / "pq")
    options = {"samples_per_part": 3, "shard_size": 900, "progress": False}
    whole = convert(tmp_path / "pq", tmp_path / "whole", **options)
    expected = _expected(images, [i % 3 for i in range(10)])
    assert _parse(tmp_path / "whole") == expected  # the files in name order, keys counted over both
    assert (whole.kind, whole.classes, whole.parts) == ("parquet", tuple(NAMES), 4)  # 3 + 3 | 3 + 1

    real = streaming.MDSWriter.write

    def write(self, sample):
        if sample["key"] == "9":  # the second file's second part: the resume starts 3 rows in, inside a row group
            raise KeyboardInterrupt
        real(self, sample)

    monkeypatch.setattr(streaming.MDSWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        convert(tmp_path / "pq", tmp_path / "dst", **options)
    monkeypatch.setattr(streaming.MDSWriter, "write", real)
    result = convert(tmp_path / "pq", tmp_path / "dst", **options)
    assert (result.reused_parts, result.parts, result.samples) == (3, 4, 10)
    assert snapshot(tmp_path / "dst") == snapshot(tmp_path / "whole")

    one = convert(f"{tmp_path}/pq/part-1.*", tmp_path / "glob", progress=False)  # a glob picks files by name
    assert [s["key"] for s in _parse(tmp_path / "glob")] == ["0", "1", "2", "3"] and one.samples == 4
    assert _parse(tmp_path / "glob")[0]["image"] == images[6]
    assert snapshot(tmp_path / "pq") == before


def test_parquet_without_huggingface_metadata_reads_a_binary_or_struct_column_named_by_image_key(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = _images(4)
    struct = pa.array([{"bytes": b, "path": f"x/{i}.jpg"} for i, b in enumerate(images)])
    table = pa.table({"jpg": pa.array(images, pa.binary()), "pic": struct, "cls": [7, 3, 0, 3], "txt": list("dbcb"),
                      "score": [0.5, 1.0, 2.0, 0.0]})  # fmt: skip
    (tmp_path / "raw").mkdir()
    pq.write_table(table, tmp_path / "raw" / "data.parquet")
    with pytest.raises(ConfigError, match=r"no Image column; its columns: jpg \(Value\), pic \(dict\).*--image-key"):
        convert(tmp_path / "raw", tmp_path / "x", progress=False)
    with pytest.raises(ConfigError, match=r"label_key='score' is float values; gpufeed reads one class per image"):
        convert(tmp_path / "raw", tmp_path / "x", image_key="jpg", label_key="score", progress=False)
    named = convert(tmp_path / "raw", tmp_path / "txt", image_key="jpg", label_key="txt", progress=False)
    assert named.classes == ("b", "c", "d") and _manifest(tmp_path / "txt")["classes"] == ["b", "c", "d"]
    assert _parse(tmp_path / "txt") == _expected(images, [2, 0, 1, 0])  # class names numbered in sorted order

    for key in ("jpg", "pic"):
        result = convert(tmp_path / "raw", tmp_path / key, image_key=key, label_key="cls", progress=False)
        assert result.classes is None and _manifest(tmp_path / key)["classes"] is None  # integers, no names
        assert _parse(tmp_path / key) == _expected(images, [7, 3, 0, 3])
    result = convert(tmp_path / "raw", tmp_path / "alone", image_key="jpg", label_key=None, progress=False)
    assert [s["label"] for s in _parse(tmp_path / "alone")] == [-1] * 4  # no labels: -1, the format's "none"


def test_images_given_by_path_are_read_from_their_files(tmp_path):
    import pyarrow.parquet as pq

    images = _images(3)
    (tmp_path / "files").mkdir()
    rows = []
    for i, raw in enumerate(images):
        (tmp_path / "files" / f"{i}.img").write_bytes(raw)
        rows.append({"bytes": None, "path": str(tmp_path / "files" / f"{i}.img")})
    rows.append({"bytes": None, "path": str(tmp_path / "files" / "gone.jpg")})
    ds = datasets.Dataset.from_dict({"image": rows, "label": [0, 1, 2, 1]}, features=FEATURES)
    # save_to_disk and to_parquet embed the files' bytes; a Parquet file written by pyarrow keeps the paths alone
    (tmp_path / "pq").mkdir()
    pq.write_table(ds.data.table, tmp_path / "pq" / "paths.parquet")
    with pytest.raises(DataError, match=r"gone.jpg: cannot be read \(No such file"):
        convert(tmp_path / "pq", tmp_path / "dst", progress=False)
    result = convert(tmp_path / "pq", tmp_path / "dst", skip_bad=True, progress=False)
    assert _parse(tmp_path / "dst") == _expected(images, [0, 1, 2])
    assert [s["key"] for s in result.skipped] == ["3"] and result.classes == tuple(NAMES)


def test_a_corrupt_row_stops_the_conversion_unless_skip_bad(tmp_path):
    images = _images(5)
    images[2] = b"\xff\xd8\xff not a JPEG after all"
    _dataset(images).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"saved row 2: cannot be read as an image(.|\n)*--skip-bad"):
        convert(tmp_path / "saved", tmp_path / "dst", samples_per_part=2, progress=False)
    result = convert(tmp_path / "saved", tmp_path / "dst", samples_per_part=2, skip_bad=True, progress=False)
    assert (result.samples, result.reused_parts, [s["key"] for s in result.skipped]) == (4, 1, ["2"])
    assert [s["key"] for s in _parse(tmp_path / "dst")] == ["0", "1", "3", "4"]


def test_null_image_rows_are_named_or_left_out_and_every_other_row_keeps_its_bytes_and_label(tmp_path):
    nulls = [0, 3, 4, 6]  # the first row, a run, the last row
    images = _images(7)
    rows = [None if i in nulls else {"bytes": b, "path": None} for i, b in enumerate(images)]
    ds = datasets.Dataset.from_dict({"image": rows, "label": [i % 3 for i in range(7)]}, features=FEATURES)
    ds.save_to_disk(str(tmp_path / "data" / "saved"))
    ds.to_parquet(str(tmp_path / "data" / "rows.parquet"), batch_size=3)  # the nulls in row groups of their own
    for src in (tmp_path / "data" / "saved", tmp_path / "data" / "rows.parquet"):
        dst = tmp_path / f"mds-{src.stem}"
        with pytest.raises(DataError, match=rf"row {nulls[0]}: no image"):
            convert(src, dst, samples_per_part=2, progress=False)
        result = convert(src, dst, samples_per_part=2, skip_bad=True, progress=False)
        assert [s["key"] for s in result.skipped] == [str(i) for i in nulls]
        kept = [i for i in range(7) if i not in nulls]
        got = _parse(dst)
        assert [(s["key"], s["image"], s["label"]) for s in got] == [(str(i), images[i], i % 3) for i in kept]


def test_a_missing_column_is_named_with_the_columns_there_are(tmp_path):
    _dataset(_images(2)).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ConfigError, match=r"image_key='img' is not a column.*image \(Image\), label \(ClassLabel\)"):
        convert(tmp_path / "saved", tmp_path / "x", image_key="img", progress=False)
    with pytest.raises(ConfigError, match=r"label_key='y' is not a column.*--label-key NAME"):
        convert(tmp_path / "saved", tmp_path / "x", label_key="y", progress=False)
    (tmp_path / "folder" / "cat").mkdir(parents=True)
    (tmp_path / "folder" / "cat" / "a.jpg").write_bytes(_images(1)[0])
    with pytest.raises(ConfigError, match="name the columns of a Hugging Face dataset.*not one: drop them"):
        convert(tmp_path / "folder", tmp_path / "x", label_key="label", progress=False)
    assert not (tmp_path / "x").exists()


def test_an_exif_rotated_jpeg_is_copied_as_stored_and_served_unrotated_unlike_datasets_decode(tmp_path):
    """MDS keeps the file; gf.stream decodes as ImageFolder's loader does (no EXIF turn), while ``datasets``
    (3 and later) turns the image upright: a 14x10 file of orientation 6 is 10 wide in ``ds[0]``."""
    import gpufeed as gf

    raw = _encoded(0, "JPEG", exif_orientation=6)  # 14 wide, 10 high as stored
    ds = _dataset([raw, _encoded(1, "JPEG")])  # (the engine needs more samples than its canonical nodes)
    ds.save_to_disk(str(tmp_path / "saved"))
    convert(tmp_path / "saved", tmp_path / "dst", progress=False)
    assert _parse(tmp_path / "dst")[0]["image"] == raw
    square = T.Compose([T.Resize(10), T.CenterCrop(10), T.PILToTensor()])
    with gf.stream(local=str(tmp_path / "dst"), transform=square, batch_size=2, shuffle=False, drop_last=False,
                   device="cpu") as loader:  # fmt: skip
        x, _ = next(iter(loader))
    with Image.open(io.BytesIO(raw)) as im:
        assert im.size == (14, 10) and torch.equal(x[0], square(im.convert("RGB")))  # as stored
    if int(datasets.__version__.split(".")[0]) >= 3:
        upright = ds[0]["image"]
        assert upright.size == (10, 14) and not torch.equal(x[0], square(upright.convert("RGB")))


def test_the_cli_converts_a_split_with_the_columns_named(tmp_path, capsys):
    from gpufeed.cli.main import main

    images = _images(4)
    datasets.DatasetDict(train=_dataset(images[:3]), validation=_dataset(images[3:])).save_to_disk(str(tmp_path / "dd"))
    assert main(["convert", str(tmp_path / "dd"), str(tmp_path / "val"), "--split", "validation", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"converted {tmp_path / 'dd'} (Hugging Face dataset, split validation, 3 classes) -> {tmp_path / 'val'}: "
        "1 samples (jpeg 1)"
    )
    assert main(["convert", str(tmp_path / "dd"), str(tmp_path / "none"), "--label-key", "none", "--quiet"]) == 0
    assert [s["label"] for s in _parse(tmp_path / "none")] == [-1, -1, -1]
    assert _manifest(tmp_path / "none")["classes"] is None
    assert main(["convert", str(tmp_path / "dd"), str(tmp_path / "x"), "--image-key", "img", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "image_key='img' is not a column" in err and "--image-key" in err


def test_a_hub_repository_converts_the_split_load_dataset_gives_and_its_config_by_name(tmp_path, capsys):
    from gpufeed.cli.main import main

    images = _images(14)
    repo = tmp_path / "repo"
    card = "---\nconfigs:\n"
    for c, (a, b) in (("small", (0, 6)), ("large", (6, 14))):  # each config: train shards and a test shard
        card += f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n  - split: test\n"
        card += f"    path: {c}/test-*\n"
        (repo / c).mkdir(parents=True)
        ds = _dataset(images[a:b], [i % 3 for i in range(a, b)])
        ds.select(range(2)).to_parquet(str(repo / c / "train-00000-of-00002.parquet"))
        ds.select(range(2, b - a - 2)).to_parquet(str(repo / c / "train-00001-of-00002.parquet"))
        ds.select(range(b - a - 2, b - a)).to_parquet(str(repo / c / "test-00000-of-00001.parquet"))
    (repo / "README.md").write_text(card + "---\n# two configs\n")
    before = snapshot(repo)
    with pytest.raises(ConfigError, match=r"configs \['small', 'large'\], none marked default: pick one with --config"):
        convert(repo, tmp_path / "x", progress=False)
    for split in ("train", "test"):
        want = datasets.load_dataset(str(repo), "large", split=split, cache_dir=str(tmp_path / "hf"))
        result = convert(repo, tmp_path / split, config="large", split=None if split == "train" else split,
                         progress=False)  # fmt: skip
        assert (result.kind, result.split, result.classes, result.samples) == (
            "parquet",
            split,
            tuple(NAMES),
            len(want),
        )
        raw = want.cast_column("image", datasets.Image(decode=False))
        assert [(s["image"], s["label"]) for s in _parse(tmp_path / split)] == [
            (r["image"]["bytes"], r["label"]) for r in raw
        ]
    assert main(["convert", str(repo / "small"), str(tmp_path / "small"), "--quiet"]) == 0  # a config's folder
    assert f"converted {repo / 'small'} (Parquet files, split train, 3 classes)" in capsys.readouterr().out
    assert _manifest(tmp_path / "small")["samples"] == 4
    assert main(["convert", str(repo), str(tmp_path / "cli"), "--config", "small", "--split", "test", "--quiet"]) == 0
    assert [s["image"] for s in _parse(tmp_path / "cli")] == images[4:6]
    assert snapshot(repo) == before


def test_the_readme_names_the_python_convert_that_exists_with_its_arguments():
    import inspect
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "gpufeed.convert(" not in readme  # there is no such function: gpufeed's public names are DESIGN.md's
    said = re.search(r"`from gpufeed\.mds\.convert import convert`, `convert\(src, dst, ([^`]*)\)`", readme)
    assert said is not None
    named = re.findall(r"(\w+)=", said.group(1))
    assert named == ["split", "image_key", "label_key"]
    assert set(named) <= set(inspect.signature(convert).parameters)


def test_a_row_without_a_label_in_a_label_column_is_named_not_written_as_unlabelled(tmp_path):
    images = _images(5)
    ints = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    for name, labels, features, shown in (
        ("null", [0, 1, None, 2, 0], ints, "None"),
        ("missing", [0, 1, -1, 2, 0], FEATURES, "-1, a ClassLabel's missing value"),  # a ClassLabel's missing value
    ):
        rows = {"image": [{"bytes": b, "path": None} for b in images], "label": labels}
        src = tmp_path / name
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(src))
        with pytest.raises(DataError, match=rf"{name} row 2: no label \({shown} in 'label'\)(.|\n)*--skip-bad"):
            convert(src, tmp_path / f"{name}-mds", samples_per_part=2, progress=False)  # -1 would fail mid-training
        result = convert(src, tmp_path / f"{name}-mds", samples_per_part=2, skip_bad=True, progress=False)
        assert [s["key"] for s in result.skipped] == ["2"]
        assert [s["label"] for s in _parse(tmp_path / f"{name}-mds")] == [0, 1, 2, 0]


def test_a_hub_repositorys_class_names_convert_by_its_cards_class_label_and_a_label_it_lacks_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = _images(4)
    card = "---\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  - name: label\n    dtype:\n"
    card += "      class_label:\n        names:\n" + "".join(f"          '{i}': {n}\n" for i, n in enumerate(NAMES))
    for name, labels in (("names", ["fox", "cat", "dog", "fox"]), ("unknown", ["fox", "cat", "bird", "dog"]),
                         ("beyond", [2, 0, 7, 1])):  # fmt: skip
        repo = tmp_path / name
        (repo / "data").mkdir(parents=True)
        (repo / "README.md").write_text(card + "---\n")
        rows = pa.table({"image": pa.array([{"bytes": b, "path": None} for b in images]), "label": pa.array(labels)})
        pq.write_table(rows, repo / "data" / "train-00000-of-00001.parquet")  # as another tool writes them
    result = convert(tmp_path / "names", tmp_path / "names-mds", progress=False)
    want = datasets.load_dataset(str(tmp_path / "names"), split="train", cache_dir=str(tmp_path / "hf"))
    assert result.classes == tuple(NAMES) and [s["label"] for s in _parse(tmp_path / "names-mds")] == want["label"]
    for name, said in (("unknown", "label 'bird' in 'label' is not a class"), ("beyond", "label 7 in 'label' is not")):
        with pytest.raises(DataError, match=rf"train-00000-of-00001.parquet row 2: {said}(.|\n)*--skip-bad"):
            convert(tmp_path / name, tmp_path / f"{name}-mds", progress=False)
