"""pipeline/translate/wrapped.py: a transform object of the script's own that only applies the recipe it holds
(torchvision's classification presets, an ``nn.Module`` around a Compose) is split as that recipe; one whose call
does more is refused with what it does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T

from gpufeed import accelerate
from gpufeed.errors import UnsupportedTransformError
from gpufeed.pipeline.translate import flatten

from fakes import cifar_like

_PRESETS = Path(__file__).resolve().parent / "watch" / "scripts" / "classification" / "presets.py"


def _presets():
    spec = importlib.util.spec_from_file_location("presets", _PRESETS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


presets = _presets()


def _batches(transform, **kw) -> tuple[tuple, list]:
    loader = accelerate(cifar_like(64, transform=transform), batch_size=16, device="cpu", seed=5, cache=False,
                        progress=False, **kw)  # fmt: skip
    plan = loader.plan
    assert plan is not None
    notes = tuple(n for n in plan.notes if "MemAvailable" not in n)  # the machine's free memory, read each time
    return (plan.cached, plan.batched, plan.storage, plan.stored_shape, notes), [b for b in loader]


@pytest.mark.parametrize(
    "preset",
    [
        presets.ClassificationPresetTrain(crop_size=24),
        presets.ClassificationPresetTrain(crop_size=24, backend="tensor", use_v2=True, random_erase_prob=0.25),
        presets.ClassificationPresetTrain(crop_size=24, auto_augment_policy="ta_wide", use_v2=True),
        presets.ClassificationPresetEval(crop_size=24, resize_size=28),
        presets.ClassificationPresetEval(crop_size=24, resize_size=28, backend="tensor", use_v2=True),
    ],
    ids=["train-v1-pil", "train-v2-tensor-erasing", "train-v2-ta-wide", "eval-v1-pil", "eval-v2-tensor"],
)
def test_torchvisions_classification_presets_are_split_as_the_compose_they_hold(preset):
    assert flatten(preset) == list(preset.transforms.transforms)
    wrapped_plan, wrapped = _batches(preset)
    bare_plan, bare = _batches(preset.transforms)
    assert wrapped_plan == bare_plan and len(wrapped) == len(bare) == 4
    for (x, y), (bx, by) in zip(wrapped, bare, strict=True):
        assert torch.equal(x, bx) and torch.equal(y, by)


class _Module(torch.nn.Module):
    """An nn.Module around a recipe, applied in steps: ``x = self.crop(x)`` then ``return self.rest(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.crop = T.RandomCrop(24, padding=2)
        self.rest = T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])

    def forward(self, img):
        """Crop, then the rest."""
        img = self.crop(img)
        return self.rest(img)


def test_an_nn_module_applying_its_transforms_in_turn_is_split_as_them_in_that_order():
    module = _Module()
    assert flatten(module) == [module.crop, *module.rest.transforms]
    _, batches = _batches(module)
    assert batches[0][0].shape == (16, 3, 24, 24)


class _Noisy:
    def __init__(self) -> None:
        self.transforms = T.Compose([T.RandomCrop(24), T.ToTensor()])

    def __call__(self, img):
        return self.transforms(img) + 0.01 * torch.randn(3, 24, 24)


class _WithSize:
    def __init__(self) -> None:
        self.transforms = T.Compose([T.RandomCrop(24), T.ToTensor()])

    def __call__(self, img):
        return self.transforms(img), img.size


def test_a_wrapper_whose_call_does_more_is_refused_naming_what_it_does():
    with pytest.raises(UnsupportedTransformError) as e:
        accelerate(cifar_like(64, transform=_Noisy()), batch_size=16, device="cpu", cache=False, progress=False)
    said = "test_wrapped_transforms._Noisy cannot be cached or run batched (its __call__ does more than apply "
    assert said in str(e.value)
    assert "`return self.transforms(img) + 0.01 * torch.randn(3, 24, 24)`" in str(e.value)
    with pytest.raises(UnsupportedTransformError, match=r"`return \(self.transforms\(img\), img.size\)`"):
        accelerate(cifar_like(64, transform=_WithSize()), batch_size=16, device="cpu", cache=False, progress=False)


def test_a_module_with_a_forward_hook_is_not_seen_through():
    module = _Module()
    module.register_forward_hook(lambda m, args, out: out * 2)
    with pytest.raises(UnsupportedTransformError, match="nn.Module with _forward_hooks registered"):
        accelerate(cifar_like(64, transform=module), batch_size=16, device="cpu", cache=False, progress=False)


class TwoCropsTransform:
    """MoCo's (``moco/loader.py``): take two random crops of one image as the query and key."""

    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        q = self.base_transform(x)
        k = self.base_transform(x)
        return [q, k]


class _TwoRecipes:
    """BYOL's two augmentations, one per view."""

    def __init__(self) -> None:
        self.one = T.Compose([T.RandomCrop(24), T.ToTensor()])
        self.two = T.Compose([T.RandomCrop(24), T.RandomHorizontalFlip(1.0), T.ToTensor()])

    def __call__(self, x):
        return self.one(x), self.two(x)


def test_a_two_crops_transform_is_served_as_two_batched_views_like_its_dataloaders_batches():
    base = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])
    plan, batches = _batches(TwoCropsTransform(base))
    (views, labels) = batches[0]
    assert isinstance(views, list) and [v.shape for v in views] == [(16, 3, 24, 24)] * 2 and labels.shape == (16,)
    assert not torch.equal(views[0], views[1])  # two draws
    assert any("TwoCropsTransform returns 2 views of each image" in n for n in plan[4])
    _, given = _batches(base, views=2)  # what gf.accelerate(..., transform=base, views=2) serves
    for (v, y), (gv, gy) in zip(batches, given, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(v, gv, strict=True)) and torch.equal(y, gy)
    # a DataLoader over it collates each sample's [q, k] into [q_batch, k_batch]: the same structure
    collated = torch.utils.data.default_collate([TwoCropsTransform(base)(cifar_like(2)[i][0]) for i in range(2)])
    assert isinstance(collated, list) and [v.shape for v in collated] == [(2, 3, 24, 24)] * 2
    _, two = _batches(_TwoRecipes())
    assert [v.shape for v in two[0][0]] == [(16, 3, 24, 24)] * 2
