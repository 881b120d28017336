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
N, N_EVAL = 40, 26


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


def test_lightning_can_inspect_a_gpufeed_loader_as_an_evaluation_loader():
    # Lightning reads `batch_sampler` of every evaluation loader (to warn if it shuffles); it used to raise
    # AttributeError before the first batch.
    import torch
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled

    import gpufeed as gf

    loader = gf.DeviceLoader(torch.zeros(6, 1, 2, 2, dtype=torch.uint8), torch.arange(6), batch_size=4, device="cpu")
    assert loader.batch_sampler is None and _is_dataloader_shuffled(loader) is False


def _evaluation_runs(out, ranks):
    return [json.loads((out / f"eval-{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow
def test_validation_every_half_epoch_test_and_predict_each_see_the_dataset_once_in_one_process(tmp_path):
    run = _run(tmp_path, "--epochs", "1", "--evaluate")
    assert run.returncode == 0, run.stderr[-3000:]
    (record,) = _evaluation_runs(tmp_path, 1)
    everything = list(range(N_EVAL))  # shuffle=False: the dataset in order, each sample once, nothing repeated
    stages = ["val", "val", "test", "predict"]  # 10 training batches, validation every 5
    assert record["evaluation"] == [[stage, everything, everything] for stage in stages]
    assert record["metrics"] == {"val_real": N_EVAL, "test_real": N_EVAL}


@pytest.mark.slow
def test_under_ddp_evaluation_loaders_share_the_dataset_out_once_with_known_padding(tmp_path):
    run = _run(tmp_path, "--epochs", "1", "--evaluate", "--devices", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    records = _evaluation_runs(tmp_path, 2)
    runs = [[stage for stage, *_ in r["evaluation"]] for r in records]
    assert runs == [["val", "val", "test", "predict"]] * 2  # 5 training batches per rank, validation every 2.5
    for i, stage in enumerate(runs[0]):
        served = [r["evaluation"][i][1] for r in records]
        kept = [r["evaluation"][i][2] for r in records]
        assert sorted(kept[0] + kept[1]) == list(range(N_EVAL)), stage  # the real samples: each once
        if stage == "val":  # even="pad": 4 full batches on each rank, the last 6 samples repeats of the first
            assert [len(s) for s in served] == [16, 16]
            assert served[0][14:] == [0, 1] and served[1][12:] == [2, 3, 4, 5]
        else:  # even=False, as Lightning's predict sampler: no repeats, 14 and 12 samples
            assert served == kept and [len(s) for s in served] == [14, 12]
    # Metrics logged with sync_dist: the real samples summed over steps and ranks, on every rank.
    assert [r["metrics"] for r in records] == [{"val_real": N_EVAL, "test_real": N_EVAL}] * 2
