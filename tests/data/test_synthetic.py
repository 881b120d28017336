import pickle

import numpy as np
import pytest

from gpufeed.data import SyntheticCIFAR10, cifar10, write_synthetic_cifar10


def test_files_are_the_real_cifar10_format_read_by_torchvision(tmp_path):
    root = write_synthetic_cifar10(tmp_path, seed=3, train=500, test=100)
    names = sorted(p.name for p in (root / "cifar-10-batches-py").iterdir())
    assert names == [
        "batches.meta",
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "gpufeed-synthetic.json",
        "test_batch",
    ]
    with open(root / "cifar-10-batches-py" / "data_batch_2", "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    assert entry["data"].shape == (100, 3072) and entry["data"].dtype == np.uint8 and len(entry["labels"]) == 100
    train = SyntheticCIFAR10(tmp_path, seed=3, sizes=(500, 100))
    test = SyntheticCIFAR10(tmp_path, train=False, seed=3, sizes=(500, 100))
    assert train.data.shape == (500, 32, 32, 3) and len(test) == 100 and train.classes[0] == "airplane"
    assert set(train.targets) == set(range(10))


def test_generation_is_deterministic_in_the_seed(tmp_path):
    a = SyntheticCIFAR10(tmp_path / "a", seed=1, sizes=(100, 10))
    b = SyntheticCIFAR10(tmp_path / "b", seed=1, sizes=(100, 10))
    c = SyntheticCIFAR10(tmp_path / "c", seed=2, sizes=(100, 10))
    assert np.array_equal(a.data, b.data) and a.targets == b.targets
    assert not np.array_equal(a.data, c.data)


def test_torchvision_integrity_check_still_runs_on_synthetic_files(tmp_path):
    root = write_synthetic_cifar10(tmp_path, train=100, test=10)
    batch = root / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(batch.read_bytes()[:-10])
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        SyntheticCIFAR10(tmp_path, download=False, sizes=(100, 10))


def test_real_cifar10_needs_a_data_directory():
    with pytest.raises(ValueError, match="--data-dir"):
        cifar10("cifar10")


def test_concurrent_requests_generate_once_and_all_read_complete_files(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from gpufeed.data import SyntheticCIFAR10; "
        f"print(len(SyntheticCIFAR10({str(tmp_path)!r}, sizes=(2000, 100))))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["2000"] * 3
    assert [p.returncode for p in procs] == [0, 0, 0]


def test_a_folder_with_synthetic_data_of_another_seed_or_size_is_not_read_as_this_one(tmp_path):
    from gpufeed import DataError

    write_synthetic_cifar10(tmp_path, seed=1, train=100, test=10)
    with pytest.raises(DataError, match=r"holds synthetic data of seed 1 and sizes \(100, 10\), not seed 2"):
        cifar10("synthetic", tmp_path, seed=2, sizes=(100, 10))
    assert len(cifar10("synthetic", tmp_path, seed=1, sizes=(100, 10))) == 100


def test_a_named_folder_is_only_read_unless_download_is_asked(tmp_path):
    from gpufeed import DataError

    with pytest.raises(DataError, match="holds no synthetic CIFAR-10.*--download"):
        cifar10("synthetic", tmp_path, sizes=(100, 10))
    assert list(tmp_path.iterdir()) == []
    assert len(cifar10("synthetic", tmp_path, sizes=(100, 10), download=True)) == 100
