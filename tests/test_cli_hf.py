"""The commands on a Hugging Face dataset on disk (``--data`` a ``save_to_disk`` folder or Parquet files): served
as an image folder is (its recipes, models and stores), the columns found as ``gf.accelerate`` finds them, and
nothing written beside the data."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.cli.main import build_parser, main
from gpufeed.errors import ConfigError, DataError

from fakes import snapshot

datasets = pytest.importorskip("datasets")

NAMES = ["cat", "dog", "owl"]


def _images(n: int, seed: int = 0) -> list[bytes]:
    """``n`` JPEGs (every fourth a PNG) of different sizes, each class tinted so that a model can learn it."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = rng.integers(36, 60, 2)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pixels[..., i % 3] //= 4
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG" if i % 4 == 3 else "JPEG")
        out.append(buf.getvalue())
    return out


def _dataset(n: int, seed: int = 0, names: list[str] | None = NAMES) -> datasets.Dataset:
    label = datasets.ClassLabel(names=names) if names is not None else datasets.Value("int64")
    features = datasets.Features({"image": datasets.Image(), "label": label})
    rows = {"image": [{"bytes": b, "path": None} for b in _images(n, seed)], "label": [i % 3 for i in range(n)]}
    return datasets.Dataset.from_dict(rows, features=features)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A DatasetDict of 24 training and 6 validation rows, as ``load_dataset(...).save_to_disk(DIR)`` leaves it."""
    root = tmp_path_factory.mktemp("hf") / "pets"
    datasets.DatasetDict(train=_dataset(24), validation=_dataset(6, seed=1)).save_to_disk(str(root))
    return root


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "home"))
    return tmp_path / "home"


def _train(data: str, out: Path, *extra: str) -> int:
    args = ["train", "--data", data, "--image-size", "32", "--epochs", "1", "--batch-size", "8", "--device", "cpu"]
    return main([*args, "--no-progress", "--out", str(out), *extra])


def test_train_on_a_saved_datasetdict_trains_on_train_and_scores_the_validation_split(saved, home, tmp_path, capsys):
    before = snapshot(saved)
    assert _train(str(saved), tmp_path / "o", "--model", "resnet18") == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"data: Hugging Face dataset {saved} (train split; validation: its validation split): 24 training images in "
        "3 classes, 6 validation, 32x32 crops\n"
    )
    assert "a Hugging Face dataset (column 'image'" in out  # the plan: read from the Arrow bytes, as accelerate does
    epoch = json.loads((tmp_path / "o" / "train.json").read_text())["epochs"][0]
    assert (epoch["images"], epoch["test_images"]) == (24, 6)
    assert abs(epoch["test_acc"] * 6 - round(epoch["test_acc"] * 6)) < 1e-9  # k of 6 images
    assert snapshot(saved) == before  # read only: no cache or indices file beside the data
    assert any(p.name.startswith("arrowimages-") for p in home.iterdir())  # the store went to gpufeed's dir


def test_a_training_subset_is_spread_over_the_rows_and_writes_nothing_beside_the_data(saved, home, tmp_path, capsys):
    from gpufeed.cli.common import load_train_test

    before = snapshot(saved)
    args = build_parser().parse_args(["train", "--data", str(saved), "--image-size", "32", "--device", "cpu"])
    train, test = load_train_test(args, 6, 3)
    assert "(using 6 evenly spaced training and 3 evenly spaced test)" in capsys.readouterr().out
    assert (len(train), len(test), train.targets, test.targets) == (6, 3, [0, 1, 2, 0, 1, 2], [0, 2, 1])
    assert train.classes == NAMES and train.transform is not None and test.transform is not None
    assert snapshot(saved) == before  # select(keep_in_memory=True): its indices were not written into the dataset


def test_parquet_files_with_integer_labels_train_with_val_data_naming_other_parquet(home, tmp_path, capsys):
    (tmp_path / "train").mkdir()
    _dataset(12, names=None).to_parquet(str(tmp_path / "train" / "a.parquet"))
    _dataset(12, seed=2, names=None).to_parquet(str(tmp_path / "train" / "b.parquet"))
    _dataset(6, seed=1, names=None).to_parquet(str(tmp_path / "val.parquet"))
    before = snapshot(tmp_path / "train")
    pattern = f"{tmp_path}/train/*.parquet"
    assert _train(pattern, tmp_path / "o", "--val-data", str(tmp_path / "val.parquet")) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"data: Parquet files {pattern}, validation 1 Parquet file {tmp_path / 'val.parquet'}: 24 training images in "
        "3 classes, 6 validation"
    )  # the classes of integer labels: 0 to the largest
    assert json.loads((tmp_path / "o" / "train.json").read_text())["epochs"][0]["test_images"] == 6
    assert snapshot(tmp_path / "train") == before


def test_diagnose_and_tune_read_a_saved_dataset(saved, home, tmp_path, capsys):
    args = ["diagnose", "--data", str(saved), "--image-size", "32", "--batch-size", "8", "--steps", "3"]
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"data: Hugging Face dataset {saved}") and "verdict:" in out
    tune = ["tune", "--data", str(saved), "--batch-size", "8", "--time-budget", "2", "--max-workers", "1"]
    assert main(tune) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"data: Hugging Face dataset {saved}") and "24 training images" in out
    assert "best: DataLoader(dataset, **{'batch_size': 8" in out


def test_bench_and_cache_build_read_a_saved_dataset(saved, home, tmp_path, capsys):
    args = ["bench", "--data", str(saved), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    for name in ("torchvision DataLoader, num_workers=2, persistent", "gpufeed"):  # workers get it pickled
        assert rows[name]["images_per_s"] > 0 and rows[name]["skipped"] is None
    assert rows["gpufeed"]["test_acc"] is not None
    capsys.readouterr()
    assert main(["cache", "build", "--data", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "24 training images, 3 classes" in out and "ragged: 24 images" in out


def test_a_saved_dataset_without_a_classlabel_takes_its_columns_from_the_options(home, tmp_path, capsys):
    ds = _dataset(8).rename_column("image", "photo").cast_column("label", datasets.Value("int64"))
    ds = ds.rename_column("label", "y")
    ds.save_to_disk(str(tmp_path / "one"))
    assert main(["train", "--data", str(tmp_path / "one"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no label column" in err and "--label-key" in err and "photo, y" in err
    assert _train(str(tmp_path / "one"), tmp_path / "o", "--label-key", "y") == 0
    out = capsys.readouterr().out
    assert "8 training images in 3 classes" in out and "(no --val-data: accuracy not measured)" in out
    assert main(["train", "--data", str(tmp_path / "one"), "--image-key", "image", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "image_key='image' is not a column" in err and "photo (Image)" in err


def test_class_names_as_strings_number_validation_by_training_and_a_float_column_is_refused(tmp_path):
    from gpufeed.cli.hf_data import hf_splits, hf_subset

    def named(n: int, names: list[str], seed: int) -> datasets.Dataset:
        return _dataset(n, seed).cast_column("label", datasets.Value("int64")).map(
            lambda r: {"label": names[r["label"]]}, features=datasets.Features(
                {"image": datasets.Image(), "label": datasets.Value("string")}))  # fmt: skip

    # validation lacks "ant": numbered by training's names, not by its own (which would make bee 0)
    datasets.DatasetDict(
        train=named(6, ["bee", "ant", "cow"], 0), validation=named(4, ["bee", "cow", "bee"], 1)
    ).save_to_disk(str(tmp_path / "dd"))
    train, val, _ = hf_splits(str(tmp_path / "dd"), None, 32, None, "auto")
    assert train.classes == val.classes == ["ant", "bee", "cow"]
    assert train.targets == [1, 0, 2, 1, 0, 2] and val.targets == [1, 2, 1, 1]
    assert hf_subset(val, 2).targets == [1, 1]  # rows 0 and 2: a subset keeps the numbering
    datasets.DatasetDict(
        train=named(3, ["bee", "ant", "cow"], 0), validation=named(3, ["bee", "elk", "cow"], 1)
    ).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(DataError, match=r"row 1 has label 'elk' in 'label', a class the training split lacks"):
        hf_splits(str(tmp_path / "other"), None, 32, None, "auto")
    scores = _dataset(4).cast_column("label", datasets.Value("float32")).rename_column("label", "target")
    scores.save_to_disk(str(tmp_path / "scores"))
    with pytest.raises(ConfigError, match=r"'target' holds Value\('float32'\) values.*--label-key"):
        hf_splits(str(tmp_path / "scores"), None, 32, None, "auto")
    with pytest.raises(ConfigError, match=r"label_key='target' is float values; gpufeed reads one class"):
        hf_splits(str(tmp_path / "scores"), None, 32, None, "target")


def _hub_repo(root: Path, train: int, test: int, configs: tuple[str, ...] = ("default",)) -> None:
    """A Hub repository as ``push_to_hub`` leaves it (a card whose configs name ``CONFIG/train-*`` and
    ``CONFIG/test-*`` shards; ``data/`` for the default config), downloaded into ``root``."""
    card = "---\nconfigs:\n"
    for c in configs:
        folder = "data" if c == "default" else c
        card += f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {folder}/train-*\n"
        card += f"  - split: test\n    path: {folder}/test-*\n"
        (root / folder).mkdir(parents=True)
        whole = _dataset(train + test)
        whole.select(range(train // 2)).to_parquet(str(root / folder / "train-00000-of-00002.parquet"))
        whole.select(range(train // 2, train)).to_parquet(str(root / folder / "train-00001-of-00002.parquet"))
        whole.select(range(train, train + test)).to_parquet(str(root / folder / "test-00000-of-00001.parquet"))
    (root / "README.md").write_text(card + "---\n")


def test_a_hub_repository_or_its_data_folder_trains_on_train_and_scores_test_as_load_dataset_splits(
    home, tmp_path, capsys
):
    from gpufeed.cli.hf_data import hf_splits

    repo = tmp_path / "pets"
    _hub_repo(repo, 64, 16)
    before = snapshot(repo)
    want = datasets.load_dataset(str(repo), cache_dir=str(tmp_path / "hf"))
    assert {k: len(v) for k, v in want.items()} == {"train": 64, "test": 16}
    for data in (repo, repo / "data"):
        train, val, line = hf_splits(str(data), None, 32, None, "auto")
        assert (len(train), len(val)) == (64, 16), line
        assert train.targets == want["train"]["label"] and val.targets == want["test"]["label"]
    assert _train(str(repo / "data"), tmp_path / "o") == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"data: Hugging Face dataset {repo / 'data'} (Parquet files split by the file names: train split; "
        "validation: its test split): 64 training images in 3 classes, 16 validation"
    )
    assert json.loads((tmp_path / "o" / "train.json").read_text())["epochs"][0]["test_images"] == 16
    assert snapshot(repo) == before


def test_a_repository_of_several_configs_takes_config_or_refuses_naming_them(home, tmp_path, capsys):
    repo = tmp_path / "two"
    _hub_repo(repo, 8, 4, ("small", "large"))
    assert main(["train", "--data", str(repo), "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "has the configs ['small', 'large'], none marked default: pick one with --config NAME" in err
    args = build_parser().parse_args(["bench", "--data", str(repo), "--config", "large", "--image-size", "32"])
    from gpufeed.cli.common import load_train_test

    train, test = load_train_test(args, None, None)
    assert (len(train), len(test)) == (8, 4)
    assert "README.md's config 'large': train split; validation: its test split" in capsys.readouterr().out
    folder = tmp_path / "pics" / "cat"
    folder.mkdir(parents=True)
    (folder / "a.jpg").write_bytes(_images(1)[0])
    args = build_parser().parse_args(["bench", "--data", str(tmp_path / "pics"), "--config", "large"])
    with pytest.raises(ConfigError, match="config='large' picks a config of a Hub repository's README.md card"):
        load_train_test(args, None, None)


def test_options_that_do_not_fit_a_hugging_face_dataset_are_refused_by_name(saved, home, tmp_path):
    from gpufeed.cli.train import run

    datasets.DatasetDict(a=_dataset(3), b=_dataset(3)).save_to_disk(str(tmp_path / "ab"))
    _dataset(3).save_to_disk(str(tmp_path / "one"))
    other = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in _images(3)], "label": [0, 1, 0]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["x", "y"])}),
    )
    other.save_to_disk(str(tmp_path / "other"))
    (tmp_path / "folder" / "cat").mkdir(parents=True)
    (tmp_path / "folder" / "cat" / "a.jpg").write_bytes(_images(1)[0])
    cases = [
        (["--data", str(tmp_path / "ab")], ConfigError, r"splits a, b\), none named train"),
        (["--data", str(saved), "--val-data", str(tmp_path / "one")], ConfigError, "has its own validation split"),
        (["--data", str(tmp_path / "one"), "--val-data", str(tmp_path / "folder")], ConfigError,
         "the validation set is a Hugging Face dataset too"),
        (["--data", str(tmp_path / "one"), "--val-data", str(tmp_path / "one")], ConfigError, "is the training data"),
        (["--data", str(tmp_path / "one"), "--val-data", str(tmp_path / "other")], DataError,
         r"class names of training and validation .* differ \(only in training: \['cat', 'dog', 'owl'\]"),
        (["--data", str(tmp_path / "folder"), "--label-key", "label"], ConfigError,
         "--image-key and --label-key name the columns of a Hugging Face dataset"),
        (["--data", str(saved), "--download"], ConfigError, "never writes"),
    ]  # fmt: skip
    for extra, error, match in cases:
        args = build_parser().parse_args(["train", *extra, "--device", "cpu", "--out", str(tmp_path / "o")])
        with pytest.raises(error, match=match):
            run(args)
    assert not (tmp_path / "o").exists()


def test_a_parquet_file_or_pattern_is_accepted_as_data_and_a_pattern_matching_nothing_is_not(tmp_path, capsys):
    from gpufeed.cli.common import data_choice

    _dataset(3).to_parquet(str(tmp_path / "a.parquet"))
    assert data_choice(str(tmp_path / "a.parquet")) == str(tmp_path / "a.parquet")
    assert data_choice(f"{tmp_path}/*.parquet") == f"{tmp_path}/*.parquet"
    with pytest.raises(SystemExit) as e:
        main(["train", "--data", f"{tmp_path}/*.parq"])
    assert e.value.code == 2 and "nor .parquet files" in capsys.readouterr().err


def test_a_command_asks_once_whether_its_data_is_a_hugging_face_dataset_and_classes_named_train_stay_classes(
    home, tmp_path, monkeypatch, capsys
):
    """Whether a folder holds Parquet or Arrow files is read from up to 20,000 of its entries: an image folder of many
    files pays that once per command, not at each step that asks."""
    import gpufeed.mds.hf as mds_hf
    import gpufeed.mds.hub as hub
    from gpufeed.cli.common import load_train_test

    pics = tmp_path / "pics"  # an image folder whose classes are called train and test (not splits: zebra too)
    for k, name in enumerate(("test", "train", "zebra")):
        (pics / name).mkdir(parents=True)
        for i, raw in enumerate(_images(2, seed=k)):
            (pics / name / f"{i}.jpg").write_bytes(raw)
    repo = tmp_path / "pets"
    _hub_repo(repo, 8, 4)
    listed, layouts = [], []
    monkeypatch.setattr(
        hub, "_holds_data_files", lambda root, real=hub._holds_data_files: listed.append(root) or real(root)
    )
    monkeypatch.setattr(mds_hf, "hub_layout", lambda *a, real=mds_hf.hub_layout: layouts.append(a[0]) or real(*a))
    args = build_parser().parse_args(["bench", "--data", str(pics), "--image-size", "32"])
    train, test = load_train_test(args, 4, None)  # (a folder's subset is taken by the training loop)
    assert (len(train), train.classes, test) == (6, ["test", "train", "zebra"], None)
    assert listed == [pics.resolve()]
    layouts.clear()
    args = build_parser().parse_args(["bench", "--data", str(repo), "--image-size", "32"])
    train, test = load_train_test(args, 4, 2)  # a spread subset, taken here: one more step that asked
    assert (len(train), len(test)) == (4, 2) and layouts == [repo.resolve()]


@pytest.mark.parametrize("inside", ["", "train"])
def test_an_imagefolder_labelled_by_its_metadata_file_is_refused_naming_it_and_the_load_dataset_fix(
    home, tmp_path, inside
):
    from gpufeed.cli.common import load_train_test

    repo = tmp_path / "repo"  # datasets' imagefolder: the labels in metadata.csv, no class folders
    (repo / inside).mkdir(parents=True, exist_ok=True)
    for i, raw in enumerate(_images(3)):
        (repo / inside / f"{i}.jpg").write_bytes(raw)
    (repo / inside / "metadata.csv").write_text("file_name,label\n0.jpg,0\n1.jpg,1\n2.jpg,0\n")
    assert len(datasets.load_dataset(str(repo), cache_dir=str(tmp_path / "hf"))["train"]) == 3
    args = build_parser().parse_args(["bench", "--data", str(repo), "--image-size", "32"])
    with pytest.raises(DataError) as refused:
        load_train_test(args, None, None)
    message = str(refused.value)
    assert f"{repo / inside / 'metadata.csv'} labels its images (datasets' imagefolder)" in message, message
    assert "datasets.load_dataset('imagefolder', data_dir=" in message and ".save_to_disk(" in message
