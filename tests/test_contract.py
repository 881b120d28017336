"""One contract for both loaders accelerate returns -- the batched DeviceLoader and the per-sample
FallbackLoader: order, exactly once, sharding across ranks, set_epoch, resume mid-epoch bit for bit."""

from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import Dataset

import gpufeed as gf

BATCHED = T.Compose([T.RandomCrop(8, padding=2), T.RandomHorizontalFlip(), T.ToTensor()])
PER_SAMPLE = T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()])  # not batched: the fallback runs it


class Numbered(Dataset):
    """PIL images whose label is their index, so every batch can be traced to its samples."""

    def __init__(self, n, transform):
        rng = np.random.default_rng(0)
        self.images = [Image.fromarray(a) for a in rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)]
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        return (self.transform(image) if self.transform is not None else image), i


LOADERS = {
    "device": dict(transform=BATCHED),
    "fallback": dict(transform=PER_SAMPLE, fallback="prefetch", num_workers=0),
    "fallback, 2 workers": dict(transform=PER_SAMPLE, fallback="prefetch", num_workers=2),
}


def make(kind, n=23, **kw):
    options = dict(LOADERS[kind])
    ds = Numbered(n, options.pop("transform"))
    kw = {"batch_size": 4, "device": "cpu", "seed": 3, "cache": False, "progress": False, **options, **kw}
    with pytest.warns(UserWarning, match="falls back") if "fallback" in options else nullcontext():
        loader = gf.accelerate(ds, **kw)
    assert isinstance(loader, gf.FallbackLoader) == ("fallback" in options)
    return loader


def labels(batches):
    return [i for _, y in batches for i in y.tolist()]


@pytest.mark.parametrize("kind", list(LOADERS))
def test_every_sample_once_per_epoch_in_the_shared_order(kind):
    loader = make(kind)
    first, second = list(loader), list(loader)
    assert sorted(labels(first)) == list(range(23)) == sorted(labels(second))
    assert labels(first) != labels(second)  # each pass is the next epoch, reshuffled
    assert labels(first) == gf.sampling.epoch_order(3, 0, 23).tolist()  # the same order for both loaders
    assert [x.shape[0] for x, _ in first] == [4, 4, 4, 4, 4, 3]


@pytest.mark.parametrize("kind", list(LOADERS))
@pytest.mark.parametrize("even", [True, False])
def test_ranks_take_disjoint_shares_that_cover_the_epoch(kind, even):
    batches = [list(make(kind, rank=r, world_size=3, even=even)) for r in range(3)]
    shares = [labels(b) for b in batches]
    every = [i for share in shares for i in share]
    if even:  # the same number of batches on every rank, padded with repeats
        assert len({len(b) for b in batches}) == 1 and set(every) == set(range(23))
        assert 0 <= len(every) - 23 < 3 * 4
    else:  # each sample exactly once
        assert sorted(every) == list(range(23))


@pytest.mark.parametrize("kind", list(LOADERS))
def test_set_epoch_replays_an_epoch_exactly(kind):
    loader = make(kind)
    loader.set_epoch(2)
    a = list(loader)
    loader.set_epoch(2)
    b = list(loader)
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_state_saved_mid_epoch_resumes_bit_for_bit_in_a_fresh_loader(kind):
    run = make(kind)
    list(run)  # epoch 0
    it = iter(run)
    seen = [next(it) for _ in range(2)]
    state = run.state_dict()
    rest = list(it)
    assert (state["epoch"], state["batch"]) == (1, 2)
    fresh = make(kind)
    fresh.load_state_dict(state)
    resumed = list(fresh)
    assert len(resumed) == len(rest) == 4 and len(seen) == 2
    for (x, y), (u, v) in zip(resumed, rest, strict=True):
        assert torch.equal(x, u) and torch.equal(y, v)  # augmentation included
    after, expected = list(fresh), list(run)  # and both go on with epoch 2 alike
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(after, expected, strict=True))
    other = "fallback" if kind == "device" else "device"
    with pytest.raises(gf.StateError, match="saved by a"):
        make(other).load_state_dict(state)


@pytest.mark.parametrize("kind", list(LOADERS))
def test_an_iterator_thrown_away_unused_costs_no_epoch(kind):
    loader = make(kind)
    it = iter(loader)  # what Lightning does to check a loader
    del it
    assert labels(list(loader)) == gf.sampling.epoch_order(3, 0, 23).tolist()
    assert loader.state_dict()["epoch"] == 1


def position(loader):
    state = loader.state_dict()
    return state["epoch"], state["batch"]


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_loop_that_breaks_early_ends_its_epoch_and_the_state_says_what_comes_next(kind):
    loader = make(kind)
    for step, _ in enumerate(loader):
        assert position(loader) == (0, step + 1)
        if step == 1:
            break  # limit_train_batches, or `if step == limit: break` then save_state
    assert position(loader) == (1, 0)
    saved = loader.state_dict()
    resumed = make(kind)
    resumed.load_state_dict(saved)
    assert labels(list(resumed)) == labels(list(loader)) == gf.sampling.epoch_order(3, 1, 23).tolist()


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_second_iteration_during_a_loop_is_a_side_pass_that_costs_nothing(kind):
    loader = make(kind)
    epoch0 = gf.sampling.epoch_order(3, 0, 23).tolist()
    seen, peeked = [], None
    for step, (_, y) in enumerate(loader):
        seen += y.tolist()
        if step == 1:
            peeked = next(iter(loader))[1].tolist()  # log a sample batch mid-epoch
            assert position(loader) == (0, 2)
    assert seen == epoch0 and peeked == epoch0[:4] and position(loader) == (1, 0)
    pairs = list(zip(loader, loader, strict=True))  # two passes at once: the same epoch, in step
    assert len(pairs) == 6 and all(torch.equal(a[1], b[1]) for a, b in pairs)
    assert labels(a for a, _ in pairs) == gf.sampling.epoch_order(3, 1, 23).tolist() and position(loader) == (2, 0)


@pytest.mark.parametrize("kind", list(LOADERS))
def test_set_epoch_during_a_loop_does_not_cut_it_short(kind):
    loader = make(kind)
    seen = []
    for step, (_, y) in enumerate(loader):
        seen += y.tolist()
        if step == 1:
            loader.set_epoch(4)
            assert position(loader) == (4, 0)
    assert seen == gf.sampling.epoch_order(3, 0, 23).tolist() and position(loader) == (4, 0)
    assert labels(list(loader)) == gf.sampling.epoch_order(3, 4, 23).tolist()


@pytest.mark.parametrize("kind", list(LOADERS))
def test_set_epoch_keeps_a_position_loaded_for_that_epoch_and_can_start_further_in(kind):
    reference = make(kind)
    reference.set_epoch(1)
    epoch1 = list(reference)
    state = {**reference.state_dict(), "epoch": 1, "batch": 2}
    loader = make(kind)
    loader.load_state_dict(state)
    loader.sampler.set_epoch(1)  # what Lightning calls at the start of every epoch, resumed ones too
    assert labels(list(loader)) == labels(epoch1[2:])
    loader.load_state_dict(state)
    loader.set_epoch(2)  # the trainer moved on: the loaded position is not for this epoch
    assert loader.state_dict()["batch"] == 0
    loader.set_epoch(1, batch=4)  # what accelerator.skip_first_batches(loader, 4) does for a DataLoader
    assert labels(list(loader)) == labels(epoch1[4:])
    with pytest.raises(gf.ConfigError, match="past the end of an epoch of 6 batches"):
        loader.set_epoch(1, batch=7)


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_state_saved_on_one_rank_resumes_another(kind):
    ranks = [make(kind, rank=r, world_size=2) for r in range(2)]
    running = [iter(loader) for loader in ranks]  # mid-epoch on both ranks
    for it in running:
        next(it), next(it)
    state = ranks[0].state_dict()  # what Lightning and Accelerate save: rank 0's
    expected = list(running[1])  # rank 1's remaining batches
    fresh = make(kind, rank=1, world_size=2)
    fresh.load_state_dict(state)
    got = list(fresh)
    assert len(got) == len(expected) == 1
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(got, expected, strict=True))


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_loader_for_one_process_is_refused_in_a_group_of_several(kind, monkeypatch):
    import torch.distributed as dist

    loader = make(kind)  # built before the process group
    given = make(kind, rank=0, world_size=1)  # every rank gets everything, on purpose
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)  # DataLoader asks too
    with pytest.raises(gf.ConfigError, match="group of 4 processes: every rank would train on every sample"):
        next(iter(loader))
    assert len(list(given)) == 6
