"""Several views of each batch (self-supervised learning): the same images through the transform with
independent draws, resumable, refused where they cannot apply."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T

import gpufeed as gf
from gpufeed.errors import ConfigError

from fakes import cifar_like

VIEW = T.Compose(
    [
        T.RandomResizedCrop(24),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.ToTensor(),
    ]
)


def _loader(views: int, **kwargs):
    ds = cifar_like(40, transform=VIEW)
    return gf.accelerate(ds, batch_size=16, device="cpu", seed=3, progress=False, cache=False, views=views, **kwargs)


def test_two_views_are_the_same_images_with_their_own_draws():
    two, one = _loader(2), _loader(1)
    assert "all of it 2 times per batch" in " ".join(two.plan.batched)
    for ((v1, v2), y), (x, y1) in zip(two, one, strict=True):
        assert v1.shape == v2.shape == x.shape == (y.shape[0], 3, 24, 24)
        assert torch.equal(y, y1)
        assert torch.equal(v1, x)  # the first view is what the one-view loader yields
        assert not torch.equal(v1, v2)


def test_views_resume_mid_epoch_exactly():
    full = [([a.clone() for a in v], y) for v, y in _loader(2)]
    loader = _loader(2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = _loader(2)
    resumed.load_state_dict(state)
    for (v, y), (rv, ry) in zip(full[1:], list(resumed), strict=True):
        assert torch.equal(y, ry) and all(torch.equal(a, b) for a, b in zip(v, rv, strict=True))


def test_views_are_refused_with_mix_and_on_the_fallback():
    with pytest.raises(ConfigError, match="mix each view yourself"):
        _loader(2, mix=gf.augment.MixUp(1.0, 10))
    ds = cifar_like(16, transform=T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()]))
    with pytest.raises(ConfigError, match="views=2 needs the batched path"):
        gf.accelerate(ds, batch_size=8, device="cpu", fallback="prefetch", views=2, progress=False)
