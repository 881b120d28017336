"""One contract for both loaders accelerate returns -- the batched DeviceLoader and the per-sample
FallbackLoader: order, exactly once, sharding across ranks, set_epoch, states across ranks and trainers (resume
mid-epoch bit for bit: the contract in test_resume_contract.py)."""

from collections import Counter
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
    # 23 samples in batches of 4: 6 batch slots, 2 per rank; even=True also gives every rank's batches the same
    # shapes (a gather per batch fits), so the last slot is filled with the order's first sample
    shares = [[labels([b]) for b in make(kind, rank=r, world_size=3, even=even)] for r in range(3)]
    every = [i for share in shares for batch in share for i in batch]
    order = gf.sampling.epoch_order(3, 0, 23).tolist()  # slot j of the shared order goes to rank j % 3
    assert Counter(every) == Counter(range(23)) + (Counter(order[:1]) if even else Counter())  # disjoint, covering
    last = order[20:23] + (order[:1] if even else [])
    assert shares == [[order[0:4], order[12:16]], [order[4:8], order[16:20]], [order[8:12], last]]


@pytest.mark.parametrize("kind", list(LOADERS))
def test_even_ranks_fill_equal_full_batches_with_the_orders_start_and_share_nothing_else(kind):
    # 17 samples in batches of 4 for 3 ranks: even=True serves the whole order, then its first 7 samples again, so
    # every rank has 2 full batches (the same shapes everywhere: a gather per batch fits), the repeats at the end
    shares = [[labels([b]) for b in make(kind, n=17, rank=r, world_size=3, even=True)] for r in range(3)]
    every = [i for share in shares for batch in share for i in batch]
    order = gf.sampling.epoch_order(3, 0, 17).tolist()
    assert Counter(every) == Counter(range(17)) + Counter(order[:7])  # each sample once, the 7 repeats twice
    assert shares == [[order[0:4], order[12:16]], [order[4:8], order[16:17] + order[0:3]], [order[8:12], order[3:7]]]


@pytest.mark.parametrize("kind", list(LOADERS))
def test_set_epoch_replays_an_epoch_exactly(kind):
    loader = make(kind)
    loader.set_epoch(2)
    a = list(loader)
    loader.set_epoch(2)
    b = list(loader)
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["device", "fallback"])
def test_a_state_of_the_other_loader_is_refused(kind):
    # (a state resumes bit for bit in a fresh loader of its own kind: test_resume_contract.py)
    state = make(kind).state_dict()
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
def test_a_state_saved_after_a_break_resumes_in_a_trainer_that_ended_that_epoch_early(kind):
    # The preemption pattern (a flag, a break, a saved state) resumes that epoch's rest: test_resume_contract.py.
    # limit_train_batches: a trainer that ends epochs early moves on with set_epoch(e + 1) and skips the rest.
    loader = make(kind)
    for step, _ in enumerate(loader):
        if step == 1:
            break
    shortened = make(kind)
    shortened.load_state_dict(loader.state_dict())
    shortened.sampler.set_epoch(1)
    assert labels(list(shortened)) == gf.sampling.epoch_order(3, 1, 23).tolist()


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


@pytest.mark.parametrize("kind", list(LOADERS))
def test_loader_epoch_reads_the_epoch_being_served_through_its_last_batch(kind):
    loader = make(kind)
    seen = [(loader.epoch, position(loader)) for _ in loader]
    assert seen == [(0, (0, b)) for b in range(1, 6)] + [(0, (1, 0))]  # the last batch is still epoch 0's
    assert loader.epoch == 1
    it = iter(loader)
    for _ in range(6):
        next(it)  # every batch of epoch 1 handed out, the iterator not yet exhausted
    assert loader.epoch == 1 and labels(list(loader)) == gf.sampling.epoch_order(3, 2, 23).tolist()


def _other_data(kind):
    """The same length, another dataset: Numbered's images drawn from another seed."""
    options = dict(LOADERS[kind])
    ds = Numbered(23, options.pop("transform"))
    rng = np.random.default_rng(1)
    ds.images = [Image.fromarray(a) for a in rng.integers(0, 256, (23, 8, 8, 3), dtype=np.uint8)]
    if kind != "device":
        ds = type("OtherNumbered", (Numbered,), {})(23, ds.transform)  # the fallback names the dataset's class
    kw = {"batch_size": 4, "device": "cpu", "seed": 3, "cache": False, "progress": False, **options}
    with pytest.warns(UserWarning, match="falls back") if "fallback" in options else nullcontext():
        return gf.accelerate(ds, **kw)


@pytest.mark.parametrize("kind", list(LOADERS))
def test_a_state_of_other_data_or_another_pipeline_is_refused_naming_what_differs(kind):
    run = make(kind)
    it = iter(run)
    next(it), next(it)
    state = run.state_dict()
    per_sample = kind != "device"
    crop = (
        T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.RandomCrop(6), T.ToTensor()])
        if per_sample
        else (T.Compose([T.RandomCrop(6, padding=2), T.RandomHorizontalFlip(), T.ToTensor()]))
    )
    no_flip = (
        T.Compose([T.ElasticTransform(alpha=5.0, sigma=1.0), T.ToTensor()])
        if per_sample
        else (T.Compose([T.RandomCrop(8, padding=2), T.ToTensor()]))
    )
    others = {
        "another crop size": (make(kind, transform=crop), "transform="),
        "no flip": (make(kind, transform=no_flip), "transform="),
        "another dtype": (make(kind, dtype=torch.float16), "dtype='torch.float16'"),
        "channels_last": (make(kind, channels_last=True), "channels_last=True"),
        "another dataset of the same length": (_other_data(kind), "OtherNumbered" if per_sample else "pixels="),
    }
    for name, (other, names) in others.items():
        with pytest.raises(gf.StateError, match="belongs to other data or another pipeline") as error:
            other.load_state_dict(state)
        assert names in str(error.value) and "strict=False" in str(error.value), name
    changed, _ = others["another dtype"]
    changed.load_state_dict(state, strict=False)  # changed on purpose: the position is kept
    assert labels(list(changed)) == gf.sampling.epoch_order(3, 0, 23).tolist()[8:]
    changed.strict_state = False  # for a trainer that calls load_state_dict(state) itself
    changed.load_state_dict(state)
    assert position(changed) == (0, 2)
    legacy = {k: v for k, v in state.items() if k != "fingerprint"}  # saved before gpufeed recorded it
    fresh = make(kind)
    fresh.load_state_dict(legacy)
    assert position(fresh) == (0, 2)


def test_the_device_loader_names_the_transform_where_it_differs():
    state = make("device").state_dict()
    other = make("device", transform=T.Compose([T.RandomCrop(6, padding=2), T.RandomHorizontalFlip(), T.ToTensor()]))
    with pytest.raises(
        gf.StateError,
        match=r"saved with transform='.*RandomCrop\(size=\(8, 8\).*but this loader "
        r"has transform='.*RandomCrop\(size=\(6, 6\)",
    ):
        other.load_state_dict(state)


def test_a_state_from_another_gpufeed_release_reports_a_changed_transform_description_but_checks_the_data():
    # A release may describe the same op otherwise (a new field in its repr): that alone must not strand states.
    state = make("device").state_dict()
    assert state["fingerprint"]["gpufeed"] == gf.__version__
    older = {**state, "fingerprint": {**state["fingerprint"], "gpufeed": "0.0.1", "transform": "RandomCrop(old)"}}
    with pytest.warns(UserWarning, match=r"saved by gpufeed 0\.0\.1.*check that it is the same pipeline"):
        make("device").load_state_dict(older)
    wrong_data = {**older, "fingerprint": {**older["fingerprint"], "labels": "0" * 32}}
    with pytest.raises(gf.StateError, match="labels"), pytest.warns(UserWarning):
        make("device").load_state_dict(wrong_data)


@pytest.mark.parametrize("kind", ["device", "fallback"])
def test_accelerates_skip_first_batches_is_a_typed_error_naming_set_epoch(kind):
    accelerate = pytest.importorskip("accelerate")
    loader = make(kind)
    assert not hasattr(loader, "dataset") and getattr(loader, "dataset", None) is None  # still an AttributeError
    accelerator = accelerate.Accelerator(cpu=True)
    try:
        with pytest.raises(gf.NotADataLoaderError, match=r"loader\.set_epoch\(epoch, batch=n\)"):
            accelerator.skip_first_batches(loader, 2)
    finally:
        accelerator.free_memory()
        accelerate.state.AcceleratorState._reset_state(True)
        accelerate.state.GradientState._reset_state()
    loader.set_epoch(0, batch=2)  # the way it names
    assert labels(list(loader)) == gf.sampling.epoch_order(3, 0, 23).tolist()[8:]
