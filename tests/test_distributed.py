"""Sharded loading: every rank from the same global order, disjoint shares, distinct augmentation, resume."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from gpufeed import ConfigError, DeviceLoader, StateError
from gpufeed.augment import Compose, RandomCrop, RandomHorizontalFlip
from gpufeed.sampling import epoch_order, rank_indices

from conftest import decode_indices, indexed_images

AUG = Compose([RandomCrop(8, padding=2), RandomHorizontalFlip()])


def _ranks(n=103, world=3, **kw):
    kw.setdefault("batch_size", 8)
    return [
        DeviceLoader(
            indexed_images(n), torch.arange(n), device="cpu", seed=7, dtype=None, rank=r, world_size=world, **kw
        )
        for r in range(world)
    ]


def _seen(loader):
    return [decode_indices(x) for x, _ in loader]


def test_evaluation_mode_yields_every_sample_exactly_once_across_ranks():
    loaders = _ranks(even=False)
    shares = [sum(_seen(lo), []) for lo in loaders]
    assert sorted(sum(shares, [])) == list(range(103))
    assert max(len(lo) for lo in loaders) - min(len(lo) for lo in loaders) <= 1


def test_training_mode_gives_every_rank_the_same_number_of_batches():
    for drop_last in (False, True):
        loaders = _ranks(drop_last=drop_last)
        batches = [_seen(lo) for lo in loaders]
        assert len({len(b) for b in batches}) == 1 == len({len(lo) for lo in loaders})
        flat = sum((sum(b, []) for b in batches), [])
        if drop_last:
            assert len(flat) == len(set(flat)) and 103 - len(flat) < 3 * 8
        else:
            assert set(flat) == set(range(103)) and len(flat) - 103 < 3 * 8


def test_every_rank_takes_its_slots_of_one_global_order():
    loaders = _ranks()
    order = epoch_order(7, 0, 103)
    for r, lo in enumerate(loaders):
        assert sum(_seen(lo), []) == rank_indices(order, 8, r, 3, drop_last=False, even=True).tolist()


def test_epochs_differ_and_set_epoch_is_honoured():
    lo = _ranks()[1]
    first, second = sum(_seen(lo), []), sum(_seen(lo), [])
    assert first != second
    lo.set_epoch(0)
    assert sum(_seen(lo), []) == first


def test_augmentation_streams_differ_between_ranks():
    same = torch.zeros(64, 3, 8, 8, dtype=torch.uint8)
    same[:, :, 2:6, 2:6] = 200
    outs = [
        next(
            iter(
                DeviceLoader(
                    same,
                    torch.zeros(64, dtype=torch.long),
                    batch_size=32,
                    shuffle=False,
                    transform=AUG,
                    device="cpu",
                    rank=r,
                    world_size=2,
                )
            )
        )[0]
        for r in range(2)
    ]
    assert not torch.equal(outs[0], outs[1])


def test_each_rank_resumes_its_part_of_the_global_sequence():
    kw = dict(transform=AUG, chunk_batches=2)
    for r in range(3):
        full = list(_ranks(**kw)[r])
        run = _ranks(**kw)[r]
        it = iter(run)
        for _ in range(3):
            next(it)
        state = run.state_dict()
        resumed = _ranks(**kw)[r]
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(full) - 3
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, full[3:], strict=True))


def test_a_changed_world_size_is_refused_with_the_way_forward():
    state = _ranks(world=4)[0].state_dict()
    # a fresh loader's state points at epoch 0's start: that epoch is the way forward, whole
    with pytest.raises(StateError, match=r"world_size=4 but this run has world_size=3.*set_epoch\(0\)"):
        _ranks(world=3)[0].load_state_dict(state)


def test_local_shards_hold_a_fraction_and_shuffle_within_it():
    loaders = _ranks(shard="local", even=False)
    assert [lo.images.shape[0] for lo in loaders] == [35, 34, 34]
    shares = [sorted(sum(_seen(lo), [])) for lo in loaders]
    assert shares == [list(range(r, 103, 3)) for r in range(3)]  # samples never change rank
    # Batches of 17: 35 local samples make 3 batches, 34 make 2 full ones; even mode pads those to 3.
    trained = _ranks(shard="local", batch_size=17)
    assert [len(lo) for lo in trained] == [3, 3, 3] == [len(list(lo)) for lo in trained]
    uneven = _ranks(shard="local", batch_size=17, even=False)
    assert [len(list(lo)) for lo in uneven] == [3, 2, 2]


def test_padded_evaluation_gives_every_rank_the_same_full_batches_and_says_which_samples_are_real():
    loaders = _ranks(n=101, world=2, even="pad", shuffle=False)
    batches = [_seen(lo) for lo in loaders]
    assert [len(lo) for lo in loaders] == [len(b) for b in batches] == [7, 7]  # a collective per batch never waits
    assert all(len(batch) == 8 for b in batches for batch in b)  # full batches: a gather concatenates them
    assert [lo.real_counts for lo in loaders] == [(8,) * 6 + (5,), (8,) * 6 + (0,)]
    rounds = [b[j][: lo.real_counts[j]] for j in range(7) for b, lo in zip(batches, loaders, strict=True)]
    assert sum(rounds, []) == list(range(101))  # the real parts, round by round: every sample once, in order
    assert batches[0][-1][5:] == [0, 1, 2] and batches[1][-1] == list(range(3, 11))  # the repeats: the order's start


def test_real_counts_follow_an_evaluation_resumed_part_way_as_enumerate_counts_it():
    # The README's plain loop: for i, (x, y) in enumerate(loader): keep y[: loader.real_counts[i]].
    def kept(loader):
        return sum((y[: loader.real_counts[i]].tolist() for i, (_, y) in enumerate(loader)), [])

    loaders = _ranks(n=101, world=2, even="pad", shuffle=False)
    whole = [kept(lo) for lo in loaders]
    assert sorted(whole[0] + whole[1]) == list(range(101))
    for r, lo in enumerate(_ranks(n=101, world=2, even="pad", shuffle=False)):
        it = iter(lo)
        first = [next(it)[1][: lo.real_counts[i]].tolist() for i in range(3)]
        state = lo.state_dict()
        fresh = _ranks(n=101, world=2, even="pad", shuffle=False)[r]
        fresh.load_state_dict(state)
        assert sum(first, []) + kept(fresh) == whole[r]  # the repeats of the last batch are not counted as real


def test_the_per_sample_fallback_pads_evaluation_as_the_batched_loader_does():
    import warnings

    import torchvision.transforms.v2 as v2
    from torch.utils.data import TensorDataset

    import gpufeed as gf

    ds = TensorDataset(indexed_images(11), torch.arange(11))
    tf = v2.Compose([v2.ElasticTransform(alpha=1.0, sigma=1.0), v2.ToDtype(torch.float32, scale=True)])  # not batched
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        loaders = [
            gf.accelerate(
                ds,
                batch_size=4,
                shuffle=False,
                device="cpu",
                transform=tf,
                cache=False,
                progress=False,
                fallback="prefetch",
                num_workers=0,
                rank=r,
                world_size=2,
                even="pad",
            )
            for r in range(2)
        ]
    assert all(type(lo).__name__ == "FallbackLoader" for lo in loaders)
    assert [[y.tolist() for _, y in lo] for lo in loaders] == [
        [[0, 1, 2, 3], [8, 9, 10, 0]],
        [[4, 5, 6, 7], [1, 2, 3, 4]],
    ]
    assert [lo.real_counts for lo in loaders] == [(4, 3), (4, 0)]


def test_padded_evaluation_refuses_what_would_hide_or_drop_samples():
    with pytest.raises(ConfigError, match=r"even='pad' .*drop_last=True"):
        _ranks(world=2, even="pad", drop_last=True)
    with pytest.raises(ConfigError, match=r"even='pad' with shard='local'"):
        _ranks(world=2, even="pad", shard="local")
    with pytest.raises(ConfigError, match=r"even='eval' must be True"):
        _ranks(world=2, even="eval")


def test_rank_and_world_size_go_together():
    with pytest.raises(ConfigError, match="give both or neither"):
        DeviceLoader(indexed_images(4), torch.arange(4), device="cpu", rank=1)
    with pytest.raises(ConfigError, match=r"rank=3 must be in \[0, world_size=2\)"):
        DeviceLoader(indexed_images(4), torch.arange(4), device="cpu", rank=3, world_size=2)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _iterate_in_a_group_of_two(rank, port, copied, out):
    """Runs in each of 2 spawned processes: iterate loaders copied from the parent and loaders built here."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        here = {
            "here, rank 0 of 2": DeviceLoader(
                indexed_images(20), torch.arange(20), batch_size=4, device="cpu", dtype=None, rank=0, world_size=2
            ),
            "here, rank 0 of 3": DeviceLoader(
                indexed_images(20), torch.arange(20), batch_size=4, device="cpu", dtype=None, rank=0, world_size=3
            ),
        }
        results = {}
        for name, loader in {**copied, **here}.items():
            try:
                results[name] = len(sum(_seen(loader), []))
            except ConfigError as e:
                results[name] = str(e)
    finally:
        dist.destroy_process_group()
    (Path(out) / f"{rank}.json").write_text(json.dumps(results))


@pytest.mark.slow
def test_a_loader_with_rank_and_world_size_copied_into_other_ranks_is_refused_there(tmp_path):
    # Lightning's ddp_spawn pickles a loader built in the parent into every rank; with rank=0, world_size=2 given
    # there, both ranks would train on rank 0's share.
    import torch.multiprocessing as mp

    def build(**kw):
        return DeviceLoader(indexed_images(20), torch.arange(20), batch_size=4, device="cpu", dtype=None, **kw)

    copied = {
        "copied, rank 0 of 2": build(rank=0, world_size=2),
        "copied, rank 0 of 3": build(rank=0, world_size=3),
        "copied, world 1": build(rank=0, world_size=1),  # every rank everything, on purpose
    }
    context = mp.spawn(_iterate_in_a_group_of_two, (_free_port(), copied, str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 240  # generous: a hang must fail the test, not stall the suite
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):  # returns as each process ends
        if time.monotonic() > deadline:
            for proc in context.processes:
                proc.kill()
            pytest.fail("the spawned ranks did not finish in 240 s")
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert [r["copied, world 1"] for r in results] == [20, 20]
    assert results[0]["copied, rank 0 of 2"] == results[0]["here, rank 0 of 2"] == 12  # rank 0's own share
    assert results[0]["here, rank 0 of 3"] == results[1]["here, rank 0 of 3"] == 8  # a subgroup set on purpose
    copied_msg = (
        "DeviceLoader was built in another process and copied here (as Lightning's ddp_spawn does) with rank=0, "
        "world_size={world}, but it is iterated by rank {rank} of a process group of 2: ranks would train on the "
        "same share"
    )
    assert results[1]["copied, rank 0 of 2"].startswith(f"this {copied_msg.format(world=2, rank=1)}")
    for r in range(2):
        assert results[r]["copied, rank 0 of 3"].startswith(f"this {copied_msg.format(world=3, rank=r)}")
        assert "leave rank= and world_size= out" in results[r]["copied, rank 0 of 3"]
    assert results[1]["here, rank 0 of 2"].startswith(
        "this DeviceLoader was built with rank=0, world_size=2, but it is iterated by rank 1 of a process group of 2"
    )


_WORKER = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from conftest import decode_indices, indexed_images
    from gpufeed import DeviceLoader
    dist.init_process_group("gloo")
    loader = DeviceLoader(indexed_images(50), torch.arange(50), batch_size=4, device="cpu", dtype=None, seed=3,
                          even=False)
    mine = [i for x, _ in loader for i in decode_indices(x)]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        json.dump({{"world": dist.get_world_size(), "shares": everyone, "len": len(loader)}}, open({out!r}, "w"))
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_rank_and_world_size_come_from_torch_distributed_under_torchrun(tmp_path):
    import json

    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(tests=str(Path(__file__).parent), out=str(tmp_path / "out.json")))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "3",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(script),
    ]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["world"] == 3
    assert sorted(sum(result["shares"], [])) == list(range(50))
    order = epoch_order(3, 0, 50)
    assert result["shares"] == [rank_indices(order, 4, r, 3, False, False).tolist() for r in range(3)]
