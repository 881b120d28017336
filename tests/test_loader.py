"""DeviceLoader: coverage, order, resume (in a fresh process, mid-loop loads, refusals; the resume contract
itself: test_resume_contract.py), bad input."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed import ConfigError, DataError, DeviceError, DeviceLoader, StateError
from gpufeed.augment import Compose, Normalize, RandomCrop, RandomErasing, RandomHorizontalFlip

from conftest import decode_indices, indexed_images

AUG = Compose(
    [RandomCrop(8, padding=2), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3), RandomErasing(p=0.5)]
)


def _loader(n=50, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("device", "cpu")
    return DeviceLoader(indexed_images(n), torch.arange(n), **kw)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    bs=st.integers(1, 64),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    chunk=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_every_index_exactly_once_per_epoch(n, bs, drop_last, shuffle, chunk, seed):
    kwargs = dict(batch_size=bs, shuffle=shuffle, drop_last=drop_last, device="cpu", seed=seed, dtype=None)
    if drop_last and bs > n:  # an epoch of zero batches is refused, not served empty
        with pytest.raises(ConfigError, match="zero batches"):
            DeviceLoader(indexed_images(n), torch.arange(n), chunk_batches=chunk, **kwargs)
        return
    loader = DeviceLoader(indexed_images(n), torch.arange(n), chunk_batches=chunk, **kwargs)
    batches = list(loader)
    assert len(batches) == len(loader)
    seen = [i for x, y in batches for i in decode_indices(x)]
    assert seen == [i for _, y in batches for i in y.tolist()]  # labels travel with their images
    assert len(seen) == len(set(seen))
    if drop_last:
        assert len(seen) == (n // bs) * bs and all(x.shape[0] == bs for x, _ in batches)
    else:
        assert sorted(seen) == list(range(n))
    if not shuffle:
        assert seen == list(range(len(seen)))


def test_iterating_again_serves_the_next_epoch_with_a_new_order():
    loader = _loader()
    first = torch.cat([y for _, y in loader])
    second = torch.cat([y for _, y in loader])
    assert loader.epoch == 2
    assert not torch.equal(first, second)
    loader.set_epoch(0)
    assert torch.equal(torch.cat([y for _, y in loader]), first)


def test_order_is_a_function_of_seed_and_epoch_only():
    a, b = _loader(seed=3), _loader(seed=3, batch_size=5)
    b.set_epoch(4)
    a.set_epoch(4)
    assert torch.equal(torch.cat([y for _, y in a]), torch.cat([y for _, y in b]))


def test_batches_are_transformed_in_the_requested_dtype_and_layout():
    loader = _loader(transform=AUG, dtype=torch.bfloat16, channels_last=True)
    x, y = next(iter(loader))
    assert x.dtype == torch.bfloat16 and x.shape == (8, 3, 8, 8) and y.dtype == torch.int64
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_without_transform_uint8_becomes_float_in_zero_one():
    x, _ = next(iter(_loader(shuffle=False)))
    assert x.dtype == torch.float32
    assert torch.equal(x, indexed_images(50)[:8].float() / 255)


def test_augmentation_is_reproducible_and_differs_between_epochs():
    a, b = _loader(transform=AUG, seed=1, shuffle=False), _loader(transform=AUG, seed=1, shuffle=False)
    epoch0 = [x for x, _ in a]
    assert all(torch.equal(p, q) for p, q in zip(epoch0, [x for x, _ in b], strict=True))
    epoch1 = [x for x, _ in a]  # same samples in the same order (no shuffle), new augmentation
    assert sum(torch.equal(p, q) for p, q in zip(epoch0, epoch1, strict=True)) == 0


def test_loader_uses_no_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    list(_loader(transform=AUG))
    assert torch.equal(torch.rand(3), expected)


def test_resume_in_a_fresh_process_is_bit_exact(tmp_path):
    kw = dict(transform=AUG, chunk_batches=3, seed=11)
    loader = _loader(**kw)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    expected = torch.stack([x for x, _ in it][:2])  # the uninterrupted run's next two batches (full size)

    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from test_loader import AUG, _loader
        loader = _loader(transform=AUG, chunk_batches=3, seed=11)
        loader.load_state_dict(torch.load({str(tmp_path / "state.pt")!r}))
        it = iter(loader)
        torch.save(torch.stack([next(it)[0], next(it)[0]]), {str(tmp_path / "out.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    assert len(head) == 4
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected)


def test_load_state_dict_while_iterating_detaches_the_running_epoch():
    # accelerator.load_state mid-run: the running loop is not cut short, the next one serves the loaded position
    loader = _loader()
    reference = [y for _, y in _loader()]
    it = iter(loader)
    next(it)
    state = {**loader.state_dict(), "epoch": 3, "batch": 1}
    loader.load_state_dict(state)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (3, 1)
    rest = [y for _, y in it]
    assert all(torch.equal(a, b) for a, b in zip(rest, reference[1:], strict=True))
    assert loader.epoch == 3 and (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (3, 1)


def test_a_loader_pickles_and_deep_copies_into_an_independent_loader():
    import copy
    import pickle

    loader = _loader()
    expected = [y for _, y in _loader()]
    for twin in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        twin.sampler.set_epoch(5)  # moves the copy only
        assert twin.epoch == 5 and loader.epoch == 0
        twin.set_epoch(0)
        assert all(torch.equal(a, b) for (_, a), b in zip(twin, expected, strict=True))


@pytest.mark.parametrize("key, value", [("seed", 99), ("batch_size", 4), ("n", 7), ("version", 0), ("batch", 99)])
def test_load_state_dict_refuses_a_state_of_another_configuration(key, value):
    state = _loader().state_dict()
    state[key] = value
    with pytest.raises(StateError, match=key):
        _loader().load_state_dict(state)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(images=torch.zeros(0, 3, 8, 8, dtype=torch.uint8), labels=torch.zeros(0)), DataError, "empty"),
        (dict(images=torch.zeros(4, 8, 8, dtype=torch.uint8)), DataError, "unsqueeze"),
        (dict(images=torch.zeros(4, 3, 8, 8, dtype=torch.int32)), DataError, "dtype=torch.int32"),
        (dict(labels=torch.arange(5)), DataError, "labels has shape"),
        (dict(labels=torch.tensor([0, 1, -1, 2]), num_classes=4), DataError, r"labels\[2\]=-1 is out of range"),
        (dict(labels=torch.tensor([0, 1, 10, 2]), num_classes=10), DataError, r"labels\[2\]=10"),
        (dict(batch_size=0), ConfigError, "batch_size=0"),
        (dict(device="tpu"), DeviceError, "device='tpu'"),
        (dict(device="cuda:7"), DeviceError, "cuda"),
        (dict(transform=lambda x: x), ConfigError, "generator="),
        (dict(dtype=torch.int64), ConfigError, "dtype=torch.int64"),
    ],
)
def test_bad_input_raises_a_typed_error_naming_it(kwargs, error, match):
    args = dict(images=torch.zeros(4, 3, 8, 8, dtype=torch.uint8), labels=torch.arange(4), device="cpu")
    args.update(kwargs)
    with pytest.raises(error, match=match):
        DeviceLoader(**args)


def test_nan_in_float_images_names_the_first_bad_sample():
    images = torch.rand(6, 3, 4, 4)
    images[4, 1, 2, 2] = float("nan")
    with pytest.raises(DataError, match=r"images\[4\] contains NaN"):
        DeviceLoader(images, torch.arange(6), device="cpu")


def test_transform_that_drops_samples_is_reported_when_the_loader_is_built():
    with pytest.raises(DataError, match="keep the batch axis"):
        _loader(transform=lambda x, generator: x[:1])


def test_numpy_inputs_are_accepted_and_the_caller_data_is_not_modified():
    images = indexed_images(20).numpy()
    before = images.copy()
    loader = DeviceLoader(images, np.arange(20), batch_size=6, device="cpu", transform=AUG)
    list(loader)
    assert np.array_equal(images, before)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_epoch_does_not_synchronise_with_the_host():
    loader = DeviceLoader(
        indexed_images(4096, size=32),
        torch.arange(4096),
        batch_size=256,
        device="cuda",
        transform=Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3)]),
    )
    list(loader)  # warm-up: constants cached, allocator primed
    torch.cuda.set_sync_debug_mode("error")
    try:
        n = sum(x.shape[0] for x, _ in loader)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert n == 4096


def _tier_loader(images, storage, device):
    return DeviceLoader(
        images,
        torch.arange(images.shape[0]) % 10,
        batch_size=32,
        transform=AUG,
        device=device,
        seed=4,
        storage=storage,
        chunk_batches=2,
    )


@pytest.mark.parametrize("storage", ["pinned", "mmap"])
def test_every_storage_tier_yields_the_batches_of_the_device_tier(tmp_path, device, storage):
    images = indexed_images(150)
    path = tmp_path / "images.u8"
    mapped = np.memmap(path, dtype=np.uint8, mode="w+", shape=tuple(images.shape))
    mapped[:] = images.numpy()
    mapped.flush()
    source = (
        torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c", shape=tuple(images.shape)))
        if storage == "mmap"
        else images
    )
    expected = list(_tier_loader(images, "device", device))
    got = list(_tier_loader(source, storage, device))
    assert len(got) == len(expected) == 5
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert x.device.type == device.type and torch.equal(x, ex) and torch.equal(y, ey)


def test_storage_must_be_a_known_tier():
    with pytest.raises(ConfigError, match="storage='gpu'"):
        _tier_loader(indexed_images(4), "gpu", "cpu")


def test_a_transform_that_cannot_run_on_this_data_fails_at_construction():
    with pytest.raises(ConfigError, match="one per channel"):
        _loader(transform=Compose([Normalize([0.5, 0.5], [0.2, 0.2])]))  # 3-channel images
    with pytest.raises(ConfigError, match="larger than the padded image"):
        _loader(transform=RandomCrop(12))  # 8x8 images


def test_a_changed_world_size_advises_the_epoch_that_comes_next():
    def world(size):
        return _loader(rank=0, world_size=size)

    run = world(2)
    list(run)  # epoch 0 done: the state points at epoch 1's start, and epoch 1 is the way forward, whole
    with pytest.raises(StateError, match=r"world_size=2 but this run has world_size=3.*loader\.set_epoch\(1\)$"):
        world(3).load_state_dict(run.state_dict())
    it = iter(run)
    next(it), next(it)  # 2 batches into epoch 1: its rest cannot be mapped, epoch 2 is the next start
    with pytest.raises(StateError, match=r"set_epoch\(2\) \(the rest of epoch 1, from batch 2 on, is skipped\)"):
        world(3).load_state_dict(run.state_dict())


def test_a_state_records_the_data_it_belongs_to_and_refuses_other_labels_or_pixels():
    state = _loader().state_dict()
    assert set(state["fingerprint"]) == {"images", "pixels", "labels", "transform", "dtype", "channels_last", "gpufeed"}
    assert state["fingerprint"]["images"] == "50 images of (3, 8, 8) torch.uint8"
    shuffled = DeviceLoader(indexed_images(50), torch.arange(50).flip(0), batch_size=8, device="cpu")
    with pytest.raises(StateError, match=r"saved with labels='[0-9a-f]{16}', but this loader has labels="):
        shuffled.load_state_dict(state)
    other = indexed_images(50)
    other[49] = 255 - other[49]  # the last image is one of the sampled ones
    with pytest.raises(StateError, match=r"saved with pixels="):
        DeviceLoader(other, torch.arange(50), batch_size=8, device="cpu").load_state_dict(state)
    with pytest.raises(
        StateError,
        match=r"saved with images='50 images of \(3, 8, 8\) torch.uint8', but this "
        r"loader has images='50 images of \(3, 8, 8\) torch.float32'",
    ):
        DeviceLoader(indexed_images(50) / 255, torch.arange(50), batch_size=8, device="cpu").load_state_dict(state)


def test_a_local_shard_state_belongs_to_the_whole_dataset_so_every_rank_loads_it():
    ranks = [_loader(rank=r, world_size=2, shard="local", transform=AUG) for r in range(2)]
    it = iter(ranks[0])
    next(it)
    state = ranks[0].state_dict()
    ranks[1].load_state_dict(state)  # rank 1 holds other images, but of the same dataset
    assert (ranks[1].state_dict()["epoch"], ranks[1].state_dict()["batch"]) == (0, 1)


def _by_sample(batches: list) -> dict[int, torch.Tensor]:
    """Each served sample's augmented image, by its label (the sample's index)."""
    return {int(label): x for xb, yb in batches for x, label in zip(xb, yb, strict=True)}


def test_a_seed_draws_the_same_augmentation_at_any_chunk_size_and_world_size():
    # NOTE [ Keyed draws in every loader ]: chunk_batches is picked from the device and the image size, so a draw per
    # chunk made the CPU and a GPU augment alike-seeded runs differently (0 of 16 batches equal between 1 and 32)
    from gpufeed.augment import ColorJitter, RandomResizedCrop

    n = 48
    images = torch.randint(0, 256, (n, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(n)
    aug = Compose([RandomResizedCrop(12), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1)])

    def served(**kw) -> dict[int, torch.Tensor]:
        kw = {"seed": 7, **kw}
        loader = DeviceLoader(images, labels, batch_size=4, transform=aug, device="cpu", dtype=None, **kw)
        loader.set_epoch(2)
        return _by_sample(list(loader))

    one = served(chunk_batches=1)
    assert sorted(one) == list(range(n))
    for other in (served(chunk_batches=32), served(chunk_batches=5, drop_last=False)):
        assert all(torch.equal(one[i], other[i]) for i in range(n))
    ranks = {}
    for rank in range(3):  # three ranks share the epoch out: each sample drawn as on one rank
        ranks.update(served(chunk_batches=2, rank=rank, world_size=3, shuffle=True))
    assert sorted(ranks) == list(range(n)) and all(torch.equal(one[i], ranks[i]) for i in range(n))
    local = {}
    for rank in range(2):  # a local shard keeps each sample's own id
        local.update(served(chunk_batches=3, rank=rank, world_size=2, shard="local"))
    assert all(torch.equal(one[i], local[i]) for i in range(n))
    assert not torch.equal(one[0], served(chunk_batches=1, seed=8)[0])  # the seed still decides


def test_a_transform_that_draws_with_torchs_own_functions_is_named_with_the_fix():
    from gpufeed.augment import BatchTransform

    class Jitter(BatchTransform):  # a user's op written for a torch.Generator
        def sample(self, x, generator):
            return {"noise": torch.rand(x.shape[0], generator=generator)}

        def apply(self, x, params):
            return x

    images, labels = torch.zeros(4, 3, 4, 4, dtype=torch.uint8), torch.arange(4)
    with pytest.raises(ConfigError, match=r"passes its generator= to torch's own random functions.*params' rand"):
        DeviceLoader(images, labels, batch_size=2, transform=Jitter(), device="cpu")
