"""MixUp and CutMix on whole batches: torchvision v2's arithmetic given the same lambda and box, its
distribution of lambda, soft labels, and the loader's mixing (reproducible across a resume:
test_resume_contract.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

import gpufeed as gf
from gpufeed.augment import CutMix, MixChoice, MixUp
from gpufeed.augment.mix import as_mix
from gpufeed.errors import ConfigError

from fakes import cifar_like
from stats import ks_critical, ks_statistic


def _batch(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 3, 12, 16, generator=g), torch.arange(n) % 5


def test_mixup_equals_torchvisions_given_the_same_lambda():
    x, y = _batch()
    ours = MixUp(alpha=0.4, num_classes=5)
    params = ours.sample(x, np.random.default_rng(1))
    gx, gy = ours.apply(x, y, params)
    tv = v2.MixUp(alpha=0.4, num_classes=5)
    tx = tv.transform(x, {"lam": params["lam"], "labels": None, "batch_size": 8})
    ty = tv._mixup_label(y, lam=params["lam"])
    assert torch.equal(gx, tx) and torch.equal(gy, ty) and gy.shape == (8, 5)


def test_cutmix_equals_torchvisions_given_the_same_box():
    x, y = _batch()
    ours = CutMix(alpha=1.0, num_classes=5)
    rng = np.random.default_rng(2)
    for _ in range(20):
        params = ours.sample(x, rng)
        gx, gy = ours.apply(x, y, params)
        tv = v2.CutMix(alpha=1.0, num_classes=5)
        tx = tv.transform(x, {**params, "labels": None, "batch_size": 8})
        ty = tv._mixup_label(y, lam=params["lam_adjusted"])
        assert torch.equal(gx, tx) and torch.equal(gy, ty)


def test_lambda_and_box_follow_torchvisions_distribution():
    n = 20_000
    x = torch.zeros(2, 3, 32, 40)
    rng = np.random.default_rng(3)
    ours = torch.tensor([MixUp(0.4).sample(x, rng)["lam"] for _ in range(n)])
    torch.manual_seed(3)
    theirs = torch.distributions.Beta(torch.tensor([0.4]), torch.tensor([0.4])).sample((n,)).flatten()
    assert ks_statistic(ours, theirs) < ks_critical(n, n)
    cut = torch.tensor([CutMix(1.0).sample(x, rng)["lam_adjusted"] for _ in range(n)])
    tv = v2.CutMix(alpha=1.0, num_classes=2)
    torch.manual_seed(4)
    ref = torch.tensor([tv.make_params([x])["lam_adjusted"] for _ in range(n)])
    assert ks_statistic(cut, ref) < ks_critical(n, n)


def test_torchvisions_mixes_are_recognised_and_need_num_classes():
    choice = as_mix(v2.RandomChoice([v2.MixUp(alpha=0.2), v2.CutMix(alpha=1.0)], p=[0.3, 0.7]), num_classes=10)
    assert choice == MixChoice((MixUp(0.2, 10), CutMix(1.0, 10)), choice.p)
    assert np.allclose(np.asarray(choice.p) / sum(choice.p), [0.3, 0.7])
    with pytest.raises(ConfigError, match="MixUp or CutMix"):
        as_mix(v2.RandomHorizontalFlip(), 10)
    with pytest.raises(ConfigError, match="num_classes is needed"):
        MixUp()(*_batch(), np.random.default_rng(0))


def test_gpufeeds_own_mixup_takes_the_number_of_classes_from_the_dataset():
    ds = cifar_like(16, transform=T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    loader = gf.accelerate(ds, batch_size=8, device="cpu", progress=False, cache=False, mix=MixUp(1.0))
    assert next(iter(loader))[1].shape == (8, 10)


def test_the_loader_mixes_every_batch_into_soft_labels_and_each_epoch_anew():
    ds = cifar_like(
        64, transform=v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    )
    loader = gf.accelerate(
        ds, batch_size=16, device="cpu", seed=7, progress=False, cache=False, mix=v2.CutMix(num_classes=10)
    )
    assert "then per batch CutMix(alpha=1.0, num_classes=10)" in loader.plan.batched
    first = list(loader)
    assert all(y.shape == (16, 10) and torch.allclose(y.sum(1), torch.ones(16)) for _, y in first)
    second = list(loader)  # the next epoch mixes differently
    assert not torch.equal(first[0][1], second[0][1])


def test_the_fallback_mixes_too():
    ds = cifar_like(
        16,
        transform=v2.Compose(
            [v2.ToImage(), v2.ElasticTransform(alpha=10.0, sigma=1.0), v2.ToDtype(torch.float32, scale=True)]
        ),
    )
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(
            ds, batch_size=8, device="cpu", fallback="prefetch", num_workers=0, mix=MixUp(1.0, 10), progress=False
        )
    batches = list(loader)
    assert [tuple(y.shape) for _, y in batches] == [(8, 10), (8, 10)]
    assert all(torch.allclose(y.sum(1), torch.ones(8)) for _, y in batches)
