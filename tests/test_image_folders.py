"""accelerate() on folders of images of different sizes (ImageFolder and the like) with the standard
training recipe: stored as they are (a ragged store), RandomResizedCrop drawing each box from its own
image, pixels within one level of the user's PIL pipeline."""

import warnings

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder

import gpufeed as gf
from gpufeed.pipeline.probe import probe_samples
from gpufeed.store.ragged import Ragged

from fakes import image_folder, snapshot

IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
SIZES = [(120, 90), (64, 80), (200, 150), (97, 61), (50, 50), (75, 130), (33, 47), (160, 90), (90, 160)]


def test_the_standard_training_recipe_runs_batched_on_a_ragged_store(tmp_path):
    recipe = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*IMAGENET)])
    ds = image_folder(tmp_path / "photos", SIZES, transform=recipe)
    before = snapshot(tmp_path / "photos")
    kw = dict(batch_size=4, device="cpu", seed=2, num_workers=0, progress=False, cache=tmp_path / "cache")
    loader = gf.accelerate(ds, **kw)
    assert isinstance(loader, gf.DeviceLoader) and isinstance(loader.images, Ragged)
    assert sorted(map(tuple, loader.images.shapes[:, 1:].tolist())) == sorted((h, w) for w, h in SIZES)
    text = str(loader.plan)
    assert "ragged: 9 images of 3 channel(s), heights 47-160, widths 33-200" in text
    assert "RandomResizedCrop(size=(40, 40)" in text and "written to the cache" in text
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert [tuple(x.shape) for x, _ in batches] == [(4, 3, 40, 40)] * 2 + [(1, 3, 40, 40)]
        assert sorted(torch.cat([y for _, y in batches]).tolist()) == sorted(ds.targets)
        epochs.append(batches)
    # The same crops and flips without Normalize (same seed, same draws): the recipe's output is torchvision's
    # Normalize of them, so a Normalize left out, or with other numbers, is caught.
    plain = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor()])
    unnormalised = gf.accelerate(ImageFolder(str(tmp_path / "photos"), transform=plain), **{**kw, "cache": False})
    for batches in epochs:
        for (x, y), (u, v) in zip(batches, unnormalised, strict=True):
            assert x.dtype == torch.float32 and torch.equal(y, v) and 0 <= u.min() and u.max() <= 1
            assert torch.allclose(x, TF.normalize(u, *IMAGENET), rtol=0, atol=1e-5)
    again = gf.accelerate(ds, **kw)  # the decode is not paid twice: the verified entry is mapped
    assert again.plan.ingest.startswith("cache hit, verified (9 samples)") and isinstance(again.images, Ragged)
    for batches in epochs:
        assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(batches, again, strict=True))
    assert snapshot(tmp_path / "photos") == before  # nothing written into the user's folder


@pytest.mark.parametrize("size", [32, (24, 40)])
def test_each_image_is_cropped_and_resized_within_one_level_of_pil(tmp_path, size):
    # ratio=(10, 10) fits no box, so torchvision falls back to a deterministic central strip: the same box
    # on both sides, whatever the random draws. PIL resizes in fixed point; one level apart at most.
    recipe = T.Compose([T.RandomResizedCrop(size, scale=(1, 1), ratio=(10, 10)), T.ToTensor()])
    ds = image_folder(tmp_path, SIZES, transform=recipe)
    loader = gf.accelerate(ds, batch_size=5, shuffle=False, device="cpu", cache=False, progress=False)
    got = torch.cat([x for x, _ in loader])
    expected = torch.stack([ds[i][0] for i in range(len(ds))])
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1 / 255 + 1e-6
    assert ((got - expected).abs() > 0.5 / 255).float().mean() < 0.01


def test_a_ragged_store_that_exceeds_the_budget_stays_in_host_memory_and_says_so(tmp_path):
    ds = image_folder(tmp_path, SIZES[:4], transform=T.Compose([T.RandomResizedCrop(16), T.PILToTensor()]))
    with pytest.warns(UserWarning, match="exceeds .* a ragged store is memory-mapped only from a cache: host memory"):
        loader = gf.accelerate(
            ds, batch_size=2, device="cpu", memory_budget=0, cache=False, progress=False, store="pixels"
        )
    assert loader.plan.storage == "device" and len(list(loader)) == 2


class _Mixed(Dataset):
    """Tensors of different sizes and channel counts: no store can hold them as one."""

    def __init__(self, transform):
        g = torch.Generator().manual_seed(0)
        self.images = [
            torch.randint(0, 256, (c, h, 30), dtype=torch.uint8, generator=g)
            for c, h in [(3, 20), (3, 25), (1, 22), (3, 30)]
        ]
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.transform(self.images[i]), i


def test_images_that_differ_in_channels_are_refused_with_the_fix():
    with pytest.raises(gf.DataError, match=r"_Mixed\[\d\] has shape \(1, 22, 30\).*convert every image to one mode"):
        gf.accelerate(_Mixed(T.RandomResizedCrop(16)), batch_size=2, device="cpu", cache=False, progress=False)


def test_images_of_different_sizes_with_a_recipe_that_needs_one_size_name_the_fix(tmp_path):
    ds = image_folder(tmp_path, SIZES[:4], transform=T.Compose([T.RandomHorizontalFlip(), T.RandomResizedCrop(16)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before any read: no warning, no ingest
        fix = r"RandomResizedCrop comes before any op that needs one size \(RandomHorizontalFlip.*\): put it first"
        with pytest.raises(gf.DataError, match=fix + ".*fallback='prefetch'"):
            gf.accelerate(ds, batch_size=2, device="cpu", cache=False, progress=False)


def _small_cnn():
    torch.manual_seed(0)  # the same initial weights for every run: only the loader differs

    def block(i, o):
        return torch.nn.Sequential(
            torch.nn.Conv2d(i, o, 3, padding=1, bias=False), torch.nn.BatchNorm2d(o), torch.nn.ReLU()
        )

    return torch.nn.Sequential(
        block(3, 32), torch.nn.MaxPool2d(2), block(32, 64), torch.nn.MaxPool2d(2), block(64, 64),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )  # fmt: skip


def _train_and_test(loader, test_set, epochs=6):
    from torch.utils.data import DataLoader

    model = _small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    total, step = epochs * len(loader), 0
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            for group in opt.param_groups:  # warm up over a quarter, then decay linearly to zero
                group["lr"] = 0.13 * min(1.0, 4 * step / total) * (1 - step / total)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    model.eval()
    with torch.no_grad():
        hits = sum(int((model(x).argmax(1) == y).sum()) for x, y in DataLoader(test_set, 100))
    return hits / len(test_set)


@pytest.mark.slow
def test_a_small_model_learns_from_a_folder_through_gpufeed_what_it_learns_through_the_dataloader(tmp_path):
    """Accuracy parity on the synthetic JPEG folder (1,000 training images about 94x125, 300 test, 6 epochs,
    RandomResizedCrop(32) + flip): same model, initial weights and schedule, only the training loader
    differs. Single runs differ by about 2 points (sd) between loader seeds; the mean of two seeds
    on each side gets a tolerance of 6 points (3 sd). Chance is 10%."""
    from torch.utils.data import DataLoader

    from gpufeed.data.folder import synthetic_folder

    norm = T.Normalize([0.5] * 3, [0.25] * 3)
    recipe = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    train_set = synthetic_folder("train", recipe, sizes=(1000, 300), root=tmp_path, scale=0.25)
    test_set = synthetic_folder("val", T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(), norm]),
                                sizes=(1000, 300), root=tmp_path, scale=0.25)  # fmt: skip
    ours, theirs = [], []
    for seed in (1, 2):
        loader = gf.accelerate(train_set, 64, shuffle=True, device="cpu", seed=seed, cache=False, progress=False)
        assert isinstance(loader.images, Ragged)
        ours.append(_train_and_test(loader, test_set))
        reference = DataLoader(train_set, 64, shuffle=True, generator=torch.Generator().manual_seed(seed))
        theirs.append(_train_and_test(reference, test_set))
    assert min(ours + theirs) > 0.6, (ours, theirs)  # learnable, well above chance
    assert abs(sum(ours) / 2 - sum(theirs) / 2) < 0.06, (ours, theirs)


def test_sizes_the_probe_did_not_see_are_kept_as_they_are(tmp_path):
    # The probe reads samples 0, n/2 and n-1: here they share a size, the others do not.
    sizes = [(60, 40), (57, 48), (60, 40), (33, 71), (60, 40)]  # (width, height), in sample order
    recipe = T.Compose([T.RandomResizedCrop(16), T.PILToTensor()])
    # ImageFolder orders the files by class (two alternating): files 0, 2, 4, 1, 3 are its samples 0-4
    folder = image_folder(tmp_path / "photos", [sizes[k] for k in (0, 3, 1, 4, 2)], transform=recipe)
    assert probe_samples(folder, None).ragged is None  # the probe sees one size
    kw = dict(batch_size=2, device="cpu", cache=False, progress=False)
    loader = gf.accelerate(folder, **kw)  # a folder goes by its files' headers
    assert isinstance(loader.images, Ragged) and len(set(map(tuple, loader.images.shapes.tolist()))) == 3
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == sorted(folder.targets)

    class Tensors(Dataset):  # not a folder: read sample by sample, the surprise found while reading
        def __init__(self):
            self.images = [torch.full((3, h, w), i, dtype=torch.uint8) for i, (w, h) in enumerate(sizes)]
            self.transform = T.RandomResizedCrop(16)

        def __len__(self):
            return len(self.images)

        def __getitem__(self, i):
            return self.transform(self.images[i]), i

    assert probe_samples(Tensors(), None).ragged is None
    loader = gf.accelerate(Tensors(), **kw)
    assert isinstance(loader.images, Ragged)
    batches = list(loader)
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(5))
    for x, y in batches:  # each output still holds its own image's value
        assert all(bool((x[k] == int(y[k])).all()) for k in range(len(y)))


def test_a_float_conversion_before_random_resized_crop_runs_on_the_ragged_store(tmp_path):
    # The old recipe order (ToTensor first): converted as they are, then cropped in float as torchvision does.
    recipe = T.Compose([T.ToTensor(), T.RandomResizedCrop(24, scale=(1, 1), ratio=(10, 10))])
    ds = image_folder(tmp_path, SIZES, transform=recipe)
    loader = gf.accelerate(ds, batch_size=9, shuffle=False, device="cpu", cache=False, progress=False)
    got = next(iter(loader))[0]
    expected = torch.stack([ds[i][0] for i in range(len(ds))])
    assert got.dtype == torch.float32 and torch.allclose(got, expected, atol=1e-6)
