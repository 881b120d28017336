"""timm's training recipes: its RandomResizedCropAndInterpolation (a random interpolation per sample too),
MaybeToTensor and RandomErasing recognised by class identity and batched (its auto-augment: test_timm_auto.py)."""

from __future__ import annotations

import random

import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode

import gpufeed as gf
from gpufeed.augment import RandomResizedCrop

from fakes import varied_cifar
from stats import ks_critical, ks_statistic

timm_data = pytest.importorskip("timm.data")


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "random"])
def test_timms_default_training_recipe_is_batched_and_distributed_as_timms(interpolation):
    n = 2000
    ds = varied_cifar(n, seed=4)
    ds.transform = timm_data.create_transform(24, is_training=True, interpolation=interpolation)
    loader = gf.accelerate(ds, batch_size=500, shuffle=False, device="cpu", cache=False, progress=False, seed=8)
    assert loader.plan.storage != "fallback" and loader.plan.batched[0].startswith("RandomResizedCrop(")
    ours = torch.cat([x for x, _ in loader])
    torch.manual_seed(8)
    random.seed(8)  # timm draws its boxes and interpolations from Python's random
    theirs = torch.stack([ds[i][0] for i in range(n)])
    for key in ("mean", "std"):
        a, b = (getattr(t, key)((1, 2, 3)) for t in (ours, theirs))
        assert ks_statistic(a, b) < ks_critical(n, n), key


def test_a_random_interpolation_is_drawn_per_sample_and_each_sample_matches_torchvision():
    x = torch.rand(400, 3, 30, 26, generator=torch.Generator().manual_seed(1))
    op = RandomResizedCrop(16, interpolation=("bilinear", "bicubic"))
    params = op.sample(x, torch.Generator().manual_seed(2))
    assert abs(float(params["mode"].double().mean()) - 0.5) < 3.3 * (0.25 / 400) ** 0.5
    out = op.apply(x, params)
    for i in range(0, 400, 7):
        box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
        mode = InterpolationMode(("bilinear", "bicubic")[int(params["mode"][i])])
        ref = TF.resized_crop(x[i], *box, [16, 16], mode, antialias=True)
        assert (out[i] - ref).abs().max() < 1e-4, i


@pytest.mark.parametrize("mode, count", [("const", 3), ("pixel", 1), ("rand", 1)])
def test_timms_random_erasing_erases_boxes_distributed_as_timms(mode, count):
    from timm.data.random_erasing import RandomErasing

    from gpufeed.augment.timm_ops import TimmRandomErasing

    n = 4000
    x = torch.full((n, 3, 20, 28), 5.0)  # no draw gives 5.0: every erased pixel shows
    ours = TimmRandomErasing(0.7, mode=mode, max_count=count)(x, generator=torch.Generator().manual_seed(1))
    random.seed(1)
    torch.manual_seed(1)
    ref = RandomErasing(0.7, mode=mode, max_count=count, device="cpu")
    theirs = torch.stack([ref(img.clone()) for img in x])
    a, b = ((t != 5.0).double().mean((1, 2, 3)) for t in (ours, theirs))
    assert abs(float((a > 0).double().mean()) - float((b > 0).double().mean())) < 0.04  # erased at all: ~0.7
    assert ks_statistic(a, b) < ks_critical(n, n)  # the erased share of each image
    if mode == "rand":  # one value per channel within a box
        erased = ours[0][:, ours[0][0] != 5.0]
        assert erased.numel() == 0 or bool((erased == erased[:, :1]).all())


def test_timms_recipe_with_random_erasing_is_batched():
    ds = varied_cifar(64)
    ds.transform = timm_data.create_transform(24, is_training=True, re_prob=0.25, re_mode="pixel", re_count=2)
    loader = gf.accelerate(ds, batch_size=16, device="cpu", cache=False, progress=False)
    assert "TimmRandomErasing" in " ".join(loader.plan.batched)
    assert next(iter(loader))[0].shape == (16, 3, 24, 24)
