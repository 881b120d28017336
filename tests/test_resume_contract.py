"""The resume contract (``contracts.check_resume``) against every kind of loader gpufeed builds: a state saved
mid-epoch, at an epoch's edge or after a ``break`` resumes in a fresh loader with every remaining batch bit for
bit, and the interrupted loader's next ``for`` serves the next epoch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image
from torchvision.datasets import ImageFolder

import gpufeed as gf
from gpufeed.augment import (
    Compose,
    MixUp,
    Normalize,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
)
from gpufeed.store.encoded import Encoded
from gpufeed.store.ragged import Ragged

from conftest import indexed_images
from contracts import check_resume
from fakes import cifar_like

N, BATCH = 23, 4  # 6 batches an epoch, the last one short
OPTIONS = dict(batch_size=BATCH, device="cpu", seed=5, cache=False, progress=False)
CROP = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.2] * 3)])
VIEW = T.Compose(
    [
        T.RandomResizedCrop(8),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.ToTensor(),
    ]
)
FLIP = T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])
PER_SAMPLE = T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()])  # not batched: the fallback runs it


# One torch thread, as under ``make test``: ElasticTransform's small convolutions on 2 threads of a busy 2-core
# machine took 7 s for the fallback's checks here, 0.3 s on one.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """An ImageFolder tree of 23 JPEGs from 8 to 16 pixels a side, two classes."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate(rng.integers(8, 17, (N, 2)).tolist()):
        folder = root / f"class{i % 2}"
        folder.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:02d}.jpg", quality=90)
    return root


def small_cifar(transform):
    """CIFAR10's own class over 12x12 images."""
    ds = cifar_like(N, transform=transform)
    ds.data = np.ascontiguousarray(ds.data[:, :12, :12])
    return ds


def dense(_):
    recipe = Compose(
        [RandomCrop(8, padding=2), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3), RandomErasing(p=0.5)]
    )
    images, labels = indexed_images(N), torch.arange(N)
    # chunks of 2 batches: the midpoint (batch 3) falls inside a chunk, the break (batch 2) on a chunk's edge
    return lambda: gf.DeviceLoader(
        images, labels, batch_size=BATCH, device="cpu", seed=5, chunk_batches=2, transform=recipe
    )


def ragged(_):
    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(8, 17, (N, 2), generator=g).tolist()
    store = Ragged.stack([torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes])
    recipe = Compose([RandomResizedCrop(8), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3)])
    labels = torch.arange(N)
    # chunks of 2 batches, as dense: a mid-chunk save point and a chunk's edge
    return lambda: gf.DeviceLoader(
        store, labels, batch_size=BATCH, device="cpu", seed=5, chunk_batches=2, transform=recipe
    )


def folder(store):
    def build(photos):
        ds = ImageFolder(str(photos), transform=CROP)
        return lambda: gf.accelerate(ds, store=store, **OPTIONS)

    return build


def batched(transform=FLIP, **kw):
    def build(_):
        ds = small_cifar(transform)
        return lambda: gf.accelerate(ds, **kw, **OPTIONS)

    return build


def fallback(num_workers):
    def build(_):
        ds = small_cifar(PER_SAMPLE)

        def make():
            with pytest.warns(UserWarning, match="falls back"):
                loader = gf.accelerate(ds, fallback="prefetch", num_workers=num_workers, **OPTIONS)
            assert isinstance(loader, gf.FallbackLoader)
            return loader

        return make

    return build


def mixing(loader):
    return loader.mix is not None and loader.views == 1


# kind: (how to build its loaders, what makes a loader that kind)
KINDS = {
    "dense": (dense, lambda loader: isinstance(loader.images, torch.Tensor)),
    "ragged store, chunks of 2": (ragged, lambda loader: isinstance(loader.images, Ragged)),
    "ragged pixels": (folder("pixels"), lambda loader: isinstance(loader.images, Ragged)),
    "jpeg store": (folder("jpeg"), lambda loader: isinstance(loader.images, Encoded)),
    "views": (batched(transform=VIEW, views=2), lambda loader: loader.views == 2 and loader.mix is None),
    "mixup": (batched(mix=MixUp(1.0, 10)), mixing),
    "torchvision's cutmix": (batched(mix=v2.CutMix(num_classes=10)), mixing),
    "fallback": (fallback(0), lambda loader: isinstance(loader, gf.FallbackLoader)),
    "fallback, 2 workers": (fallback(2), lambda loader: isinstance(loader, gf.FallbackLoader)),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_loader_kind_resumes_every_remaining_batch_from_every_save_point(kind, photos):
    build, is_that_kind = KINDS[kind]
    make = build(photos)

    def make_loader():
        loader = make()
        assert is_that_kind(loader), f"not a {kind} loader: {loader.plan if hasattr(loader, 'plan') else loader}"
        return loader

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing else warns on the way
        check_resume(make_loader)
