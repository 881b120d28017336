"""diagnose(): the verdict and wait fraction on loops whose costs are known, and one test per finding."""

import json
import os
import statistics
import sys
import threading
import time

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, TensorDataset

from gpufeed import ConfigError, diagnose
from gpufeed.device import Cores
from gpufeed.findings import MachineLoad

from fakes import cifar_like


class SlowLoader:
    """Yields a fixed batch after sleeping ``delay`` seconds: a loader with a known cost."""

    def __init__(self, delay: float, n: int = 30) -> None:
        self.delay, self.n = delay, n

    def __iter__(self):
        for _ in range(self.n):
            if self.delay:  # time.sleep(0) is no free call: on a busy machine it gives the core away for a slice
                time.sleep(self.delay)
            yield torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)


def _sleep_step(seconds):
    return lambda batch: time.sleep(seconds)


def _kinds(report):
    return {f.kind for f in report.findings}


def test_a_slow_loader_is_data_bound_with_the_injected_wait_fraction():
    report = diagnose(SlowLoader(0.03), _sleep_step(0.01), steps=20, device="cpu")
    assert report.verdict == "data-bound" and report.steps == 20
    assert report.data_wait_fraction == pytest.approx(0.75, abs=0.1)  # 30 ms wait per 40 ms step


def test_a_fast_loader_is_not_data_bound(monkeypatch):
    # a quiet machine's reading: other processes (a test suite beside this one) would add the busy-machine finding
    quiet = MachineLoad(1.0, 0.0, 0.5, 0.2, Cores(2, 2, 2))
    monkeypatch.setattr(
        sys.modules["gpufeed.diagnose"], "MachineMeter", lambda: type("Quiet", (), {"read": lambda self: quiet})()
    )
    report = diagnose(SlowLoader(0.0), _sleep_step(0.02), steps=20, device="cpu")
    assert report.verdict == "compute-bound" and report.data_wait_fraction < 0.05
    assert "no findings" in str(report)


def test_per_sample_transforms_and_too_few_workers_are_found_on_a_torchvision_pipeline():
    tf = T.Compose(
        [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)]
    )
    loader = DataLoader(cifar_like(512, transform=tf), batch_size=64, num_workers=0)
    report = diagnose(loader, lambda batch: None, steps=8, device="cpu")
    assert report.verdict == "data-bound"
    assert {"per-sample-transforms", "too-few-workers"} <= _kinds(report)
    fix = next(f for f in report.findings if f.kind == "per-sample-transforms").fix
    assert "gpufeed.accelerate" in fix


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # torch's own warning says the same
def test_more_workers_than_cores_are_reported():
    cores = len(os.sched_getaffinity(0))
    loader = DataLoader(TensorDataset(torch.zeros(64, 3, 4, 4)), batch_size=8, num_workers=cores + 1)
    assert "too-many-workers" in _kinds(diagnose(loader, lambda b: None, steps=4, device="cpu"))


def test_a_slow_first_step_with_cudnn_benchmark_is_reported(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    calls = []

    def step(batch):
        calls.append(1)
        time.sleep(1.1 if len(calls) == 1 else 0.002)

    report = diagnose(SlowLoader(0.0, n=10), step, steps=8, device="cpu")
    finding = next(f for f in report.findings if f.kind == "cudnn-autotune")
    assert report.step_s[0] >= 1.1  # a loaded machine may oversleep: the message shows what was measured
    assert f"the first step took {report.step_s[0]:.1f} s" in finding.message and "drop_last=True" in finding.fix


def test_a_ragged_last_batch_with_cudnn_benchmark_is_reported(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    loader = DataLoader(TensorDataset(torch.zeros(10, 1)), batch_size=4)
    finding = next(
        f for f in diagnose(loader, lambda b: None, steps=3, device="cpu").findings if f.kind == "ragged-last-batch"
    )
    assert "has 2 samples instead of 4" in finding.message
    assert "ragged-last-batch" not in _kinds(
        diagnose(
            DataLoader(TensorDataset(torch.zeros(10, 1)), batch_size=4, drop_last=True),
            lambda b: None,
            steps=2,
            device="cpu",
        )
    )


def test_workers_forked_after_cuda_initialisation_are_reported(monkeypatch):
    loader = DataLoader(TensorDataset(torch.zeros(16, 1)), batch_size=4, num_workers=1)
    assert "fork-after-cuda" not in _kinds(diagnose(loader, lambda b: None, steps=2, device="cpu"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as in a process holding CUDA tensors
    finding = next(
        f for f in diagnose(loader, lambda b: None, steps=2, device="cpu").findings if f.kind == "fork-after-cuda"
    )
    assert "forkserver" in finding.fix
    safe = DataLoader(TensorDataset(torch.zeros(16, 1)), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert "fork-after-cuda" not in _kinds(diagnose(safe, lambda b: None, steps=2, device="cpu"))


def test_float32_convolutions_without_autocast_are_reported():
    conv = torch.nn.Conv2d(3, 8, 3)

    def fp32_step(batch):
        conv(batch[0]).sum().backward()

    def bf16_step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            conv(batch[0]).sum().backward()

    report = diagnose(SlowLoader(0.0, n=6), fp32_step, steps=4, device="cpu")
    finding = next(f for f in report.findings if f.kind == "fp32-compute")
    assert finding.message.startswith("1 convolution/matmul calls per step") and "autocast" in finding.fix
    assert "fp32-compute" not in _kinds(diagnose(SlowLoader(0.0, n=6), bf16_step, steps=4, device="cpu"))


def test_report_saves_markdown_json_and_a_timeline(tmp_path):
    report = diagnose(SlowLoader(0.01, n=12), _sleep_step(0.005), steps=10, device="cpu")
    out = report.save(tmp_path / "diag")
    saved = json.loads((out / "report.json").read_text())
    assert saved["verdict"] == report.verdict and len(saved["wait_s"]) == 10
    assert "verdict: data-bound" in (out / "report.md").read_text()
    assert (out / "timeline.png").stat().st_size > 5_000


def test_too_few_steps_or_batches_is_an_error():
    with pytest.raises(ConfigError, match="steps=1"):
        diagnose(SlowLoader(0.0), lambda b: None, steps=1)
    with pytest.raises(ConfigError, match="yielded 1 batch"):
        diagnose(iter(SlowLoader(0.0, n=1)), lambda b: None, steps=5, device="cpu")  # one-shot, one batch


def test_a_tiny_epoch_is_measured_into_the_next_epochs_and_the_report_says_so():
    report = diagnose(SlowLoader(0.0, n=3), _sleep_step(0.001), steps=8, device="cpu")
    assert report.steps == 8 and report.epochs == 3
    assert "measured 8 of 8 steps over 3 epochs of 3 batches" in report.notes
    one_shot = diagnose(iter(SlowLoader(0.0, n=4)), _sleep_step(0.001), steps=10, device="cpu")
    assert one_shot.steps == 4 and one_shot.epochs == 1
    assert one_shot.notes[0] == "measured 4 of 10 steps in one epoch: the loader yields no more (a one-shot iterable?)"


class Competing(DataLoader):
    """A DataLoader whose iteration slows the training step down, as workers competing for the cores do: while an
    epoch of it is open, ``busy`` is set (and the step sleeps longer); it clears when the iterator is released.

    Its batches come from memory, not from its workers (its ``num_workers`` is what diagnose reads and names): a
    worker's batch reaches the main process only once the worker is scheduled again, which on a loaded 2-core
    machine cost 8 ms of waiting a step (a 27% wait: "data-bound", not contention). So the wait is made, as the
    slowdown is: none."""

    busy = threading.Event()

    def __iter__(self):
        self.busy.set()
        try:
            batch = (torch.zeros(self.batch_size, 3, 8, 8), torch.zeros(self.batch_size))
            for _ in range(len(self)):
                yield batch
        finally:
            self.busy.clear()


def test_a_step_slowed_while_the_workers_run_is_found_as_contention():
    # The slowdown is made, not hoped for: real CPU competition depends on what else the machine runs (another
    # pytest worker's burst during the idle steps hid it in CI). The step takes 50 ms while the loader's epoch is
    # open and 10 ms once diagnose has released it: the idle steps are 5x faster, whatever the machine's load; and
    # the batches wait for nothing (see Competing). 40 of each 50 ms are contention: 80%, where a loaded machine's
    # oversleeping of the idle steps (a 10 ms sleep measured 14 ms) still leaves over 70%.
    loader = Competing(TensorDataset(torch.zeros(4000, 3, 8, 8), torch.zeros(4000)), batch_size=8, num_workers=2)
    report = diagnose(loader, lambda b: time.sleep(0.05 if Competing.busy.is_set() else 0.01), steps=40, device="cpu")
    assert not Competing.busy.is_set()  # diagnose released the epoch before its idle steps
    assert report.verdict == "data-bound (CPU contention)", str(report)
    assert report.data_wait_fraction < 0.25 and report.contention_fraction >= 0.5
    assert statistics.median(report.step_s) > 2 * report.idle_step_s
    finding = next(f for f in report.findings if f.kind == "cpu-contention")
    assert "compete with the training step" in finding.message and "its 2 workers" in finding.message


def test_a_batchable_pipeline_is_suggested_whatever_the_verdict():
    tf = T.Compose([T.RandomCrop(32, padding=4), T.ToTensor()])
    loader = DataLoader(cifar_like(256, transform=tf), batch_size=32, num_workers=0)
    report = diagnose(loader, _sleep_step(0.25), steps=6, device="cpu")  # a slow step: compute-bound
    assert report.verdict == "compute-bound"
    finding = next(f for f in report.findings if f.kind == "per-sample-transforms")
    # the wording follows the loader's measured cost (5% on one 2-core machine, 2% on another): computed from it
    cost = report.data_wait_fraction + report.contention_fraction
    assert "gpufeed.accelerate" in finding.fix and f"worth at most {1 / (1 - cost):.2f}x" in finding.expected_gain
    assert ("little to gain here" in finding.expected_gain) == (cost < 0.05)


def test_a_pipeline_the_planner_refuses_on_its_samples_is_not_suggested():
    # Every op is batchable, but the dataset's own __getitem__ draws random numbers: accelerate() refuses it
    # (reading each sample once would freeze that randomness), so diagnose must not offer it as the fix.
    class Jittered(TensorDataset):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return self.transform(image + torch.randint(0, 2, (1,), dtype=torch.uint8)), label

    dataset = Jittered(torch.zeros(64, 3, 8, 8, dtype=torch.uint8), torch.arange(64))
    dataset.transform = T.RandomCrop(8, padding=2)
    report = diagnose(DataLoader(dataset, batch_size=8), lambda b: None, steps=4, device="cpu")
    assert "per-sample-transforms" not in _kinds(report)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_unpinned_host_batches_and_a_dataset_that_fits_are_reported_on_cuda():
    tf = T.Compose([T.ToTensor()])
    loader = DataLoader(cifar_like(256, transform=tf), batch_size=64)
    report = diagnose(loader, lambda b: b[0].cuda().sum(), steps=3, device="cuda")
    kinds = _kinds(report)
    assert {"unpinned-copies", "fits-on-device"} <= kinds


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_many_tiny_kernels_are_launch_bound_and_a_big_matmul_is_compute_bound(monkeypatch):
    a = torch.randn(8192, 8192, device="cuda")
    small = torch.randn(8, device="cuda")

    def tiny(batch):
        for _ in range(200):
            small.add_(1.0)

    def big(batch):
        a @ a

    loader = [(torch.zeros(1, device="cuda"),)] * 12
    for step in (tiny, big):  # the kernels' lazy loading and cuBLAS's set-up are not the steps compared
        step(None)
    torch.cuda.synchronize()
    # contention (a step slower in the loop than idle) is not this test's subject: at microseconds of host time
    # per step, a loaded host decides it
    monkeypatch.setattr("gpufeed.diagnose.CONTENTION_SLOWDOWN", float("inf"))
    assert diagnose(loader, tiny, steps=10, device="cuda").verdict == "launch-bound"
    assert diagnose(loader, big, steps=10, device="cuda").verdict == "compute-bound"
