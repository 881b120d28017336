"""DeviceLoader over images of different sizes (a Ragged store): the same epoch contract as for a
stacked tensor -- every sample once, the same batches from every tier and shard (exact resume: the contract
in test_resume_contract.py)."""

import pytest
import torch

from gpufeed import ConfigError, DataError, DeviceLoader
from gpufeed.augment import Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop
from gpufeed.store.ragged import Ragged


def _store(n=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(20, 90, (n, 2), generator=g).tolist()
    return Ragged.stack([torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes])


def _recipe(size=32):
    return Compose([RandomResizedCrop(size), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3)])


def _epoch(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_every_sample_once_per_epoch_in_batches_of_one_size():
    store = _store()
    loader = DeviceLoader(store, torch.arange(23), batch_size=5, transform=_recipe(24), device="cpu", chunk_batches=2)
    for _ in range(2):
        batches = _epoch(loader)
        assert [tuple(x.shape) for x, _ in batches] == [(5, 3, 24, 24)] * 4 + [(3, 3, 24, 24)]
        assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(23))
        assert all(x.dtype == torch.float32 for x, _ in batches)


def test_a_ragged_store_of_equal_sizes_gives_the_stacked_store_s_batches():
    # One image size: the ragged path draws the same boxes as the tensor path. It resizes with
    # torchvision's fixed-point uint8 kernel, the tensor path in float rounded back: one level apart at most.
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (19, 3, 40, 52), dtype=torch.uint8, generator=g)
    recipe = Compose([RandomResizedCrop(28), RandomHorizontalFlip()])
    kw = dict(batch_size=4, transform=recipe, device="cpu", seed=7, chunk_batches=3, dtype=None)
    stacked = _epoch(DeviceLoader(x, torch.arange(19), **kw))
    ragged = _epoch(DeviceLoader(Ragged.stack(list(x)), torch.arange(19), **kw))
    for (a, ya), (b, yb) in zip(stacked, ragged, strict=True):
        assert torch.equal(ya, yb) and a.dtype == b.dtype == torch.uint8
        assert (a.int() - b.int()).abs().max() <= 1 and (a == b).float().mean() > 0.7


@pytest.mark.parametrize("storage", ["pinned", "mmap"])
def test_every_tier_gives_the_same_batches(storage):
    store, labels = _store(), torch.arange(23)
    kw = dict(batch_size=6, transform=_recipe(), device="cpu", seed=2)
    for (a, ya), (b, yb) in zip(
        _epoch(DeviceLoader(store, labels, **kw)),
        _epoch(DeviceLoader(store, labels, storage=storage, **kw)),
        strict=True,
    ):
        assert torch.equal(ya, yb) and torch.equal(a, b)


def test_local_shards_hold_only_their_own_images_and_cover_the_dataset():
    store, labels = _store(), torch.arange(23)
    seen = []
    for rank in range(2):
        loader = DeviceLoader(
            store,
            labels,
            batch_size=4,
            transform=_recipe(),
            device="cpu",
            rank=rank,
            world_size=2,
            shard="local",
            even=False,
        )
        assert isinstance(loader.images, Ragged) and len(loader.images) == len(range(rank, 23, 2))
        assert loader.images.data.numel() == int(store.shapes[rank::2].prod(1).sum())  # packed, not a view
        assert torch.equal(loader.images.image(1), store.image(rank + 2))
        seen += torch.cat([y for _, y in loader]).tolist()
    assert sorted(seen) == list(range(23))


def test_ragged_images_need_a_transform_that_makes_them_one_size():
    store, labels = _store(), torch.arange(23)
    with pytest.raises(ConfigError, match="starts with RandomResizedCrop"):
        DeviceLoader(store, labels, device="cpu")
    with pytest.raises(ConfigError, match="starts with RandomResizedCrop"):
        DeviceLoader(store, labels, transform=Compose([RandomHorizontalFlip(), RandomResizedCrop(8)]), device="cpu")
    with pytest.raises(DataError, match="labels has shape"):
        DeviceLoader(store, torch.arange(5), transform=_recipe(), device="cpu")
    mixed = Ragged.stack([torch.zeros(3, 20, 30, dtype=torch.uint8), torch.zeros(3, 25, 20, dtype=torch.uint8)])
    mixed = Ragged(mixed.data, mixed.starts, torch.tensor([[3, 20, 30], [1, 75, 20]]))  # a hand-built store
    with pytest.raises(DataError, match=r"ragged images with \[1, 3\] channels"):
        DeviceLoader(mixed, torch.arange(2), transform=_recipe(), device="cpu")
