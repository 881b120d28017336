import json

import pytest

from gpufeed.cli.main import main


@pytest.mark.slow
def test_train_under_torch_distributed_run_with_two_cpu_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "home"))
    code = main(
        [
            "train",
            "--nproc-per-node",
            "2",
            "--device",
            "cpu",
            "--train-size",
            "1024",
            "--test-size",
            "256",
            "--epochs",
            "2",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    saved = json.loads((tmp_path / "out" / "train.json").read_text())
    assert saved["environment"]["world_size"] == 2
    # 1024 images = 2 ranks x 2 batches of 256 per epoch; the test set is split, then summed exactly
    assert [e["images"] for e in saved["epochs"]] == [1024, 1024]  # summed over the ranks, not rank 0 x 2
    assert [e["test_images"] for e in saved["epochs"]] == [256, 256]
    assert all(abs(e["test_acc"] * 256 - round(e["test_acc"] * 256)) < 1e-9 for e in saved["epochs"])


@pytest.mark.slow
def test_uneven_test_shares_do_not_hang_distributed_evaluation(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "home"))
    # 3 ranks, 2,100 test images in batches of 1,024: shares of 2, 1 and 0 batches (rank 2 has none)
    code = main(
        [
            "train",
            "--nproc-per-node",
            "3",
            "--device",
            "cpu",
            "--train-size",
            "768",
            "--test-size",
            "2100",
            "--batch-size",
            "128",
            "--epochs",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    saved = json.loads((tmp_path / "out" / "train.json").read_text())
    epoch = saved["epochs"][0]
    assert saved["environment"]["world_size"] == 3 and epoch["test_images"] == 2100  # each test image once
    assert epoch["images"] == 768 and abs(epoch["test_acc"] * 2100 - round(epoch["test_acc"] * 2100)) < 1e-9
