"""gpufeed loaders under Hugging Face Accelerate and a plain DDP loop, both on 2 CPU processes over gloo
(``torch.distributed.run``): state saved by one rank resumes every rank; shares are disjoint and cover
the dataset; Accelerate's gradient accumulation syncs at the end of each epoch; evaluation with a
collective every batch serves every sample once at any dataset size."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

N = 40


def _launch(script, out, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    script = str(Path(__file__).with_name(script))
    # The timeout is generous (the runs take seconds): a rank left waiting in a collective must fail, not hang.
    return subprocess.run([*cmd, script, str(out), *args], capture_output=True, text=True, timeout=300)


def _traces(out):
    return [json.loads((out / f"trace-{r}.json").read_text()) for r in range(2)]


def _check_resume(full, resumed, skip):
    for r in range(2):
        assert resumed[r] == full[r][skip:], r  # labels and pixel sums: augmentation included
    for epoch in (0, 1):
        every = [label for trace in full for e, labels, *_ in trace if e == epoch for label in labels]
        assert sorted(every) == list(range(N))  # disjoint shares that cover the dataset, each epoch


@pytest.mark.slow
@pytest.mark.parametrize("fallback", [False, True], ids=["batched", "fallback"])
def test_accelerate_save_state_on_one_rank_resumes_both_and_accumulation_syncs_at_epoch_end(tmp_path, fallback):
    pytest.importorskip("accelerate")
    extra = ["--fallback"] if fallback else []
    first = _launch("accelerate_run.py", tmp_path / "first", "--save-at", "3", *extra)
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "first" / "state").glob("custom_checkpoint_*")) == [
        "custom_checkpoint_0.pkl"
    ]  # Accelerate saves the main process's loader state only
    second = _launch("accelerate_run.py", tmp_path / "second", "--load", str(tmp_path / "first" / "state"), *extra)
    assert second.returncode == 0, second.stderr[-3000:]
    full, resumed = _traces(tmp_path / "first"), _traces(tmp_path / "second")
    _check_resume([[t[:3] for t in tr] for tr in full], [[t[:3] for t in tr] for tr in resumed], 3)
    # 5 steps an epoch, accumulation over 2: sync at steps 2 and 4, and at the epoch's last batch.
    for trace in full:
        assert [t[3:] for t in trace] == [
            [False, False],
            [True, False],
            [False, False],
            [True, False],
            [True, True],
        ] * 2


@pytest.mark.slow
def test_plain_ddp_resumes_every_rank_from_rank_zeros_state(tmp_path):
    first = _launch("torchrun_run.py", tmp_path / "first", "--save-at", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    second = _launch("torchrun_run.py", tmp_path / "second", "--load", str(tmp_path / "first" / "loader.pt"))
    assert second.returncode == 0, second.stderr[-3000:]
    _check_resume(_traces(tmp_path / "first"), _traces(tmp_path / "second"), 2)


@pytest.mark.slow
def test_a_loader_built_before_the_process_group_is_refused_when_iterated(tmp_path):
    run = _launch("torchrun_run.py", tmp_path / "out", "--before-init")
    assert run.returncode != 0
    assert "built before torch.distributed was initialised" in run.stderr and "pass rank= and world_size=" in run.stderr


def test_under_an_accelerator_a_loop_that_breaks_ends_its_epoch_and_leaves_accelerate_s_loaders():
    # Accelerate's GradientState holds the running epoch while it is its active loader; a loop that breaks
    # must still end that epoch (the next loop serves the next one) and leave GradientState.
    accelerate = pytest.importorskip("accelerate")
    import torch

    import gpufeed as gf

    accelerator = accelerate.Accelerator(cpu=True)
    try:
        images = torch.zeros(N, 1, 4, 4, dtype=torch.uint8)
        loader = gf.DeviceLoader(images, torch.arange(N), batch_size=8, device="cpu", seed=1)
        for step, _ in enumerate(loader):
            assert accelerator.gradient_state.in_dataloader
            if step == 1:
                break
        assert not accelerator.gradient_state.in_dataloader
        # the state keeps where the interrupted epoch stopped (a resumed run finishes it); this loop moves on
        assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (0, 2)
        ends = [accelerator.gradient_state.end_of_dataloader for _ in loader]
        assert ends == [False] * 4 + [True] and loader.epoch == 2
    finally:
        accelerator.free_memory()
        accelerate.state.AcceleratorState._reset_state(True)
        accelerate.state.GradientState._reset_state()


@pytest.mark.slow
def test_padded_evaluation_with_a_collective_every_batch_counts_every_sample_once_at_any_size(tmp_path):
    # even=False gives 101 samples in batches of 8 to 2 ranks as 7 and 6 batches: a collective per batch (the
    # README recipe's gather_for_metrics) waited forever. even="pad" gives 7 and 7, its repeats known.
    pytest.importorskip("accelerate")
    from gpufeed.sampling import epoch_order

    sizes = (90, 96, 101)
    run = _launch("evaluate_run.py", tmp_path, *map(str, sizes))
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"eval-{r}.json").read_text()) for r in range(2)]
    for n in sizes:
        per_rank = [r[str(n)] for r in ranks]
        for result in per_rank:  # gather_for_metrics dropped the repeats: the epoch's order, each sample once
            assert result["gathered"] == epoch_order(5, 0, n).tolist() and result["count"] == n, n
            # the default even=True too: the same shapes on both ranks (torchrun; 64 vs 20 bytes aborted gloo)
            assert result["default"] == epoch_order(5, 0, n).tolist(), n
        kept = per_rank[0]["kept"] + per_rank[1]["kept"]  # the plain loop's second pass: epoch 1
        assert sorted(kept) == list(range(n)), n
        batches = -(-n // 8)  # of the whole epoch: even="pad" gives each rank half, rounded up; even=False splits them
        assert per_rank[0]["batches"] == [[-(-batches // 2), batches - batches // 2], [-(-batches // 2), batches // 2]]
    assert ranks[0]["101"]["batches"] == [[7, 7], [7, 6]]  # where even=False left one rank waiting


def test_under_an_accelerator_a_padded_loader_tells_gather_for_metrics_what_to_drop():
    accelerate = pytest.importorskip("accelerate")
    import torch

    import gpufeed as gf

    accelerator = accelerate.Accelerator(cpu=True)
    try:
        images = torch.zeros(10, 1, 2, 2, dtype=torch.uint8)
        loader = gf.DeviceLoader(images, torch.arange(10), batch_size=4, device="cpu", shuffle=False, even="pad")
        seen = []
        for _, y in loader:
            assert accelerator.gradient_state.remainder == 2  # 10 % (1 rank * 4): Accelerate's own convention
            seen += accelerator.gather_for_metrics(y).tolist()
        assert seen == list(range(10))
        training = gf.DeviceLoader(images, torch.arange(10), batch_size=4, device="cpu")
        assert [accelerator.gradient_state.remainder for _ in training] == [-1] * 3  # unknown: keep everything
    finally:
        accelerator.free_memory()
        accelerate.state.AcceleratorState._reset_state(True)
        accelerate.state.GradientState._reset_state()
