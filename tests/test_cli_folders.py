"""Every command on a user's own image folder (``--data DIR``): the layouts people have, the models for them,
what is measured, and that nothing is written into the folder."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.cli.main import main
from gpufeed.data.images import folder_splits, folder_subset
from gpufeed.errors import ConfigError, DataError

from fakes import snapshot

CLASSES = ("cat", "dog", "owl")


def _photos(root: Path, per_class: int = 8, seed: int = 0) -> Path:
    """A user's folder of JPEGs of different sizes, a PNG and a grayscale JPEG among them; each class tints
    its images so that a model can learn them."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            h, w = rng.integers(40, 90, 2)
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            pixels[..., c] //= 4
            im = Image.fromarray(pixels)
            if i == 0:
                im.save(root / name / f"{i}.png")
            elif i == 1:
                im.convert("L").save(root / name / f"{i}.jpg")
            else:
                im.save(root / name / f"{i}.jpg", quality=85)
    return root


@pytest.fixture(scope="module")
def split_folder(tmp_path_factory):
    """``DIR/train`` and ``DIR/val``, as torchvision's references lay out ImageNet."""
    root = tmp_path_factory.mktemp("user") / "pets"
    _photos(root / "train", 8, seed=0)
    _photos(root / "val", 4, seed=1)
    return root


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "home"))
    return tmp_path / "home"


def test_train_on_a_train_val_folder_with_a_torchvision_model_scores_every_validation_image(
    split_folder, home, tmp_path, capsys
):
    before = snapshot(split_folder)
    args = ["train", "--data", str(split_folder), "--model", "resnet18", "--image-size", "32", "--epochs", "2"]
    assert main([*args, "--batch-size", "8", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"data: image folder {split_folder / 'train'}, validation {split_folder / 'val'}: 24 training images in "
        "3 classes, 12 validation, 32x32 crops\n"
    )
    record = json.loads((tmp_path / "o" / "train.json").read_text())
    assert record["config"]["model"] == "resnet18" and record["config"]["image_size"] == 32
    epochs = record["epochs"]
    assert [e["images"] for e in epochs] == [24, 24]  # 3 full batches of 8 per epoch
    assert [e["test_images"] for e in epochs] == [12, 12]
    assert all(abs(e["test_acc"] * 12 - round(e["test_acc"] * 12)) < 1e-9 for e in epochs)  # k of 12 images
    assert snapshot(split_folder) == before  # read only
    assert any(p.name.startswith("imagefolder-") for p in home.iterdir())  # the decoded store went to gpufeed's dir


def test_a_folder_of_class_folders_is_the_training_split_and_val_data_names_the_other(
    split_folder, home, tmp_path, capsys
):
    args = ["train", "--data", str(split_folder / "train"), "--image-size", "32", "--epochs", "1", "--batch-size", "8"]
    assert main([*args, "--device", "cpu", "--no-progress", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "(no validation folder: accuracy not measured)" in out
    assert json.loads((tmp_path / "a" / "train.json").read_text())["epochs"][0]["test_acc"] is None
    assert main([*args, "--val-data", str(split_folder / "val"), "--out", str(tmp_path / "b")]) == 0
    assert f"validation {split_folder / 'val'}: 24 training images" in capsys.readouterr().out
    assert json.loads((tmp_path / "b" / "train.json").read_text())["epochs"][0]["test_images"] == 12


def test_a_training_subset_of_a_folder_is_spread_over_its_classes(split_folder):
    train, val, _ = folder_splits(str(split_folder), None, 32)
    part = folder_subset(train, 6)
    assert len(part) == 6 and Counter(part.targets) == {0: 2, 1: 2, 2: 2}  # not the first 6 (all "cat")
    assert part.samples == part.imgs and [t for _, t in part.samples] == part.targets
    assert len(train) == 24 and len(folder_subset(val, 99)) == 12


def test_validation_classes_that_differ_from_training_are_refused(tmp_path):
    _photos(tmp_path / "d" / "train", 2)
    (tmp_path / "d" / "val" / "cat").mkdir(parents=True)
    Image.new("RGB", (20, 20)).save(tmp_path / "d" / "val" / "cat" / "x.jpg")
    with pytest.raises(DataError, match=r"class folders .* differ \(only in training: \['dog', 'owl'\]"):
        folder_splits(str(tmp_path / "d"), None, 32)


def test_torchvisions_food101_layout_is_read_with_its_own_splits(tmp_path):
    base = tmp_path / "food-101"
    _photos(base / "images", 3)
    names = {c: [f"{c}/{i}" for i in range(3)] for c in CLASSES}
    (base / "meta").mkdir()
    (base / "meta" / "train.json").write_text(json.dumps({c: v[:2] for c, v in names.items()}))
    (base / "meta" / "test.json").write_text(json.dumps({c: v[2:] for c, v in names.items()}))
    for c in CLASSES:  # Food101 names .jpg files; the fake's first image is a PNG
        Image.open(base / "images" / c / "0.png").convert("RGB").save(base / "images" / c / "0.jpg")
    train, test, what = folder_splits(str(base), None, 32)
    assert (len(train), len(test), train.classes) == (6, 3, list(CLASSES)) and what.startswith("Food101 at")
    assert Counter(folder_subset(train, 3)._labels) == {0: 1, 1: 1, 2: 1}


def test_cache_build_on_a_folder_builds_the_entry_accelerate_opens_then_finds_it(split_folder, home, capsys):
    before = snapshot(split_folder)
    assert main(["cache", "build", "--data", str(split_folder)]) == 0
    first = capsys.readouterr().out
    assert "24 training images, 3 classes" in first and "\nbuilt " in first and "ragged: 24 images" in first
    assert main(["cache", "build", "--data", str(split_folder)]) == 0
    assert "found (already built)" in capsys.readouterr().out
    assert main(["cache", "build", "--data", str(split_folder), "--store", "jpeg"]) == 0
    assert "encoded files: 24 images" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert "store: decoded pixels, each image its own size, 24 images" in info
    assert "store: the image files' bytes, 24 images" in info
    assert main(["cache", "verify"]) == 0
    assert snapshot(split_folder) == before


def test_bench_on_a_folder_runs_the_ladder_and_says_which_rungs_do_not_apply(split_folder, home, tmp_path, capsys):
    args = ["bench", "--data", str(split_folder), "--image-size", "32", "--batch-size", "8", "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "small model at 32x32 on a 24-image subset" in out
    rows = {r["name"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    assert rows["deterministic part cached, random part per sample"]["skipped"].startswith("CIFAR-10's arrays only")
    for name in ("torchvision DataLoader, num_workers=0", "gpufeed", "model alone, fp32"):
        assert rows[name]["images_per_s"] > 0 and rows[name]["skipped"] is None
    assert rows["gpufeed"]["test_acc"] is not None


def test_diagnose_and_tune_read_a_folder(split_folder, home, tmp_path, capsys):
    args = ["diagnose", "--data", str(split_folder), "--image-size", "32", "--batch-size", "8", "--steps", "3"]
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data: image folder") and "verdict:" in out
    assert (
        main(["tune", "--data", str(split_folder), "--batch-size", "8", "--time-budget", "2", "--max-workers", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(f"data: image folder {split_folder / 'train'}") and "24 training images" in out
    assert "best: DataLoader(dataset, **{'batch_size': 8" in out


@pytest.mark.parametrize(
    "args, error, match",
    [
        (["--model", "vgg16"], ConfigError, r"not one of .* \(the models for image folders\)"),
        (["--model", "vit_b_16", "--image-size", "40"], ConfigError, "must be a multiple of 16"),
        (["--data-dir", "/tmp"], ConfigError, "data-dir.* is where CIFAR-10 lives"),
        (["--loader", "pretransform"], ConfigError, "an image folder's images differ in size"),
    ],
)
def test_options_that_do_not_fit_a_folder_are_refused_by_name(split_folder, home, tmp_path, args, error, match):
    from gpufeed.cli.main import build_parser
    from gpufeed.cli.train import run

    parsed = build_parser().parse_args(["train", "--data", str(split_folder), "--device", "cpu", *args])
    parsed.out, parsed.no_progress = tmp_path / "o", True
    with pytest.raises(error, match=match):
        run(parsed)


def test_options_of_folders_are_refused_on_cifar(home):
    from gpufeed.cli.main import build_parser
    from gpufeed.cli.train import run

    for extra, match in [(["--image-size", "64"], "applies to image folders"), (["--val-data", "/tmp"], "--val-data")]:
        with pytest.raises(ConfigError, match=match):
            run(build_parser().parse_args(["train", *extra]))


def test_a_missing_folder_is_an_argument_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--data", str(tmp_path / "nope")])
    assert e.value.code == 2 and "neither one of synthetic, cifar10, synthetic-folder nor a folder" in (
        capsys.readouterr().err
    )


def test_a_class_called_train_stays_a_class(tmp_path):
    _photos(tmp_path / "vehicles", 2)
    (tmp_path / "vehicles" / "dog").rename(tmp_path / "vehicles" / "train")  # CIFAR-100 has a class "train"
    train, val, what = folder_splits(str(tmp_path / "vehicles"), None, 32)
    assert train.classes == ["cat", "owl", "train"] and val is None and "no validation folder" in what


def test_a_train_folder_alone_is_the_training_split(tmp_path):
    _photos(tmp_path / "d" / "train", 2)
    train, val, what = folder_splits(str(tmp_path / "d"), None, 32)
    assert len(train) == 6 and val is None and what.startswith(f"image folder {tmp_path / 'd' / 'train'} (no val")


def test_a_folder_with_one_class_names_the_level_below(tmp_path):
    _photos(tmp_path / "imagenette" / "imagenette2", 2)  # the classes are one level down
    with pytest.raises(DataError, match=r"one class folder \('imagenette2'\).*--data .*imagenette/imagenette2"):
        folder_splits(str(tmp_path / "imagenette"), None, 32)


def test_a_folder_named_like_a_keyword_is_the_folder(tmp_path, monkeypatch):
    from gpufeed.cli.common import data_choice

    _photos(tmp_path / "synthetic", 2)
    monkeypatch.chdir(tmp_path)
    assert data_choice("./synthetic") == str(tmp_path / "synthetic") and data_choice("synthetic") == "synthetic"


def test_validation_on_the_training_folder_and_download_are_refused(split_folder, home, tmp_path):
    from gpufeed.cli.main import build_parser
    from gpufeed.cli.train import run

    train_dir = str(split_folder / "train")
    for extra, match in [
        (["--data", train_dir, "--val-data", train_dir], "is the training folder"),
        (["--data", str(split_folder), "--download"], "never writes into an image folder"),
    ]:
        args = build_parser().parse_args(["train", *extra, "--device", "cpu", "--out", str(tmp_path / "o")])
        with pytest.raises(ConfigError, match=match):
            run(args)


def test_a_cache_directory_inside_the_folder_is_refused_before_anything_is_written(split_folder, monkeypatch, capsys):
    before = snapshot(split_folder)
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(split_folder / "cache"))
    assert main(["cache", "build", "--data", str(split_folder)]) == 2
    assert "is inside --data" in capsys.readouterr().err
    assert main(["cache", "build", "--data", str(split_folder), "--cache-dir", str(split_folder / "train")]) == 2
    assert snapshot(split_folder) == before


def test_train_with_a_store_finds_the_entry_cache_build_made_for_it(split_folder, home, tmp_path, capsys):
    assert main(["cache", "build", "--data", str(split_folder), "--store", "jpeg", "--device", "cpu"]) == 0
    built = [p for p in home.iterdir() if p.name.startswith("imagefolder-")]
    capsys.readouterr()
    args = ["train", "--data", str(split_folder), "--store", "jpeg", "--image-size", "32", "--batch-size", "8"]
    assert main([*args, "--epochs", "1", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "o")]) == 0
    after = [p for p in home.iterdir() if p.name.startswith("imagefolder-")]
    assert set(built) <= set(after) and len(set(after) - set(built)) == 1  # only the validation split's entry added


def test_cache_build_into_a_read_only_place_says_so_alone(split_folder, home, tmp_path, capsys):
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        assert main(["cache", "build", "--data", str(split_folder), "--cache-dir", str(ro)]) == 2
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    err = capsys.readouterr().err
    assert "gpufeed cache: CacheWriteError: cannot create the build lock" in err and "Read-only file system" in err
    assert "memory" not in err.split("CacheWriteError", 1)[1]  # not the plan's notes about budgets and malloc
