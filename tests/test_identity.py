"""What a loader state belongs to: the data fingerprint of every store kind, and how a difference is shown."""

import shutil

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import TensorDataset, random_split
from torchvision.datasets import ImageFolder

import gpufeed as gf
from gpufeed.loading.identity import data_identity, dataset_identity, describe, differences
from gpufeed.store.encoded import Encoded
from gpufeed.store.ragged import Ragged

from fakes import cifar_like, image_folder


def test_every_store_kind_is_fingerprinted_by_its_shape_and_sampled_bytes():
    dense = torch.arange(20 * 3 * 2 * 2).remainder(256).to(torch.uint8).view(20, 3, 2, 2)
    labels = torch.arange(20)
    base = data_identity(dense, labels)
    assert base == data_identity(dense.clone(), labels.clone())  # a copy is the same data
    assert base["images"] == "20 images of (3, 2, 2) torch.uint8"
    changed = dense.clone()
    changed[0, 0, 0, 0] += 1  # the first image is always sampled
    assert data_identity(changed, labels)["pixels"] != base["pixels"]
    assert data_identity(dense, labels.flip(0))["labels"] != base["labels"]

    ragged = Ragged.stack([torch.full((3, 1 + i % 3, 2), i, dtype=torch.uint8) for i in range(20)])
    r = data_identity(ragged, labels)
    assert r["images"] == "20 images of different sizes, torch.uint8" and r == data_identity(
        ragged.select(torch.arange(20)), labels
    )
    other = Ragged.stack([torch.full((3, 1 + i % 3, 2), i + (i == 19), dtype=torch.uint8) for i in range(20)])
    assert data_identity(other, labels)["pixels"] != r["pixels"]  # the last image differs: it is sampled

    data = torch.arange(60).remainder(256).to(torch.uint8)
    starts, lengths = torch.arange(0, 60, 3), torch.full((20,), 3)
    encoded = Encoded(data, starts, lengths, torch.tensor([[3, 8, 8]] * 20), torch.ones(20, dtype=torch.bool))
    e = data_identity(encoded, labels)
    assert e["images"] == "20 images of different sizes, torch.uint8"
    flipped = Encoded(data.flip(0), starts, lengths, encoded.shapes, encoded.jpeg)
    assert data_identity(flipped, labels)["pixels"] != e["pixels"]


def test_descriptions_drop_memory_addresses_and_long_differences_are_shown_where_they_start():
    def transform(x):
        return x

    assert describe(transform) == f"<function {transform.__qualname__}>"  # the same in every run
    long_a, long_b = "Compose([" + "Op(1), " * 30 + "Crop(32)])", "Compose([" + "Op(1), " * 30 + "Crop(28)])"
    (shown,) = differences({"transform": long_a, "views": 1}, {"transform": long_b, "views": 1})
    assert shown.startswith("saved with transform='...") and "Crop(32)" in shown and "Crop(28)" in shown
    assert len(shown) < 300
    assert differences({"mix": None}, {"mix": "MixUp(alpha=0.2)", "views": 2}) == [
        "saved with mix=None, but this loader has mix='MixUp(alpha=0.2)'"
    ]


def _fallback(dataset) -> gf.FallbackLoader:
    return gf.FallbackLoader(
        dataset, T.ToTensor(), 4, True, False, torch.device("cpu"), 0,
        dtype=None, channels_last=False, num_workers=0, reason="a test",
    )  # fmt: skip


def test_the_fallback_tells_apart_datasets_of_one_class_and_length():
    # The per-sample fallback reads no sample for its fingerprint, but what the dataset holds per sample (indices,
    # files, arrays, labels) tells the two halves of a random_split, or CIFAR-like arrays of another seed, apart.
    ds = cifar_like(16, seed=0)
    first, second = random_split(ds, [8, 8], generator=torch.Generator().manual_seed(0))
    state = _fallback(first).state_dict()
    for other in (second, random_split(cifar_like(16, seed=1), [8, 8], generator=torch.Generator().manual_seed(0))[0]):
        with pytest.raises(gf.StateError, match="belongs to other data"):
            _fallback(other).load_state_dict(state)
    again = _fallback(random_split(cifar_like(16, seed=0), [8, 8], generator=torch.Generator().manual_seed(0))[0])
    again.load_state_dict(state)  # the same data, rebuilt: its state loads
    assert dataset_identity(TensorDataset(torch.zeros(3, 2))) != dataset_identity(TensorDataset(torch.ones(3, 2)))


def test_a_folder_s_pixel_store_and_its_jpeg_store_are_the_same_data(tmp_path):
    # store="auto" picks the pixel store or the JPEG store by the memory budget, which differs from machine to
    # machine: a state saved with one resumes with the other (on the CPU their batches are the same).
    recipe = T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = image_folder(tmp_path / "photos", [(30, 20), (17, 25), (40, 33), (21, 21), (28, 19)], transform=recipe)
    kw = dict(batch_size=2, device="cpu", num_workers=0, progress=False, cache=False, seed=1)
    saved = gf.accelerate(ds, store="pixels", **kw)
    it = iter(saved)
    next(it)
    state, rest = saved.state_dict(), [x for x, _ in it]
    resumed = gf.accelerate(ds, store="jpeg", **kw)
    resumed.load_state_dict(state)
    assert [x.tolist() for x, _ in resumed] == [x.tolist() for x in rest]
    other = image_folder(tmp_path / "other", [(30, 20), (17, 25), (40, 33), (21, 21), (28, 19)], recipe, seed=1)
    with pytest.raises(gf.StateError, match="pixels="):
        gf.accelerate(other, store="jpeg", **kw).load_state_dict(state)  # same sizes, other pixels


def test_the_fallback_s_fingerprint_of_a_folder_survives_a_move_but_not_another_file_list(tmp_path):
    # A preempted job resumed on another machine reads the same folder from another mount.
    ds = image_folder(tmp_path / "a" / "photos", [(20, 20)] * 5)
    shutil.copytree(tmp_path / "a" / "photos", tmp_path / "b" / "photos")
    assert dataset_identity(ds) == dataset_identity(ImageFolder(str(tmp_path / "b" / "photos")))
    (tmp_path / "b" / "photos" / "class0" / "0000.png").rename(tmp_path / "b" / "photos" / "class0" / "9999.png")
    assert dataset_identity(ds) != dataset_identity(ImageFolder(str(tmp_path / "b" / "photos")))


def test_a_state_of_other_data_names_the_data_and_one_of_another_chunk_size_resumes_alike():
    from gpufeed.errors import StateError

    small = gf.DeviceLoader(torch.zeros(512, 3, 8, 8, dtype=torch.uint8), torch.zeros(512, dtype=torch.long),
                            batch_size=4, device="cpu")  # fmt: skip
    large = gf.DeviceLoader(torch.ones(512, 3, 64, 64, dtype=torch.uint8), torch.zeros(512, dtype=torch.long),
                            batch_size=4, device="cpu")  # fmt: skip
    assert small.config.chunk_batches != large.config.chunk_batches  # picked from the images' size
    it = iter(small)
    next(it)
    state = small.state_dict()
    with pytest.raises(StateError, match=r"saved with images='512 images of \(3, 8, 8\) torch.uint8', but this loader"):
        large.load_state_dict(state)
    # the same data where another chunk size is picked (another device): the state resumes the batches it left
    from gpufeed.augment import Compose, RandomCrop, RandomHorizontalFlip

    images = torch.randint(0, 256, (64, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    aug = Compose([RandomCrop(8, padding=2), RandomHorizontalFlip()])
    run = gf.DeviceLoader(images, torch.arange(64), batch_size=4, transform=aug, device="cpu", chunk_batches=8)
    it = iter(run)
    [next(it) for _ in range(5)]
    state, rest = run.state_dict(), list(it)
    elsewhere = gf.DeviceLoader(images, torch.arange(64), batch_size=4, transform=aug, device="cpu", chunk_batches=3)
    elsewhere.load_state_dict(state)
    resumed = list(elsewhere)
    assert len(resumed) == len(rest) == 11
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, resumed, strict=True))
