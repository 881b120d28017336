"""accelerate() through torch's dataset wrappers (Subset, random_split's parts, ConcatDataset) and unknown ones.

The wrappers hold the random transform inside: read through them as they are, each sample would be stored
augmented once and every epoch would serve it again. They must take the batched path and the cache as the
datasets they wrap, and anything gpufeed cannot see through must never have its randomness frozen."""

import shutil
import warnings

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import ConcatDataset, Dataset, Subset, random_split

import gpufeed as gf
from gpufeed.errors import DataError
from gpufeed.read.wrappers import ConcatView, IndexedView, unwrap
from gpufeed.store.encoded import Encoded
from gpufeed.store.ragged import Ragged

from fakes import cifar_like, image_folder, snapshot

CIFAR = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
TRAIN = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*CIFAR)])
SIZES = [(60, 45), (32, 40), (100, 75), (48, 31), (25, 25), (37, 65), (33, 47), (80, 45), (45, 80), (50, 36)]
KW = dict(device="cpu", seed=3, num_workers=0, progress=False)


def epochs(loader, count=2):
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(count)]


def same_batches(a, b):
    return len(a) == len(b) and all(
        torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b, strict=True)
    )


def identical_across_epochs(first, second):
    """How many samples come out the same in both epochs (matched by label order with shuffle=False)."""
    x1, x2 = torch.cat([x for x, _ in first]), torch.cat([x for x, _ in second])
    return int((x1 == x2).flatten(1).all(1).sum())


def restricted_cifar(ds, indices):
    """The CIFAR10 object a user would get by holding only ``indices``: the reference for the wrappers."""
    out = cifar_like(len(indices), transform=ds.transform)
    out.data, out.targets = ds.data[indices], [ds.targets[i] for i in indices]
    return out


@pytest.mark.parametrize("wrap", ["subset", "random_split", "nested subset"])
def test_a_subset_of_arrays_takes_the_batched_path_and_augments_every_epoch_anew(wrap, tmp_path):
    ds = cifar_like(50, transform=TRAIN, seed=1)
    if wrap == "subset":
        part = Subset(ds, [7, 3, 41, 0, 19, 22, 8, 30, 11, 49, 2, 13])
    elif wrap == "random_split":
        part, _ = random_split(ds, [0.4, 0.6], generator=torch.Generator().manual_seed(5))
    else:
        part = Subset(Subset(ds, list(range(10, 50))), [9, 0, 33, 4, 17, 25, 1])
    indices = _flat_indices(part)
    loader = gf.accelerate(part, batch_size=4, shuffle=False, cache=tmp_path, **KW)
    assert isinstance(loader, gf.DeviceLoader)
    assert loader.plan.ingest.startswith("arrays read")  # the inner arrays, in one step
    assert "RandomCrop" in ", ".join(loader.plan.batched) and "Normalize" in ", ".join(loader.plan.batched)
    got = epochs(loader)
    assert torch.cat([y for _, y in got[0]]).tolist() == [ds.targets[i] for i in indices]
    # Before: every sample identical in both epochs (the augmented image stored once). A crop among 81
    # offsets and a coin flip leave a few alike at most.
    assert identical_across_epochs(*got) <= 1
    # The same batches as the dataset holding only those samples: the wrapper changes nothing but the samples.
    reference = gf.accelerate(restricted_cifar(ds, indices), batch_size=4, shuffle=False, cache=False, **KW)
    assert all(same_batches(a, b) for a, b in zip(got, epochs(reference), strict=True))


def _flat_indices(part):
    if isinstance(part.dataset, Subset):
        return [_flat_indices(part.dataset)[i] for i in part.indices]
    return [int(i) for i in part.indices]


def test_a_concat_of_arrays_datasets_is_one_dataset_of_their_samples():
    a, b = cifar_like(20, transform=TRAIN, seed=1), cifar_like(14, transform=TRAIN, seed=2)
    joined = unwrap(ConcatDataset([a, Subset(b, [3, 1, 4])]))
    assert type(joined) is type(a) and joined.transform is TRAIN
    assert np.array_equal(joined.data, np.concatenate([a.data, b.data[[3, 1, 4]]]))
    assert joined.targets == a.targets + [b.targets[i] for i in (3, 1, 4)]
    loader = gf.accelerate(ConcatDataset([a, Subset(b, [3, 1, 4])]), batch_size=8, shuffle=False, cache=False, **KW)
    reference = gf.accelerate(joined, batch_size=8, shuffle=False, cache=False, **KW)
    assert same_batches(list(loader), list(reference))
    assert len(a.data) == 20 and len(b.data) == 14  # the user's datasets are not modified


def test_concat_parts_with_different_transforms_are_refused_or_run_per_sample():
    a = cifar_like(8, transform=TRAIN, seed=1)
    b = cifar_like(8, transform=T.Compose([T.ToTensor(), T.Normalize(*CIFAR)]), seed=2)
    concat = ConcatDataset([a, b])
    with pytest.raises(DataError, match="different transforms"):
        gf.accelerate(concat, batch_size=4, cache=False, **KW)
    with pytest.warns(UserWarning, match="different transforms"):
        loader = gf.accelerate(concat, batch_size=4, shuffle=False, cache=False, fallback="prefetch", **KW)
    assert loader.plan.storage == "fallback"
    x = torch.cat([x for x, _ in loader])
    # the second part is not augmented: exactly its ToTensor + Normalize
    assert torch.equal(x[8:], torch.stack([b[i][0] for i in range(8)]))


@pytest.mark.parametrize("fallback", ["error", "prefetch"])
def test_transform_given_replaces_every_part_s_own_even_when_the_parts_differ(fallback):
    # accelerate(..., transform=) replaces the inner datasets' transforms: the parts' own, different ones neither
    # make the ConcatDataset unbatchable nor run under the given one (ToTensor twice would fail on every sample).
    a = cifar_like(8, transform=TRAIN, seed=1)
    b = cifar_like(8, transform=T.Compose([T.ToTensor(), T.Normalize(*CIFAR)]), seed=2)
    given = T.Compose([T.RandomHorizontalFlip(p=1.0), T.ToTensor()])
    loader = gf.accelerate(
        ConcatDataset([a, b]), transform=given, batch_size=4, shuffle=False, cache=False, fallback=fallback, **KW
    )
    assert isinstance(loader, gf.DeviceLoader)
    raw = torch.from_numpy(np.concatenate([a.data, b.data])).permute(0, 3, 1, 2).flip(-1).float() / 255
    assert torch.allclose(torch.cat([x for x, _ in loader]), raw)


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
@pytest.mark.parametrize("wrap", ["subset", "random_split", "concat"])
def test_a_wrapped_folder_is_stored_and_cached_as_the_folder_of_its_files(tmp_path, store, wrap):
    recipe = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*CIFAR)])
    ds = image_folder(tmp_path / "photos", SIZES, transform=recipe)
    before = snapshot(tmp_path / "photos")
    if wrap == "subset":
        part, keep = Subset(ds, [1, 2, 5, 6, 8]), [1, 2, 5, 6, 8]
    elif wrap == "random_split":
        part, _ = random_split(ds, [6, 4], generator=torch.Generator().manual_seed(0))
        keep = list(part.indices)
    else:
        part, keep = ConcatDataset([Subset(ds, [0, 3]), Subset(ds, [7, 9, 4])]), [0, 3, 7, 9, 4]
    kw = dict(batch_size=3, shuffle=False, store=store, cache=tmp_path / "cache", **KW)
    loader = gf.accelerate(part, **kw)
    assert isinstance(loader, gf.DeviceLoader) and loader.plan.cache_path is not None
    assert isinstance(loader.images, Encoded if store == "jpeg" else Ragged)
    got = epochs(loader)
    assert torch.cat([y for _, y in got[0]]).tolist() == [ds.targets[i] for i in keep]
    assert identical_across_epochs(*got) == 0
    # The reference: a folder holding just those files, in the same order (sorted names, kept order).
    if sorted(keep) == keep:
        ref_root = tmp_path / "only"
        for i in keep:
            path = ds.samples[i][0]
            dest = ref_root / path.split("/")[-2] / path.split("/")[-1]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest)
        ref = type(ds)(str(ref_root), transform=recipe)
        reference = gf.accelerate(ref, batch_size=3, shuffle=False, store=store, cache=False, **KW)
        assert all(same_batches(a, b) for a, b in zip(got, epochs(reference), strict=True))
    again = gf.accelerate(part, **kw)  # the wrapped folder's entry is found again: no second read
    assert again.plan.ingest.startswith("cache hit")
    assert same_batches(got[0], list(again))
    assert snapshot(tmp_path / "photos") == before


class Wrapping(Dataset):
    """A wrapper torch does not ship (users write these): the inner transform runs inside its __getitem__."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


def test_an_unknown_wrapper_of_a_random_transform_is_refused_not_frozen():
    wrapped = Wrapping(cifar_like(16, transform=TRAIN))
    with pytest.raises(DataError, match=r"Wrapping\.inner has the transform .*RandomCrop.*freeze"):
        gf.accelerate(wrapped, batch_size=4, cache=False, **KW)
    with pytest.warns(UserWarning, match="freeze"):
        loader = gf.accelerate(wrapped, batch_size=4, cache=False, fallback="prefetch", **KW)
    assert loader.plan.storage == "fallback"


def test_an_unknown_wrapper_of_a_deterministic_transform_is_read_once():
    det = T.Compose([T.CenterCrop(24), T.ToTensor()])
    wrapped = Wrapping(cifar_like(16, transform=det))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nothing to cache: the wrapper is not identifiable
        loader = gf.accelerate(wrapped, batch_size=4, shuffle=False, cache=False, **KW)
    x = torch.cat([x for x, _ in loader])
    assert torch.equal(x, torch.stack([wrapped[i][0] for i in range(16)]))


class RareRandom(Dataset):
    """A random op that a probe of a few reads would usually miss (p=0.02), inside an unknown wrapper."""

    def __init__(self):
        self.inner = cifar_like(16, transform=T.Compose([T.RandomApply([T.RandomInvert(1.0)], p=0.02), T.ToTensor()]))

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.inner[i]


def test_a_rare_random_op_inside_an_unknown_wrapper_is_known_from_the_pipeline_not_a_lucky_draw():
    with pytest.raises(DataError, match="freeze"):
        gf.accelerate(RareRandom(), batch_size=4, cache=False, **KW)


class Plain(Dataset):
    """A user's dataset with a transform attribute, not torchvision's: wrapped in a Subset, it is a view."""

    def __init__(self, n, transform=None):
        self.images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, 3, 32, 32), dtype=np.uint8))
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        return (self.transform(image) if self.transform else image), i % 10


def test_a_subset_of_a_users_dataset_strips_the_inner_transform_through_a_view():
    tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ConvertImageDtype(torch.float32)])
    inner = Plain(24, tf)
    part = Subset(inner, [5, 2, 9, 14, 0, 7])
    view = unwrap(part)
    assert isinstance(view, IndexedView) and view.transform is tf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a user's dataset is not cached
        loader = gf.accelerate(part, batch_size=3, shuffle=False, cache=False, **KW)
    assert inner.transform is tf  # the caller's dataset is not modified
    got = epochs(loader)
    assert torch.cat([y for _, y in got[0]]).tolist() == [i % 10 for i in (5, 2, 9, 14, 0, 7)]
    assert identical_across_epochs(*got) <= 1
    assert isinstance(unwrap(ConcatDataset([inner, Plain(3, tf)])), ConcatView)


def test_a_subset_index_out_of_range_is_named_and_no_fallback_is_taken_for_it():
    part = Subset(cifar_like(10, transform=TRAIN), [1, 40])
    for fallback in ("error", "prefetch"):  # bad input: the per-sample fallback would only fail on it mid-epoch
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "falls back" warning either
            with pytest.raises(DataError, match="Subset index 40 is out of range for its dataset of 10 samples"):
                gf.accelerate(part, batch_size=2, cache=False, fallback=fallback, **KW)


def test_build_cache_of_a_subset_stores_the_inner_deterministic_part_of_those_samples(tmp_path):
    ds = cifar_like(30, transform=T.Compose([T.CenterCrop(24), T.RandomHorizontalFlip(), T.ToTensor()]))
    cache = gf.build_cache(Subset(ds, [4, 0, 17]), tmp_path / "entry", progress=False)
    expected = torch.from_numpy(ds.data[[4, 0, 17], 4:28, 4:28]).permute(0, 3, 1, 2)
    assert torch.equal(cache.images, expected) and cache.labels.tolist() == [ds.targets[i] for i in (4, 0, 17)]


def test_a_store_refusal_names_what_the_recipe_starts_with(tmp_path):
    ds = image_folder(tmp_path / "photos", SIZES[:4], transform=T.Compose([T.Resize(20), T.RandomCrop(16)]))
    with pytest.raises(gf.ConfigError, match="starts with RandomResizedCrop; this one starts with Resize"):
        gf.accelerate(Subset(ds, [0, 1]), batch_size=2, store="jpeg", cache=False, **KW)


def test_a_joint_transforms_pipeline_is_not_frozen_either():
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.vision import VisionDataset

    def joint(image, target):  # a random crop of image and target together (segmentation-style)
        return T.RandomCrop(32, padding=4)(image), target

    ds = CIFAR10.__new__(CIFAR10)
    VisionDataset.__init__(ds, root="/nonexistent", transforms=joint)
    ds.data = np.zeros((6, 32, 32, 3), dtype=np.uint8)
    ds.targets, ds.train = [0] * 6, True
    with pytest.raises(DataError, match=r"CIFAR10\.transforms has the transform .*freeze"):
        gf.accelerate(ds, batch_size=2, cache=False, **KW)


class Flipping(Wrapping):
    """A user's wrapper that flips at random in its own __getitem__ (``only``: the samples of that class only, so
    sample 0, of class 0, reads the same every time)."""

    def __init__(self, inner, only=None):
        super().__init__(inner)
        self.only = only

    def __getitem__(self, i):
        x, y = self.inner[i]
        return (x.flip(-1) if self.only in (None, int(y)) and torch.rand(()) < 0.5 else x), y


@pytest.mark.parametrize("case", ["one class", "second part of a concat", "first part of a concat"])
def test_randomness_that_sample_0_does_not_show_is_still_refused(case):
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    plain = TensorDataset(torch.rand(30, 3, 8, 8, generator=g), torch.arange(30) % 3)
    flipped = Flipping(TensorDataset(torch.rand(12, 3, 8, 8, generator=g), torch.ones(12, dtype=torch.long)))
    dataset = {
        "one class": Flipping(plain, only=1),
        "second part of a concat": ConcatDataset([plain, flipped]),
        "first part of a concat": ConcatDataset([flipped, plain]),
    }[case]
    state = torch.random.get_rng_state()
    with pytest.raises(DataError, match=r"differs between two reads.*would\s+freeze"):
        gf.accelerate(dataset, batch_size=6, cache=False, **KW)
    assert torch.equal(torch.random.get_rng_state(), state)  # the probe's reads leave the global generator as it was


def test_build_cache_of_a_folder_with_the_random_resized_crop_recipe_builds_the_store_accelerate_opens(tmp_path):
    recipe = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])
    ds = image_folder(tmp_path / "photos", SIZES[:6], transform=recipe)
    cache = gf.build_cache(Subset(ds, [0, 2, 3, 5]), root=tmp_path / "cache", progress=False)
    assert isinstance(cache.images, Ragged) and cache.labels.tolist() == [ds.targets[i] for i in (0, 2, 3, 5)]
    loader = gf.accelerate(Subset(ds, [0, 2, 3, 5]), batch_size=2, store="pixels", cache=tmp_path / "cache", **KW)
    assert loader.plan.ingest.startswith("cache hit") and loader.plan.cache_path == str(cache.path)
    with pytest.raises(gf.ConfigError, match="pass root= instead"):
        gf.build_cache(ds, tmp_path / "elsewhere", progress=False)


@pytest.mark.parametrize("change", ["transform", "targets", "inner transform of a subset"])
def test_a_dataset_changed_after_accelerate_is_refused_at_the_next_epoch_not_served_stale(change):
    import copy
    import pickle

    ds = cifar_like(12, transform=TRAIN)
    part = Subset(ds, list(range(8)))
    loader = gf.accelerate(part if change.endswith("subset") else ds, batch_size=4, cache=False, **KW)
    clone = pickle.loads(pickle.dumps(loader))  # a copy in another process (ddp_spawn) watches nothing
    deep = copy.deepcopy(loader)
    assert len(list(loader)) == len(list(clone)) == len(list(deep))
    if change == "targets":
        ds.targets = [0] * len(ds.targets)  # pseudo-labels
    else:
        ds.transform = T.Compose([T.RandomCrop(24), T.ToTensor()])  # progressive resizing
    attr = "targets" if change == "targets" else "transform"
    with pytest.raises(DataError, match=rf"CIFAR10\.{attr} was replaced after gpufeed\.accelerate\(\).*again"):
        next(iter(loader))
    assert gf.accelerate(ds, batch_size=4, cache=False, **KW) is not None  # what the message says works
