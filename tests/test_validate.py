"""Bad input a person hands gpufeed: a typed error naming the argument or sample and the fix, or a warning
where the input is legal but suspicious."""

import re

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import gpufeed as gf
from gpufeed import ConfigError, DataError, DeviceLoader, StateError

from conftest import indexed_images
from fakes import cifar_like


def _loader(n=20, **kw):
    kw.setdefault("batch_size", 4)
    return DeviceLoader(indexed_images(n), torch.arange(n), device="cpu", **kw)


def test_float_images_outside_zero_one_warn_with_the_range_found():
    images = torch.rand(6, 3, 4, 4) * 255
    images[2, 0, 0, 0], images[4, 1, 2, 3] = 255.0, 0.0
    with pytest.warns(UserWarning, match=r"float images hold values in \[0, 255\].*Divide by 255"):
        DeviceLoader(images, torch.arange(6), batch_size=2, device="cpu")
    with pytest.warns(UserWarning, match=r"\[-2, 1\]"):
        DeviceLoader(torch.tensor([-2.0, 1.0]).view(2, 1, 1, 1), torch.arange(2), batch_size=2, device="cpu")


def test_float_images_inside_zero_one_do_not_warn(recwarn):
    DeviceLoader(torch.rand(6, 3, 4, 4), torch.arange(6), batch_size=2, device="cpu")
    assert not [w for w in recwarn if "float images" in str(w.message)]


@pytest.mark.parametrize("n, batch_size", [(10, 11), (3, 256)])
def test_an_epoch_of_zero_batches_is_an_error_everywhere(n, batch_size):
    match = rf"batch_size={batch_size} with drop_last=True gives an epoch of zero batches: {n} samples"
    with pytest.raises(ConfigError, match=match):
        _loader(n, batch_size=batch_size, drop_last=True)
    ds = cifar_like(n, transform=T.ToTensor())
    with pytest.raises(ConfigError, match=match):
        gf.accelerate(ds, batch_size=batch_size, drop_last=True, device="cpu", progress=False)
    rotate = cifar_like(
        n, transform=T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()])
    )  # the per-sample fallback
    with pytest.raises(ConfigError, match=match):  # refused before the per-sample fallback is built
        gf.accelerate(rotate, batch_size=batch_size, drop_last=True, device="cpu", fallback="prefetch")
    assert len(_loader(n, batch_size=batch_size, drop_last=False)) == 1  # a ragged batch is an epoch


def test_an_epoch_empty_on_every_rank_names_the_ranks_but_evaluation_shares_may_be_empty():
    with pytest.raises(ConfigError, match=r"8 samples across 4 ranks \(each rank needs a full batch\)"):
        _loader(8, batch_size=4, drop_last=True, rank=0, world_size=4)
    with pytest.raises(ConfigError, match=r"6 samples across 2 ranks.*batch_size <= 3"):
        _loader(6, batch_size=4, drop_last=True, rank=1, world_size=2, shard="local")
    # Evaluation (exactly once): 10 samples in batches of 8 on 3 ranks leave ranks 1 and 2 without a batch.
    shares = [len(_loader(10, batch_size=8, even=False, rank=r, world_size=3)) for r in range(3)]
    assert shares == [1, 1, 0]


@pytest.mark.parametrize("name", ["shuffle", "drop_last", "channels_last", "even"])
@pytest.mark.parametrize("value", ["no", "False", 1, None])
def test_flags_must_be_bools(name, value):
    # even= also takes 'pad' (evaluation), listed between True and False in its message
    message = rf"{name}={value!r} must be True (or False|.*'pad'.* or False)"
    with pytest.raises(ConfigError, match=message):
        _loader(**{name: value})
    with pytest.raises(ConfigError, match=message):
        gf.accelerate(cifar_like(8, transform=T.ToTensor()), batch_size=4, device="cpu", **{name: value})


def test_numpy_integers_are_accepted_for_batch_size_seed_and_epoch():
    plain = _loader(batch_size=4, seed=7)
    plain.set_epoch(2)
    numpy = _loader(batch_size=np.int64(4), seed=np.int32(7))
    numpy.set_epoch(np.int64(2))
    assert [y.tolist() for _, y in numpy] == [y.tolist() for _, y in plain]
    assert numpy.state_dict() == plain.state_dict() and type(numpy.state_dict()["seed"]) is int
    loader = gf.accelerate(
        cifar_like(8, transform=T.ToTensor()), batch_size=np.int16(4), seed=np.uint8(1), device="cpu"
    )
    assert len(loader) == 2


@pytest.mark.parametrize("value, match", [(4.0, "must be an int"), ("4", "must be an int"), (True, "must be an int")])
def test_batch_size_of_another_type_is_an_error(value, match):
    with pytest.raises(ConfigError, match=rf"batch_size={value!r} {match}"):
        _loader(batch_size=value)


@pytest.mark.parametrize(
    "state, match",
    [
        (None, "state is a NoneType, not the dict"),
        ([("epoch", 1)], "state is a list, not the dict"),
        ({"epoch": True}, r"epoch=True"),
        ({"seed": 123.0}, r"seed=123.0 but this loader has seed=123"),
        ({"shuffle": 1}, r"shuffle=1 but this loader has shuffle=True"),
        ({"batch": "3"}, r"batch='3'"),
    ],
)
def test_a_malformed_state_dict_is_a_state_error(state, match):
    loader = _loader(seed=123)
    if isinstance(state, dict):
        state = {**loader.state_dict(), **state}
    with pytest.raises(StateError, match=match):
        loader.load_state_dict(state)


# -- datasets and their samples ------------------------------------------------------------------------------------


class _Samples(Dataset):
    """``(image, label)`` pairs from lists; ``fail_at`` raises there; ``claimed`` overstates ``len``."""

    def __init__(self, labels, claimed=None, fail_at=None):
        self.labels, self.claimed, self.fail_at = labels, claimed, fail_at
        self.images = [torch.full((3, 4, 4), i, dtype=torch.uint8) for i in range(len(labels))]

    def __len__(self):
        return self.claimed or len(self.labels)

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError(f"corrupt file for sample {i}")
        return self.images[i], self.labels[i]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "labels, match",
    [
        ([0, 1, None, 3] * 3, r"_Samples\[2\] has label None \(NoneType\); labels must be class indices"),
        (["cat", "dog"] * 6, r"_Samples\[0\] has label 'cat' \(str\)"),
    ],
)
def test_labels_that_are_none_or_strings_name_the_sample(labels, match, workers):
    with pytest.raises(DataError, match=match):
        gf.accelerate(_Samples(labels), batch_size=4, device="cpu", num_workers=workers, progress=False)


def test_array_labels_that_are_none_name_the_sample_and_the_attribute():
    ds = cifar_like(10, transform=T.ToTensor())
    ds.targets[7] = None
    with pytest.raises(DataError, match=r"CIFAR10.targets\[7\] has label None"):
        gf.accelerate(ds, batch_size=4, device="cpu", progress=False)
    with pytest.raises(DataError, match=r"labels\[1\] has label 'b'"):
        DeviceLoader(indexed_images(3), [0, "b", 2], batch_size=2, device="cpu")


@pytest.mark.parametrize(
    "dataset", [(x for x in range(3)), iter([1, 2]), "images/", None], ids=["generator", "iterator", "str", "none"]
)
def test_something_that_is_not_a_map_style_dataset_is_named(dataset):
    with pytest.raises(DataError, match="not a map-style dataset with len\\(\\) and \\[i\\].*gpufeed.prefetch"):
        gf.accelerate(dataset, batch_size=4, device="cpu")


def test_an_iterable_dataset_is_not_a_map_style_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(3, 4, 4), 0

    with pytest.raises(DataError, match="Stream, not a map-style dataset"):
        gf.accelerate(Stream(), batch_size=4, device="cpu")
    with pytest.raises(DataError, match="Stream, not a map-style dataset"):
        gf.build_cache(Stream())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_len_larger_than_the_samples_names_a_missing_index(workers):
    ds = _Samples(list(range(10)), claimed=12)
    match = r"_Samples\[11\] raised IndexError: .*len\(\) says 12 samples: does __len__ count samples"
    with pytest.raises(DataError, match=match):
        gf.accelerate(ds, batch_size=4, device="cpu", num_workers=workers, progress=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_getitem_that_raises_names_the_sample_and_the_dataset_class(workers):
    ds = _Samples(list(range(12)), fail_at=7)
    with pytest.raises(
        DataError, match=r"_Samples\[7\] raised ValueError: corrupt file for sample 7; the error comes from reading"
    ):
        gf.accelerate(ds, batch_size=4, device="cpu", num_workers=workers, progress=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_fallback_names_a_sample_that_raises(workers):
    class Rotated(_Samples):
        transform = None

        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return (self.transform(image) if self.transform else image), label

    ds = Rotated(list(range(12)), fail_at=5)
    ds.transform = T.ElasticTransform(alpha=2.0, sigma=0.3)  # a kernel small enough for 4x4 images
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(ds, batch_size=4, device="cpu", fallback="prefetch", num_workers=workers, shuffle=False)
    with pytest.raises(DataError, match=r"Rotated\[5\] raised ValueError: corrupt file for sample 5"):
        list(loader)


def test_tensor_dataset_labels_keep_working():
    ds = TensorDataset(indexed_images(6), torch.arange(6, dtype=torch.int32))
    loader = gf.accelerate(ds, batch_size=3, device="cpu", shuffle=False, dtype=None, progress=False)
    assert [y.tolist() for _, y in loader] == [[0, 1, 2], [3, 4, 5]]


# -- arguments that raised raw Python errors, or were served silently ----------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", np.float32, float])
def test_a_dtype_that_is_not_a_torch_dtype_is_a_config_error_naming_it(dtype):
    with pytest.raises(ConfigError, match=r"dtype=.* must be a torch.dtype \(e.g. torch.float32\)"):
        _loader(dtype=dtype)


class _Length(Dataset):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return torch.zeros(3, 4, 4, dtype=torch.uint8), 0


@pytest.mark.parametrize("length, kind", [(2.5, "float"), (-1, "int"), (None, "NoneType")])
@pytest.mark.parametrize("call", ["accelerate", "tune"])
def test_a_len_that_is_not_a_count_is_a_data_error_naming_len(length, kind, call):
    run = {
        "accelerate": lambda ds: gf.accelerate(ds, batch_size=2, device="cpu", cache=False, progress=False),
        "tune": lambda ds: gf.tune_dataloader(ds, batch_size=2, time_budget_s=1, max_workers=0, progress=False),
    }[call]
    with pytest.raises(DataError, match=rf"len\(dataset\) is {length!r} \(_Length.__len__ returned a {kind}\)"):
        run(_Length(length))


def test_a_len_that_raises_keeps_the_user_s_own_error():
    class Broken(_Length):
        def __len__(self):
            raise TypeError("my bug")

    with pytest.raises(TypeError, match="my bug"):
        gf.accelerate(Broken(3), batch_size=2, device="cpu", cache=False, progress=False)


@pytest.mark.parametrize("shape, axis", [((4, 3, 0, 5), "height"), ((4, 3, 5, 0), "width"), ((4, 0, 5, 5), "channels")])
def test_images_with_an_axis_of_zero_are_refused_not_served_as_empty_batches(shape, axis):
    with pytest.raises(DataError, match=re.escape(f"images has shape {shape} (N, C, H, W): a {axis} of 0")):
        DeviceLoader(torch.zeros(shape, dtype=torch.uint8), torch.arange(4), batch_size=2, device="cpu")


def test_a_ragged_image_of_height_zero_names_the_image():
    from gpufeed.augment import RandomResizedCrop
    from gpufeed.store.ragged import Ragged

    shapes = torch.tensor([[3, 4, 4], [3, 0, 6], [3, 5, 5]])
    sizes = shapes.prod(1)
    ragged = Ragged(torch.zeros(int(sizes.sum()), dtype=torch.uint8), torch.cumsum(sizes, 0) - sizes, shapes)
    with pytest.raises(DataError, match=r"ragged image 1 has shape \(3, 0, 6\)"):
        DeviceLoader(ragged, torch.arange(3), batch_size=2, transform=RandomResizedCrop(4), device="cpu")


def test_a_worker_count_past_four_per_core_is_capped_with_a_warning(monkeypatch):
    from gpufeed.validate import as_workers

    monkeypatch.setattr("gpufeed.device.usable_cores", lambda: 2)
    with pytest.warns(
        UserWarning, match=r"num_workers=1000000 is more than 4 per usable core \(2 cores here\): using 8"
    ):
        assert as_workers(10**6) == 8
    assert as_workers(8) == 8
    with pytest.raises(ConfigError, match="num_workers=-1 must be >= 0"):
        as_workers(-1)


def test_accelerate_with_a_million_workers_starts_a_few_and_says_so(monkeypatch):
    monkeypatch.setattr("gpufeed.device.usable_cores", lambda: 1)
    ds = cifar_like(40, transform=T.Compose([T.RandomCrop(32, padding=4), T.ToTensor()]))
    with pytest.warns(UserWarning, match=r"num_workers=1000000 .* using 4"):
        loader = gf.accelerate(ds, batch_size=8, device="cpu", cache=False, num_workers=10**6, progress=False)
    assert sum(y.shape[0] for _, y in loader) == 40


def test_every_entry_point_that_starts_workers_caps_them(monkeypatch, tmp_path):
    # The cap belongs wherever a count of workers comes in, not in accelerate only: the fallback loader and
    # build_cache are public and start DataLoader workers themselves.
    monkeypatch.setattr("gpufeed.device.usable_cores", lambda: 1)
    with pytest.warns(UserWarning, match=r"num_workers=1000000 .* using 4"):
        loader = gf.FallbackLoader(
            cifar_like(8), T.ToTensor(), 4, False, False, torch.device("cpu"), 0,
            dtype=None, channels_last=False, num_workers=10**6, reason="a test",
        )  # fmt: skip
    assert loader.plan.workers == 4
    with pytest.raises(ConfigError, match="num_workers=-1 must be >= 0"):
        gf.build_cache(cifar_like(8, transform=T.ToTensor()), tmp_path / "entry", num_workers=-1, progress=False)
    assert not (tmp_path / "entry").exists()


def test_labels_that_are_not_class_indices_pass_through_without_num_classes(tmp_path):
    # remapped to ImageNet-1k indices, or CrossEntropyLoss's ignore_index: a DataLoader serves them as they are
    images = indexed_images(4)
    loader = DeviceLoader(images, torch.tensor([281, -100, 0, 7]), batch_size=4, shuffle=False, device="cpu")
    assert next(iter(loader))[1].tolist() == [281, -100, 0, 7]
    ds = cifar_like(6, transform=T.ToTensor())
    ds.target_transform = lambda y: -100 if y == 2 else y + 500
    got = torch.cat([y for _, y in gf.accelerate(ds, batch_size=3, shuffle=False, device="cpu", progress=False)])
    assert got.tolist() == [ds.target_transform(y) for y in ds.targets]


def test_a_torchvision_transform_or_missing_labels_given_to_device_loader_are_config_and_data_errors():
    import torchvision.transforms.v2 as v2

    for tf in (T.RandomHorizontalFlip(), v2.RandomHorizontalFlip()):
        with pytest.raises(
            ConfigError, match=r"RandomHorizontalFlip\(\.\.\.\) is a per-sample torchvision .*gf\.accelerate"
        ):
            DeviceLoader(indexed_images(4), torch.arange(4), batch_size=2, device="cpu", transform=tf)
    with pytest.raises(DataError, match="labels is None; labels must be a tensor"):
        DeviceLoader(indexed_images(4), None, batch_size=2, device="cpu")
