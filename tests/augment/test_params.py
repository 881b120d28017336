"""An op's numbers at the edge: a NaN or infinite range bound (torchvision raises on every call with one, drawing
``uniform_(low, high)``) is refused when the op is made, naming the op, the argument and the value; through
``gf.accelerate`` too, fallback or not, since the per-sample pipeline would raise on every sample."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torch.utils.data import TensorDataset

import gpufeed as gf
from gpufeed import augment as A
from gpufeed.errors import ConfigError, UnsupportedTransformError

NAN, INF = math.nan, math.inf

# (gpufeed op, the argument named, torchvision's op with the same value, or None where torchvision's constructor
# already refuses it (then gpufeed refuses it as well, by torchvision's own rule))
NON_FINITE = [
    (lambda: A.RandomRotation(INF), "degrees=inf", lambda m: m.RandomRotation(INF)),
    (lambda: A.RandomRotation(NAN), "degrees=nan", lambda m: m.RandomRotation(NAN)),
    (lambda: A.RandomRotation((-3, INF)), r"degrees=\(-3, inf\)", lambda m: m.RandomRotation((-3, INF))),
    (lambda: A.RandomAffine(NAN), "degrees=nan", lambda m: m.RandomAffine(NAN)),
    (lambda: A.RandomAffine(0, scale=(0.9, INF)), r"scale=\(0.9, inf\)", lambda m: m.RandomAffine(0, scale=(0.9, INF))),
    (lambda: A.RandomAffine(0, shear=INF), "shear=inf", lambda m: m.RandomAffine(0, shear=INF)),
    (lambda: A.RandomAffine(0, shear=(0, 0, NAN, 1)), r"shear=\(0, 0, nan, 1\)", None),
    (lambda: A.RandomResizedCrop(8, scale=(0.5, INF)), r"scale=\(0.5, inf\)", None),
    (lambda: A.RandomResizedCrop(8, ratio=(NAN, 1.0)), r"ratio=\(nan, 1.0\)", None),
    (lambda: A.ColorJitter(brightness=INF), "brightness=inf", lambda m: m.ColorJitter(brightness=INF)),
    (lambda: A.ColorJitter(contrast=(1, INF)), r"contrast=\(1, inf\)", lambda m: m.ColorJitter(contrast=(1, INF))),
    (lambda: A.ColorJitter(saturation=NAN), "saturation=nan", None),
    (lambda: A.GaussianBlur(3, sigma=INF), "sigma=inf", lambda m: m.GaussianBlur(3, sigma=INF)),
    (lambda: A.GaussianBlur(5, sigma=(0.1, NAN)), r"sigma=\(0.1, nan\)", None),
    (lambda: A.RandomErasing(1.0, scale=(NAN, 0.3)), r"scale=\(nan, 0.3\)", None),
    (lambda: A.RandomErasing(1.0, ratio=(0.3, INF)), r"ratio=\(0.3, inf\)", None),
    (lambda: A.RandomSolarize(NAN), "threshold=nan", None),
    (lambda: A.RandomAdjustSharpness(INF), "sharpness_factor=inf", None),
]


@pytest.mark.parametrize(("make", "said", "_"), NON_FINITE, ids=[c[1] for c in NON_FINITE])
def test_a_non_finite_number_is_refused_when_the_op_is_made(make, said, _) -> None:
    with pytest.raises(ConfigError, match=f"{said} must be finite"):
        make()


def test_torchvision_raises_on_every_call_with_those_numbers() -> None:
    x = torch.randint(0, 256, (3, 12, 12), dtype=torch.uint8)
    for _, _said, tv in NON_FINITE:
        for m in (T, v2) if tv is not None else ():
            with pytest.raises(RuntimeError, match="out of bounds for float"):
                tv(m)(x)


def test_nan_and_infinite_values_of_the_other_ops_are_refused_by_name() -> None:
    for make, said in [
        (lambda: A.RandomAffine(0, translate=(NAN, 0.1)), r"translate=\(nan, 0.1\) must be .* in \[0, 1\]"),
        (lambda: A.RandomAffine(0, translate=(1.5, 0.1)), r"translate=\(1.5, 0.1\) must be .* in \[0, 1\]"),
        (lambda: A.RandomAffine(0, scale=(0.0, 1.0)), r"scale=\(0.0, 1.0\) must be .* 0 < min <= max"),
        (lambda: A.RandomPerspective(NAN), r"distortion_scale=nan must be in \[0, 1\]"),
        (lambda: A.RandomHorizontalFlip(NAN), r"p=nan must be in \[0, 1\]"),
        (lambda: A.MixUp(INF), "MixUp: alpha=inf must be a finite number > 0"),
        (lambda: A.CutMix(NAN), "CutMix: alpha=nan must be a finite number > 0"),
        (lambda: A.Normalize((0.5, NAN, 0.5), (0.2, 0.2, 0.2)), r"Normalize: mean=\(0.5, nan, 0.5\).* must be finite"),
        (lambda: A.Normalize((0.5,), (INF,)), r"std=\(inf,\) must be finite"),
    ]:
        with pytest.raises(ConfigError, match=said):
            make()


@pytest.mark.parametrize("m", [T, v2], ids=["v1", "v2"])
@pytest.mark.parametrize("degrees", [INF, NAN, (0.0, INF)])
def test_accelerate_refuses_a_rotation_torchvision_cannot_draw_fallback_or_not(m, degrees) -> None:
    ds = TensorDataset(torch.randint(0, 256, (6, 3, 10, 10), dtype=torch.uint8), torch.arange(6))
    for transform in (m.RandomRotation(degrees), m.RandomApply([m.RandomRotation(degrees)], p=0.3)):
        for fallback in ("error", "prefetch"):
            with pytest.raises(ConfigError, match="degrees=.* must be finite: torchvision refuses it") as raised:
                gf.accelerate(ds, batch_size=3, device="cpu", transform=transform, fallback=fallback, progress=False)
            assert not isinstance(raised.value, UnsupportedTransformError)  # no fallback runs it either


def test_finite_bounds_are_taken_as_before() -> None:
    x = torch.randint(0, 256, (4, 3, 10, 10), dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    assert A.RandomRotation((-1e30, 1e30)).degrees == (-1e30, 1e30)
    out = A.Compose([A.RandomAffine(10, translate=(0.0, 1.0), scale=(0.5, 2.0), shear=(1, 2, 3, 4))])(x, generator=g)
    assert out.shape == x.shape
