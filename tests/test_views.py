"""Several views of each batch (self-supervised learning): the same images through the transform with
independent draws (resumable: test_resume_contract.py), refused where they cannot apply."""

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


def test_views_are_refused_with_mix_and_on_the_fallback():
    with pytest.raises(ConfigError, match="mix each view yourself"):
        _loader(2, mix=gf.augment.MixUp(1.0, 10))
    ds = cifar_like(16, transform=T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()]))
    with pytest.raises(ConfigError, match="views=2 needs the batched path"):
        gf.accelerate(ds, batch_size=8, device="cpu", fallback="prefetch", views=2, progress=False)


def _dino(size, scale, solarize=0.0):
    return T.Compose(
        [
            T.RandomResizedCrop(size, scale=scale),
            T.RandomHorizontalFlip(),
            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            T.RandomGrayscale(p=0.2),
            T.GaussianBlur(3, (0.1, 2.0)),
            T.RandomSolarize(128, p=solarize),
            T.ToTensor(),
        ]
    )


def test_dino_multi_crop_views_each_with_its_own_pipeline_and_size(tmp_path):
    from fakes import image_folder

    views = [_dino(24, (0.4, 1.0)), _dino(24, (0.4, 1.0), solarize=0.2), _dino(12, (0.05, 0.4)), _dino(12, (0.05, 0.4))]
    for ds in (cifar_like(40), image_folder(tmp_path, [(40, 30), (33, 50), (64, 48), (30, 30)] * 3)):
        loader = gf.accelerate(ds, batch_size=8, device="cpu", seed=2, progress=False, cache=False, views=views)
        assert sum(line.startswith("view ") for line in loader.plan.batched) == 4
        crops, y = next(iter(loader))
        assert [tuple(c.shape[1:]) for c in crops] == [(3, 24, 24)] * 2 + [(3, 12, 12)] * 2 and y.shape == (8,)
        assert not torch.equal(crops[0], crops[1]) and not torch.equal(crops[2], crops[3])


def test_views_with_different_deterministic_parts_are_refused():
    ds = cifar_like(16)
    one = T.Compose([T.Resize(30), T.RandomCrop(24), T.ToTensor()])
    other = T.Compose([T.Resize(28), T.RandomCrop(24), T.ToTensor()])
    with pytest.raises(ConfigError, match="deterministic parts differ"):
        gf.accelerate(ds, batch_size=8, device="cpu", progress=False, cache=False, views=[one, other])


def test_a_state_saved_with_other_views_or_mixing_is_refused():
    from gpufeed.errors import StateError

    two = _loader(2)
    it = iter(two)
    next(it)
    state = two.state_dict()
    assert state["views"] == 2 and state["mix"] is None
    with pytest.raises(StateError, match="saved with views=2, but this loader has views=1"):
        _loader(1).load_state_dict(state)
    mixed = _loader(1, mix=gf.augment.MixUp(1.0, 10))
    with pytest.raises(StateError, match="saved with mix=None"):
        mixed.load_state_dict({**state, "views": 1})
    legacy = {k: v for k, v in state.items() if k not in ("mix", "views")}  # saved before these were recorded
    old = _loader(2)
    old.load_state_dict(legacy)  # loaded, at its position: the batches after the first, views and all
    rest = [(v, y) for v, y in it]
    resumed = list(old)
    assert len(resumed) == len(rest) == 2
    for (v, y), (rv, ry) in zip(rest, resumed, strict=True):
        assert torch.equal(y, ry) and len(rv) == 2 and all(torch.equal(a, b) for a, b in zip(v, rv, strict=True))
