"""gpufeed loaders inside PyTorch Lightning's Trainer: one process and DDP over gloo (2 CPU processes),
loader built in ``train_dataloader()`` or before ``fit``, checkpoint mid-epoch or after a shortened
epoch and resume with ``ckpt_path``. The labels are the sample indices, so every batch is traced."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

SCRIPT = str(Path(__file__).with_name("lightning_run.py"))
N = 40


def _run(out, *args):
    run = subprocess.run([sys.executable, SCRIPT, str(out), *args], capture_output=True, text=True, timeout=300)
    return run


def _traces(out, ranks):
    return [json.loads((out / f"trace-{r}.json").read_text()) for r in range(ranks)]


def _checkpoint(out, name):
    return str(out / "ckpt" / name)


def _epoch_labels(trace, epoch):
    return [label for e, _, labels, _ in trace if e == epoch for label in labels]


def _resumes_exactly(tmp_path, ranks, every, ckpt, skip, *extra):
    """Train 2 epochs saving every ``every`` steps; resume from ``ckpt``; the resumed steps equal the rest."""
    first, second = tmp_path / "first", tmp_path / "resumed"
    assert _run(first, "--devices", str(ranks), "--every", str(every), *extra).returncode == 0
    run = _run(second, "--devices", str(ranks), "--ckpt", _checkpoint(first, ckpt), *extra)
    assert run.returncode == 0, run.stderr[-3000:]
    full, resumed = _traces(first, ranks), _traces(second, ranks)
    for r in range(ranks):
        assert resumed[r] == full[r][skip:], r  # labels and pixel sums: augmentation included
    for epoch in (0, 1):  # the ranks' shares are disjoint and together cover the dataset, once
        shares = [_epoch_labels(t, epoch) for t in full]
        assert sorted(sum(shares, [])) == list(range(N))
    return full


@pytest.mark.slow
def test_one_process_resumes_mid_epoch_and_epoch_zero_is_the_loaders_epoch_zero(tmp_path):
    from gpufeed.sampling import epoch_order

    full = _resumes_exactly(tmp_path, 1, 3, "epoch=0-step=6.ckpt", 6)
    # Lightning checks the loader with an iter() it throws away: that must not cost an epoch.
    assert _epoch_labels(full[0], 0) == epoch_order(7, 0, N).tolist()
    assert _epoch_labels(full[0], 1) == epoch_order(7, 1, N).tolist()


@pytest.mark.slow
def test_ddp_on_two_processes_resumes_every_rank_from_the_saved_state(tmp_path):
    # Lightning saves rank 0's loader state only; rank 1 resumes from it.
    _resumes_exactly(tmp_path, 2, 2, "epoch=0-step=2.ckpt", 2)


@pytest.mark.slow
def test_ddp_with_the_per_sample_fallback_resumes_every_rank(tmp_path):
    _resumes_exactly(tmp_path, 2, 3, "epoch=0-step=3.ckpt", 3, "--fallback")


@pytest.mark.slow
def test_a_loader_built_before_fit_is_refused_under_ddp_unless_its_rank_is_given(tmp_path):
    run = _run(tmp_path / "outside", "--devices", "2", "--outside")
    assert run.returncode != 0 and "built before torch.distributed was initialised" in run.stderr
    assert _run(tmp_path / "explicit", "--devices", "2", "--outside", "--explicit").returncode == 0
    shares = [_epoch_labels(t, 0) for t in _traces(tmp_path / "explicit", 2)]
    assert sorted(shares[0] + shares[1]) == list(range(N))


@pytest.mark.slow
def test_a_shortened_epoch_resumes_with_the_next_epoch(tmp_path):
    first, second = tmp_path / "first", tmp_path / "resumed"
    assert _run(first, "--limit", "3", "--epochs", "3").returncode == 0  # saved at each (shortened) epoch's end
    assert (
        _run(second, "--limit", "3", "--epochs", "3", "--ckpt", _checkpoint(first, "epoch=0-step=3.ckpt")).returncode
        == 0
    )
    full, resumed = _traces(first, 1)[0], _traces(second, 1)[0]
    assert [step[:2] for step in resumed] == [[1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2]]
    assert resumed == full[3:]
