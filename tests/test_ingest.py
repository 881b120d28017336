import re

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import ImageOps
from torch.utils.data import TensorDataset
from torchvision.transforms.functional import pil_to_tensor

from gpufeed.errors import DataError
from gpufeed.read.samples import ingest, to_chw

from fakes import cifar_like, image_folder


def test_array_path_equals_reading_every_sample_and_is_vectorised():
    ds = cifar_like(50)
    fast = ingest(ds, progress=False)
    slow = ingest(ds, cached=T.Lambda(lambda im: im), num_workers=0, progress=False)  # forces per-sample
    assert (fast.path, slow.path) == ("arrays", "per-sample")
    assert fast.images.dtype == torch.uint8 and fast.images.shape == (50, 3, 32, 32)
    assert torch.equal(fast.images, slow.images) and torch.equal(fast.labels, slow.labels)
    assert fast.labels.tolist() == [i % 10 for i in range(50)]


def test_the_callers_dataset_keeps_its_transform():
    tf = T.Compose([T.RandomCrop(32, padding=4), T.ToTensor()])
    ds = cifar_like(8, transform=tf)
    ingest(ds, cached=T.Resize(16), num_workers=0, progress=False)
    assert ds.transform is tf


def test_cached_part_runs_per_sample_exactly_as_torchvision():
    ds = cifar_like(6)
    out = ingest(ds, cached=T.Compose([T.Resize(20), T.CenterCrop(16)]), num_workers=0, progress=False)
    expected = pil_to_tensor(T.CenterCrop(16)(T.Resize(20)(ds[3][0])))  # ds has no transform: ds[3][0] is PIL
    assert out.images.shape == (6, 3, 16, 16) and torch.equal(out.images[3], expected)


def test_target_transform_is_applied_on_the_array_path():
    ds = cifar_like(20)
    ds.target_transform = lambda y: 9 - y
    assert ingest(ds, progress=False).labels.tolist() == [9 - i % 10 for i in range(20)]


def test_tensor_dataset_and_grayscale_arrays():
    ds = TensorDataset(torch.zeros(5, 28, 28, dtype=torch.uint8), torch.arange(5))
    assert ingest(ds, progress=False).images.shape == (5, 1, 28, 28)


def test_per_sample_workers_give_the_same_result(tmp_path):
    ds = image_folder(tmp_path, [(20, 20)] * 10)
    a = ingest(ds, cached=T.Resize((8, 8)), num_workers=0, progress=False)
    b = ingest(ds, cached=T.Resize((8, 8)), num_workers=2, progress=False)
    assert torch.equal(a.images, b.images) and a.labels.tolist() == [0] * 5 + [1] * 5  # ImageFolder: by class


def test_images_of_different_sizes_name_the_first_odd_sample_and_the_fix(tmp_path):
    ds = image_folder(tmp_path, [(20, 20), (20, 20), (24, 20), (20, 20)])  # ImageFolder order: 0000, 0002, ...
    with pytest.raises(DataError, match=r"ImageFolder\[1\] has shape \(3, 20, 24\).*add a Resize and CenterCrop"):
        ingest(ds, num_workers=0, progress=False)


def test_empty_dataset_is_an_error():
    with pytest.raises(DataError, match=r"the dataset \(TensorDataset\) is empty \(len 0\)"):
        ingest(TensorDataset(torch.zeros(0, 3, 4, 4), torch.zeros(0)), progress=False)


def test_to_chw_layouts():
    assert to_chw(np.zeros((4, 5, 3), dtype=np.uint8)).shape == (3, 4, 5)
    assert to_chw(torch.zeros(4, 5)).shape == (1, 4, 5)
    with pytest.raises(DataError, match="a sample's image is a str; expected a PIL image, numpy array or tensor"):
        to_chw("image.png")


def test_cached_ops_apply_to_datasets_without_a_transform_attribute():
    ds = TensorDataset(torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).view(2, 3, 8, 8), torch.arange(2))
    out = ingest(ds, cached=T.CenterCrop(4), num_workers=0, progress=False)
    assert out.path == "per-sample" and out.images.shape == (2, 3, 4, 4)
    assert torch.equal(out.images[1], T.CenterCrop(4)(ds.tensors[0][1]))


def test_samples_that_are_not_image_label_pairs_are_named():
    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"image": torch.zeros(3, 4, 4), "label": i}

    with pytest.raises(DataError, match=r"returned a dict; gpufeed reads \(image, label\) pairs"):
        ingest(Dicts(), num_workers=0, progress=False)


def test_a_subclass_with_its_own_getitem_is_read_through_it_not_through_its_arrays():

    class Binary(type(cifar_like(1))):  # a CIFAR10 subclass that changes labels and flips some images
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return (ImageOps.mirror(image) if i % 10 == 5 else image), int(label >= 5)  # PIL: no transform set

    ds = cifar_like(20)
    ds.__class__ = Binary
    out = ingest(ds, progress=False)
    assert out.path == "per-sample"
    assert out.labels.tolist() == [int(i % 10 >= 5) for i in range(20)]
    assert torch.equal(out.images[5], torch.from_numpy(ds.data[5]).permute(2, 0, 1).flip(-1))


def test_float_targets_keep_their_values_through_a_target_transform():

    ds = cifar_like(6)
    ds.targets = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    ds.target_transform = lambda t: t * 2
    assert ingest(ds, progress=False).labels.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


def test_channel_first_numpy_images_are_kept_as_they_are():
    chw = np.arange(3 * 8 * 6, dtype=np.float32).reshape(3, 8, 6)
    assert torch.equal(to_chw(chw), torch.from_numpy(chw))
    hwc = np.zeros((8, 6, 3), dtype=np.uint8)
    assert to_chw(hwc).shape == (3, 8, 6)


def test_images_with_different_channel_counts_say_how_to_convert_them():
    ds = TensorDataset(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.arange(2))

    class Mixed(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return torch.zeros(1 if i == 1 else 3, 4, 4, dtype=torch.uint8), i

    assert ingest(ds, progress=False).images.shape == (2, 3, 4, 4)
    with pytest.raises(DataError, match=r"Mixed\[1\] has shape \(1, 4, 4\).*convert every image to one mode"):
        ingest(Mixed(), num_workers=0, progress=False)


def test_a_file_that_fails_to_load_is_named_with_its_path(tmp_path):
    ds = image_folder(tmp_path, [(8, 8)] * 4, transform=T.ToTensor())
    broken = ds.samples[2][0]
    with open(broken, "r+b") as f:
        f.truncate(20)
    with pytest.raises(DataError, match=rf"ImageFolder\[2\] \({broken}\) raised"):
        ingest(ds, cached=T.Resize(4), num_workers=0, progress=False)


@pytest.mark.parametrize("shape", [(8, 20), (8, 2, 3, 4, 5)])
def test_samples_that_are_not_images_are_refused_by_name(shape):
    import gpufeed as gf

    ds = TensorDataset(torch.rand(shape), torch.zeros(8, dtype=torch.long))
    with pytest.raises(DataError, match=rf"TensorDataset\[0\] gives an image of shape {re.escape(str(shape[1:]))}"):
        gf.accelerate(ds, batch_size=4, device="cpu", progress=False)
