import subprocess
import sys

import pytest

import gpufeed
from gpufeed.cli.main import main


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """A cache root shared by this module's tests; the synthetic data is generated there once."""
    root = tmp_path_factory.mktemp("gpufeed-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUFEED_CACHE_DIR", str(root))
    yield root
    mp.undo()


def test_version_is_printed_by_the_console_entry_point():
    out = subprocess.run([sys.executable, "-m", "gpufeed", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"gpufeed {gpufeed.__version__}"


def test_no_command_prints_help_and_succeeds(capsys):
    assert main([]) == 0
    assert "usage: gpufeed" in capsys.readouterr().out


def test_cache_build_info_verify_clear_round_trip(cache_home, capsys):
    assert main(["cache", "build", "--resize", "36"]) == 0
    out = capsys.readouterr().out
    assert "50000 samples (3, 32, 32) torch.uint8" in out and "verified" in out
    entries = [p for p in cache_home.iterdir() if p.name.startswith("syntheticcifar10-")]
    assert len(entries) == 1
    assert main(["cache", "info"]) == 0
    assert "cached: Resize(size=36" in capsys.readouterr().out
    assert main(["cache", "verify"]) == 0
    assert capsys.readouterr().out.startswith("OK ")
    images = entries[0] / "images.bin"
    data = bytearray(images.read_bytes())
    data[12345] ^= 1
    images.write_bytes(data)
    assert main(["cache", "verify"]) == 1
    assert "do not match" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    assert not entries[0].exists() and (cache_home / "data").exists()  # the dataset itself is not a cache entry


def test_cache_clear_refuses_a_directory_that_is_not_a_cache(tmp_path, capsys):
    (tmp_path / "precious").mkdir()
    assert main(["cache", "clear", str(tmp_path / "precious")]) == 1
    assert (tmp_path / "precious").exists() and "not a gpufeed cache entry" in capsys.readouterr().err


def test_diagnose_command_prints_a_verdict_and_saves_the_report(cache_home, tmp_path, capsys):
    out = tmp_path / "diag"
    assert (
        main(
            [
                "diagnose",
                "--loader",
                "torch",
                "--num-workers",
                "0",
                "--train-size",
                "1024",
                "--test-size",
                "128",
                "--steps",
                "3",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("verdict: ") and "fp32-compute" in text
    assert {p.name for p in out.iterdir()} == {"report.md", "report.json", "timeline.png"}


def test_tune_command_prints_the_trials_and_the_best_kwargs(cache_home, capsys):
    assert main(["tune", "--batch-size", "256", "--time-budget", "3", "--max-workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "best: DataLoader(dataset, **{'batch_size': 256" in text and "x the default settings" in text


def test_train_command_writes_train_json(cache_home, tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--epochs",
                "1",
                "--train-size",
                "512",
                "--test-size",
                "128",
                "--device",
                "cpu",
                "--no-progress",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "test acc" in capsys.readouterr().out and (tmp_path / "train.json").is_file()
