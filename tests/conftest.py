"""Shared fixtures: the ``device`` fixture runs a test on the CPU and, where present, on CUDA."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

_DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
    ),
]


@pytest.fixture
def one_thread():
    """One torch thread, as ``make test``'s workers compute (and as DataLoader workers run torchvision's per-sample
    ops): torch's OpenMP and MKL teams on 2 threads of a busy 2-core machine made each of torchvision's small ops slow
    (a 120x3 by 3x2 bmm, one per affine warp: 24-32 ms on 2 threads beside a load of 4-5, 0.003 ms on one), so a file
    that compares with torchvision sample by sample, run alone, took 5-10x its time under ``make test``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (`make test` runs one worker per core) each worker computes on one thread: two workers
    # with torch's default of one thread per core would run twice the threads the cores hold.
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    # The batched ops' eager code everywhere (and in every process a test starts): compiling a fused op takes
    # seconds per process and op set, cold. tests/augment/test_fusion.py turns it on, and checks the compiled
    # pixels against the eager ones bit for bit (those are checked against torchvision's everywhere else).
    os.environ.setdefault("GPUFEED_COMPILE", "0")
    # A suite started in the background by a non-interactive shell (`make test &`, nohup) has SIGINT ignored, and
    # every process a test starts inherits that: the tests that interrupt a script (Ctrl-C, --time) saw it run on.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # No time limit per hypothesis example: its default 200 ms fails a test whose example met a busy machine (a
    # stall of the other worker's subprocesses), not one that is wrong. A hang is still bounded by the suite.
    from hypothesis import settings

    settings.register_profile("gpufeed", deadline=None)
    settings.load_profile("gpufeed")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``worksteal`` (``make test``), each worker first gets one contiguous share of the
    collected tests, and an idle one steals from the end of another's queue. A long test (a minute of a rehearsal,
    a torchrun job) left at the back of a share ends the run alone on one core. So the tests measured long
    (``tests/durations.json``, from ``--durations``; a stale entry only schedules worse) are dealt to the shares
    longest first, each to the share with the least such time, and open its share; the others follow in their
    collected order. Every worker computes this same order from the same collection, as xdist requires. The tests
    that measure the machine's load (CPU contention, a wait fraction) are left out of the file on purpose: among
    the light tests they run beside less load than beside a torchrun job."""
    import json
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or len(items) < workers:
        return
    known = json.loads((Path(__file__).parent / "durations.json").read_text())
    heavy = sorted((i for i in items if i.nodeid in known), key=lambda i: -known[i.nodeid])
    light = [i for i in items if i.nodeid not in known]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in heavy:
        k = loads.index(min(loads))
        shares[k].append(item)
        loads[k] += known[item.nodeid]
    # worksteal sends share k len(pending) // (workers - k) of what is left: fill each to that size
    ordered: list[pytest.Item] = []
    left = len(items)
    for k, share in enumerate(shares):
        size = max(left // (workers - k), len(share))
        take = size - len(share)
        ordered += share + light[:take]
        light = light[take:]
        left -= size
    items[:] = ordered + light


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpufeed's default cache directory, for every test: one under pytest's temporary root (shared by the
    session, so generated data is made once), never the user's own ~/.cache/gpufeed."""
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "gpufeed-cache"))


@pytest.fixture(params=_DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def indexed_images(n: int, channels: int = 3, size: int = 8) -> torch.Tensor:
    """uint8 images whose every pixel encodes the sample index (mod 256) plus its position.

    Sample i has channel 0 filled with i % 256 and channel 1 with i // 256, so a batch can be
    mapped back to the indices it came from; channel 2 varies by pixel so crops and flips show.
    """
    x = torch.zeros(n, channels, size, size, dtype=torch.uint8)
    idx = torch.arange(n)
    x[:, 0] = (idx % 256).to(torch.uint8).view(n, 1, 1)
    if channels > 1:
        x[:, 1] = (idx // 256).to(torch.uint8).view(n, 1, 1)
    if channels > 2:
        x[:, 2] = torch.arange(size * size, dtype=torch.uint8).view(size, size)
    return x


def decode_indices(batch: torch.Tensor) -> list[int]:
    """Inverse of :func:`indexed_images` for an untransformed batch."""
    b = batch.cpu().long()
    return (b[:, 0, 0, 0] + 256 * b[:, 1, 0, 0]).tolist()


@pytest.fixture(scope="session")
def synthetic_cifar10(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default synthetic CIFAR-10 (50,000 + 10,000 samples, seed 0) where every test's gpufeed finds it by
    default. Generated once per run (8 s): under pytest-xdist the workers share the session's root, where
    gpufeed's own build lock lets one generate while the others wait, and each copies it (a fraction of a
    second)."""
    import os

    from gpufeed.data.synthetic import write_synthetic_cifar10

    name = "synthetic-cifar10-0-50000-10000"
    root = tmp_path_factory.getbasetemp() / "gpufeed-cache" / "data" / name
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return write_synthetic_cifar10(root)
    if not root.exists():
        copy_synthetic_cifar10(write_synthetic_cifar10(tmp_path_factory.getbasetemp().parent / name), root)
    return root


def copy_synthetic_cifar10(source: Path, root: Path) -> Path:
    """A copy of the generated files (``source``: the fixture's root) under ``root``, as generating them there
    would leave them: for tests about what a command does with data, not about generating it."""
    shutil.copytree(source / "cifar-10-batches-py", root / "cifar-10-batches-py")
    return root


def home_with_synthetic_cifar10(source: Path, home: Path) -> Path:
    """``home`` as a gpufeed cache directory that already holds the default synthetic CIFAR-10."""
    copy_synthetic_cifar10(source, home / "data" / source.name)
    return home
