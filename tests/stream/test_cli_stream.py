"""The commands on an MDS dataset (``--data DIR`` holding index.json, ``--data s3://...``, ``--local``,
``--cache-limit``): train serves exactly the samples an epoch holds, a directory read as a remote stays under its
cache limit, bench names the stream's rows, and what cannot work is a typed message, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.cli.main import main

from .mds import free_port, total_bytes
from .test_shards import data, s3  # noqa: F401 - the emulated S3 bucket (and the dataset it holds)
from fakes import snapshot

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")

CLASSES = ("cat", "dog", "owl")
RUN = ["--image-size", "16", "--batch-size", "8", "--device", "cpu"]


def _photos(root: Path, per_class: list[int], seed: int) -> Path:
    """Real JPEGs of 20-59 px sides in ``root/<class>/``, each class tinted so a model could tell them apart."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class[c]):
            h, w = rng.integers(20, 60, 2)
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            pixels[..., c] //= 4
            Image.fromarray(pixels).save(root / name / f"{i}.jpg", quality=85)
    return root


@pytest.fixture(scope="module")
def mds(tmp_path_factory):
    """A user's folders converted with ``gpufeed convert``: training (26 images: 3 global batches of 8, 2 left over)
    and validation (9 images), each in shards of about 8 images."""
    root = tmp_path_factory.mktemp("user")
    out = {}
    for split, counts, seed in (("train", [9, 9, 8], 0), ("val", [3, 3, 3], 1)):
        _photos(root / "photos" / split, counts, seed)
        dst = root / f"{split}-mds"
        assert main(["convert", str(root / "photos" / split), str(dst), "--shard-size", "8K", "--quiet"]) == 0
        out[split] = dst
    return out


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "home"))
    return tmp_path / "home"


def _epochs(out: Path) -> list[dict]:
    return json.loads((out / "train.json").read_text())["epochs"]


def test_train_on_a_local_mds_dataset_serves_the_whole_global_batches_of_each_epoch(mds, home, tmp_path, capsys):
    before = snapshot(mds["train"])
    argv = ["train", "--data", str(mds["train"]), *RUN, "--epochs", "1", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"data: MDS dataset {mds['train']} (local): 26 samples (no --val-data: accuracy not measured)"
    )
    assert "stream: 26 samples in 3 classes\nplan: gpufeed.stream" in out
    assert "per epoch: 24 of 26 training images, 3 batches of 8; 2 dropped" in out
    assert [e["images"] for e in _epochs(tmp_path / "o")] == [24]
    record = json.loads((tmp_path / "o" / "train.json").read_text())["config"]
    assert (record["data"], record["local"], record["batch_size"]) == (str(mds["train"]), None, 8)
    assert snapshot(mds["train"]) == before  # only read
    assert not home.exists()  # local-only data: nothing cached


def test_train_reads_a_directory_as_a_remote_into_local_under_the_cache_limit_and_scores_validation(
    mds, home, tmp_path, capsys
):
    before, cache = snapshot(mds["train"]), tmp_path / "cache"
    argv = ["train", "--data", str(mds["train"]), "--local", str(cache), "--cache-limit", "200K", *RUN]
    argv += ["--val-data", str(mds["val"]), "--train-size", "16", "--epochs", "2", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"data: MDS dataset {mds['train']}, fetched into {cache}, cache limit 204,800 bytes: 26 samples (using the "
        f"first 16 of each epoch's order); validation MDS dataset {mds['val']} (local), 16x16 crops\n"
    )
    epochs = _epochs(tmp_path / "o")
    assert [e["images"] for e in epochs] == [16, 16]  # 2 of the 3 global batches of each epoch
    assert [e["test_images"] for e in epochs] == [9, 9]  # one in-order batch of all 9
    assert all(abs(e["test_acc"] * 9 - round(e["test_acc"] * 9)) < 1e-9 for e in epochs)
    assert (cache / "index.json").is_file() and 0 < total_bytes(cache) <= 200 * 1024
    assert snapshot(mds["train"]) == before


def test_bench_on_a_stream_compares_the_engines_dataloader_with_gpufeed_stream(mds, home, tmp_path, capsys):
    argv = ["bench", "--data", str(mds["train"]), *RUN, "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "small model at 16x16 on a 26-image subset" in out
    rows = {r["name"]: r for r in json.loads((tmp_path / "b" / "bench.json").read_text())["rows"]}
    ran = [n for n, r in rows.items() if r["skipped"] is None]
    assert ran == [
        "StreamingDataset in a DataLoader, num_workers=0",
        next(n for n in rows if n.startswith("StreamingDataset in a DataLoader, num_workers=") and "persistent" in n),
        "gpufeed.stream",
        "gpufeed.stream + bf16 + channels_last",
        "model alone, fp32",
        "model alone, bf16 + channels_last",
    ]
    assert all(rows[n]["images_per_s"] > 0 for n in ran)
    assert "deterministic part cached, random part per sample" not in rows  # CIFAR-10's arrays: not listed
    assert "gpufeed.stream waits" in out


def test_the_validation_loader_serves_every_sample_with_torchvisions_evaluation_pixels(mds):
    import io

    import torch

    from gpufeed.data.images import folder_eval
    from gpufeed.data.mds import StreamSource

    source = StreamSource.of(str(mds["val"]), None, None, 16, train=False)
    loader = source.open(4, device="cpu")
    try:
        batches = list(loader)
        files = loader.shards.read(np.arange(9)).images
    finally:
        loader.shards.close()
    assert [y.tolist() for _, y in batches] == [[0, 0, 0, 1], [1, 1, 2, 2], [2]]  # in order, every sample
    recipe = folder_eval(16)  # Resize(18) + CenterCrop(16) + ToTensor + Normalize, torchvision's
    reference = torch.stack([recipe(Image.open(io.BytesIO(f)).convert("RGB")) for f in files])
    assert torch.equal(torch.cat([x for x, _ in batches]), reference)


def test_tune_on_a_stream_measures_the_engines_dataloader_a_user_keeps(mds, home, tmp_path, capsys):
    argv = ["tune", "--data", str(mds["train"]), "--batch-size", "4", "--time-budget", "2", "--max-workers", "1"]
    assert main([*argv, "--image-size", "16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"data: MDS dataset {mds['train']} (local), read by the engine's StreamingDataset")
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [r[0] for r in rows][:2] == ["0", "1"] and all(float(r[3].replace(",", "")) > 0 for r in rows)
    assert "best: DataLoader(dataset, **{'batch_size': 4" in out


def test_a_folder_that_is_neither_images_nor_mds_is_a_message_naming_both(home, tmp_path, capsys):
    (tmp_path / "notes" / "a").mkdir(parents=True)
    (tmp_path / "notes" / "a" / "readme.txt").write_text("not an image")
    assert main(["train", "--data", str(tmp_path / "notes"), *RUN]) == 2
    err = capsys.readouterr().err
    assert "DataError" in err and "not an image folder" in err and "nor an MDS dataset (it has no index.json" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--data", "DATA", "--cache-limit", "1G"], "drop --cache-limit, or add --local CACHE"),
        (["train", "--data", "DATA", "--val-data", "VAL_FOLDER"], "the validation split is another MDS dataset"),
        (["train", "--data", "DATA", "--model", "vgg16"], "not one of ['small', 'resnet18'"),
        (["cache", "build", "--data", "DATA"], "gpufeed keeps no cache of it"),
    ],
)
def test_options_that_do_not_fit_a_stream_are_refused_naming_the_fix(mds, home, tmp_path, capsys, argv, message):
    (tmp_path / "val" / "a").mkdir(parents=True)
    names = {"DATA": str(mds["train"]), "VAL_FOLDER": str(tmp_path / "val")}
    assert main([names.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_s3_url_with_a_cache_limit_too_small_or_an_unreachable_endpoint_is_a_message(
    s3,  # noqa: F811
    home,
    tmp_path,
    monkeypatch,
    capsys,
):
    for k, v in s3.items():
        monkeypatch.setenv(k, v)
    argv = ["train", "--data", "s3://gpufeed-test/mds", *RUN]
    assert main([*argv, "--local", str(tmp_path / "c"), "--cache-limit", "4K"]) == 2
    err = capsys.readouterr().err
    assert "ConfigError: cache_limit=4,096 bytes is too small for this dataset" in err and "give at least" in err
    monkeypatch.setenv("S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert main([*argv, "--local", str(tmp_path / "c2")]) == 2
    err = capsys.readouterr().err
    assert "StorageError: index.json of the MDS dataset s3://gpufeed-test/mds could not be fetched" in err
    assert "the remote could not be reached (EndpointConnectionError" in err and "S3_ENDPOINT_URL" in err
    assert "Traceback" not in err


def test_an_unknown_url_scheme_is_refused_by_the_parser_naming_the_engines(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--data", "ftp://host/data"])
    assert stop.value.code == 2
    assert "the streaming engine reads alipan://, azure://" in capsys.readouterr().err


def test_the_schemes_recognised_are_the_installed_engines_downloaders():
    from streaming.base.storage.download import DOWNLOADER_MAPPINGS

    from gpufeed.data.mds import SCHEMES

    assert set(SCHEMES) == set(DOWNLOADER_MAPPINGS) - {"", "dbfs-uc"}  # dbfs-uc: dbfs:/Volumes/... (scheme dbfs)


def test_help_names_the_stream_forms(capsys):
    for command in ("train", "bench", "diagnose"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "s3://bucket/prefix" in text and "--local DIR" in text and "--cache-limit BYTES" in text, command


def test_torchrun_gets_local_under_a_name_its_own_parser_does_not_take_for_local_addr(monkeypatch):
    import subprocess

    from torch.distributed.run import get_args_parser

    from gpufeed.cli.main import build_parser
    from gpufeed.cli.train import _launch

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    argv = ["train", "--data", "s3://b/p", "--local", "/scratch/c", "--nproc-per-node", "2", "--local=/x"]
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert _launch(args) == 0
    launched = get_args_parser().parse_args(calls[0][3:])  # what torch.distributed.run reads (it raised before)
    assert launched.module and launched.training_script == "gpufeed"
    assert launched.training_script_args == ["train", "--data", "s3://b/p", "--local-dir", "/scratch/c",
                                             "--local-dir=/x"]  # fmt: skip
    assert build_parser().parse_args(launched.training_script_args).local == "/x"  # the same option of ours


def test_tars_with_numbered_classes_train_without_num_classes_as_the_convert_flow_says(tmp_path, home, capsys):
    # WebDataset tars name no classes (gpufeed.json's "classes" is null): convert records their count (the largest
    # label plus one), and train takes it from there, where it used to refuse with a false reason
    import io
    import tarfile

    rng = np.random.default_rng(4)
    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "shard-000.tar", "w") as tar:
        for i, label in enumerate([0, 4, 2, 1, 3, 0, 2, 4, 1, 3, 0, 2]):
            image = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)).save(image, "JPEG")
            for ext, data in (("jpg", image.getvalue()), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    dst = tmp_path / "wds-mds"
    assert main(["convert", str(tmp_path / "wds"), str(dst), "--quiet"]) == 0
    meta = json.loads((dst / "gpufeed.json").read_text())
    assert (meta["classes"], meta["num_classes"]) == (None, 5)
    argv = ["train", "--data", str(dst), *RUN, "--epochs", "1", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    assert "stream: 12 samples in 5 classes" in capsys.readouterr().out
