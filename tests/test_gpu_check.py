"""The GPU check script, rehearsed on the CPU at small sizes, so it cannot rot between GPU sessions."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from conftest import home_with_synthetic_cifar10

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


# The rehearsal runs in two processes of about equal time, so that `make test`'s workers share it (about 100 s of
# parts in one): the data side (loaders, recipes, the diagnosis of a script), then the training side.
DATA = ["prefetch_race", "loader_throughput", "image_folder", "hf_datasets", "stream_loader", "image_sizes"]
DATA += ["augment_recipes", "diagnose_script", "launches"]
TRAINING = ["bench_ladder", "ddp_overhead", "accelerate_tiers", "tune"]


def _rehearse(parts, tmp_path, monkeypatch, synthetic_cifar10) -> dict:
    # its own cache home (its entries are its own), with the synthetic data its training parts read already there
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(home_with_synthetic_cifar10(synthetic_cifar10, tmp_path / "home")))
    # No time limits: the rehearsal's sizes bound its work, so a loaded machine makes it slower, never failed (it
    # failed `make test` once by the clock, at 240 s). The timeout only guards against a hang: 30x a normal run.
    script = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-rehearsal", "--no-time-limits"]
    run = subprocess.run([*script, "--out", str(tmp_path), "--parts", *parts], capture_output=True, text=True,
                         timeout=3600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [k for k in summary if k in parts] == parts  # in the order given, each recorded
    assert all("error" not in summary[p] for p in parts), {p: summary[p].get("error") for p in parts}
    assert summary["total_seconds"] > 0 and "shm" in summary["environment"]
    return summary


@pytest.mark.slow
def test_the_cpu_rehearsal_of_the_data_parts_runs_and_records_each(tmp_path, monkeypatch, synthetic_cifar10):
    summary = _rehearse(DATA, tmp_path, monkeypatch, synthetic_cifar10)
    assert summary["prefetch_race"]["ok"]
    rows = summary["loader_throughput"]["rows"]
    assert [r["name"].split(",")[0] for r in rows][:2] == ["gpufeed DeviceLoader"] * 2  # slow rows last
    folder = summary["image_folder"]
    assert folder["decoded_vs_pil"]["max_levels"] == 0  # on the CPU: PIL's pixels, bit for bit
    assert [r["name"].split(",")[0] for r in folder["rows"]][:3] == ["torchvision DataLoader + PIL"] + [
        "gpufeed accelerate"
    ] * 2
    hf = summary["hf_datasets"]  # a datasets.Dataset of the folder's 64 photos: the JPEG store's pixels and bytes
    assert summary["datasets"].startswith("installed ") and hf["versions"]["datasets"]
    fidelity = hf["decoded_vs_pil"]
    assert fidelity["images"] == 8 and fidelity["max_levels"] == 0  # on the CPU: datasets' own pixels, bit for bit
    assert fidelity["same_as_folder_files"] == fidelity["same_as_served"] == 8 and not fidelity["warnings"]
    assert hf["image_folder_decoded_vs_pil"]["max_levels"] == 0  # the image_folder part's figure, set beside
    copies = hf["zero_copy"]  # one Arrow file: the store, as read and as served, is a view of its buffer
    assert copies["arrow_files"] == 1 and copies["built_on_arrow"] and copies["served_on_arrow"]
    assert not copies["served_pinned"] and copies["plan_says_not_copied"] and copies["bad_images"] == 0
    assert [r["name"] for r in hf["rows"]] == [
        "with_transform + DataLoader, num_workers=1",
        "gf.accelerate, pixels store",
        "gf.accelerate, jpeg store",
    ]
    assert all(r["images"] == 64 and r["images_per_s"] > 0 for r in hf["rows"]) and hf["ok"]
    streamed = summary["stream_loader"]  # gf.stream beside the JPEG store, then 1 rank against 2 simulated ranks
    assert [r["name"].split(" (")[0].split(":")[0] for r in streamed["rows"]] == [
        "gf.accelerate(ImageFolder), JPEG store",
        "gf.stream(local=mds)",
        "gf.stream(remote=dir, fresh local)",
        "gf.stream(remote=dir, fresh local)",
        "DataLoader(StreamingDataset) + PIL, num_workers=1",
    ]
    assert streamed["first_batch"]["remote"]["shape_ok"] and set(streamed["goals"]) >= {"local_met", "cold_met"}
    assert streamed["layout"]["samples"] == 32 and streamed["layout"]["identical"] == 32 and streamed["ok"]
    assert streamed["checks"]["evaluation"]["max_abs_diff_vs_torchvision"] == 0 and "syncs" not in streamed["checks"]
    sizes = summary["image_sizes"]["sizes"]
    assert [s["size"] for s in sizes] == [32, 64] and all(0 < s["fraction_of_copy"] for s in sizes)
    diagnosed = summary["diagnose_script"]  # an unmodified script under `gpufeed diagnose --verify --`, on the CPU here
    assert diagnosed["returncode"] == 0 and diagnosed["exit"] == "stopped", diagnosed
    assert diagnosed["verdict"] in ("data-bound", "data-bound (CPU contention)", "compute-bound") and diagnosed["side"]
    verified = diagnosed["verify"]  # the changed copy, run for the same 4 steps
    assert "error" not in verified and verified["after"]["loader"].startswith("DeviceLoader at ")
    assert verified["after"]["batches"] == verified["before"]["batches"] == 4
    counted = summary["launches"]["recipes"]  # the device path's operators per batch, counted on the CPU here
    assert len(counted) == 5 and all(r["dispatched"] > 0 and "cuda_kernels" not in r for r in counted.values())
    assert counted["crop+flip+normalise"]["goal"] == 12 and counted["crop+flip+normalise"]["dispatched"] < 100
    fused = summary["launches"]["fused_vs_eager"]  # the suite runs eager (GPUFEED_COMPILE=0); compiled, bit for bit
    assert "skipped" in fused or fused["vs_eager_same_device"]["differing"] == fused["vs_cpu_eager"]["differing"] == 0
    resized = summary["launches"]["resize_fused_vs_eager"]
    assert "skipped" in resized or resized["vs_eager_taps_same_device"]["differing"] == 0
    across = summary["launches"]["device_vs_cpu"]  # on the CPU both sides run the host's path: nothing differs
    assert len(across) == 6 and all(r.get("differing") == 0 for r in across.values()), across


@pytest.mark.slow
def test_the_cpu_rehearsal_of_the_training_parts_runs_and_records_each(tmp_path, monkeypatch, synthetic_cifar10):
    summary = _rehearse(TRAINING, tmp_path, monkeypatch, synthetic_cifar10)
    ladder = [r["name"] for r in summary["bench_ladder"]["rows"]]
    assert ladder[0] == "gpufeed" and ladder[-1].startswith("dataset on the GPU")
    assert summary["tune"] and summary["ddp_overhead"] and summary["accelerate_tiers"]


def test_a_module_missing_here_is_taken_from_the_carried_wheels(tmp_path, monkeypatch):
    import gpu_check

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "gpufeed_carried_probe-1.0-py3-none-any.whl", "w") as z:
        z.writestr("gpufeed_carried_probe/__init__.py", "VALUE = 7\n")
        z.writestr("gpufeed_carried_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: carried-probe\n")
    before = list(sys.path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (both restored after the test)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    assert gpu_check._carried_wheels("torch", wheels).startswith("installed ")  # installed: nothing is added
    assert gpu_check._carried_wheels("gpufeed_carried_probe", tmp_path / "none") is None  # neither: the part skips
    assert sys.path == before
    got = gpu_check._carried_wheels("gpufeed_carried_probe", wheels)
    assert got == "carried: gpufeed_carried_probe-1.0-py3-none-any.whl"
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == sys.path[0]  # a DataLoader worker, a subprocess see it
    try:
        import gpufeed_carried_probe

        assert gpufeed_carried_probe.VALUE == 7
    finally:
        sys.modules.pop("gpufeed_carried_probe", None)


def test_a_part_that_fails_or_times_out_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    import gpu_check

    monkeypatch.setitem(gpu_check.LIMITS, "tune", 1)

    def hangs(c):  # records a failure and goes on, as the bench ladder does: the timeout must get through
        import time

        for _ in range(120):  # two minutes unless the timeout cuts it: the bound below holds at any load
            try:
                time.sleep(1)
            except Exception:
                pass

    monkeypatch.setattr(gpu_check, "tune", hangs)
    monkeypatch.setattr(gpu_check, "prefetch_race", lambda c: 1 / 0)
    gpu_check.main(["--cpu-rehearsal", "--out", str(tmp_path), "--parts", "prefetch_race", "tune"])
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "ZeroDivisionError" in summary["prefetch_race"]["error"]
    assert summary["tune"]["error"] == "timed out after 1 s" and summary["tune"]["part_seconds"] < 60


def test_without_time_limits_a_slow_part_runs_to_its_end(tmp_path, monkeypatch):
    import gpu_check

    monkeypatch.setitem(gpu_check.LIMITS, "tune", 1)
    monkeypatch.setattr(gpu_check, "tune", lambda c: (__import__("time").sleep(2), {"done": True})[1])
    gpu_check.main(["--cpu-rehearsal", "--out", str(tmp_path), "--parts", "tune", "--budget", "1", "--no-time-limits"])
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["tune"]["done"] is True and "error" not in summary["tune"]  # past its 1 s limit and the budget


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_race_check_finds_a_prefetcher_without_record_stream():
    from race import race_check

    assert race_check("cuda", batches=300)["corrupted"] == 0
    assert race_check("cuda", batches=300, broken=True)["corrupted"] > 0
