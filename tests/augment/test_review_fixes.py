"""Cases a review of the batched recipes found: containers the fallback must take, torchvision's argument
order, dtypes other than float32, v2's fill=None and solarize thresholds, empty batches, 1-channel gray."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode

import gpufeed as gf
import gpufeed.augment as A
from gpufeed.augment.auto import OPS, TrivialAugmentWide, _table, apply_op

from fakes import cifar_like


def test_a_container_the_batched_path_cannot_run_takes_the_fallback():
    ds = cifar_like(8, transform=T.Compose([T.RandomApply([T.RandomResizedCrop(24)], p=0.5), T.ToTensor()]))
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(ds, batch_size=4, device="cpu", fallback="prefetch", num_workers=0, progress=False)
    assert loader.plan.storage == "fallback"


def test_random_choice_weights_line_up_with_ops_that_do_nothing_on_the_device():
    ds = cifar_like(
        8, transform=v2.Compose([v2.ToImage(), v2.RandomChoice([v2.Identity(), v2.RandomInvert(1.0)], p=[0.5, 0.5])])
    )
    loader = gf.accelerate(ds, batch_size=4, device="cpu", progress=False, cache=False)
    assert "RandomChoice(transforms=(Identity(), RandomInvert(p=1.0)), p=(0.5, 0.5))" in loader.plan.batched[0]


def test_arguments_take_torchvisions_order():
    assert A.RandomAdjustSharpness(0.5).sharpness_factor == 0.5 and A.RandomPosterize(1).bits == 1
    assert A.RandomSolarize(100, 0.3).p == 0.3 and A.RandomInvert(0.2).p == 0.2


def test_gpufeeds_own_mixup_takes_the_number_of_classes_from_the_dataset():
    ds = cifar_like(16, transform=T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    loader = gf.accelerate(ds, batch_size=8, device="cpu", progress=False, cache=False, mix=A.MixUp(1.0))
    assert next(iter(loader))[1].shape == (8, 10)


@pytest.mark.parametrize("dtype", [torch.float64])
def test_geometric_ops_and_blur_run_in_the_images_float_dtype_as_torchvision(dtype):
    x = torch.rand(4, 3, 16, 20, dtype=dtype, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    blur = A.GaussianBlur(5, (0.5, 1.5))
    p = blur.sample(x, g)
    out = blur.apply(x, p)
    for i in range(4):
        s = float(p["sigma"][i])
        assert out.dtype == dtype and torch.allclose(out[i], TF.gaussian_blur(x[i], [5, 5], [s, s]), atol=1e-12)
    rot = A.RandomRotation(30, interpolation="bilinear")
    p = rot.sample(x, g)
    out = rot.apply(x, p)
    for i in range(4):
        ref = TF.rotate(x[i], float(p["angle"][i]), InterpolationMode.BILINEAR, fill=[0.0] * 3)
        assert torch.allclose(out[i], ref, atol=1e-12)
    persp = A.RandomPerspective(0.5, p=1.0)
    assert persp(x, generator=g).dtype == dtype
    assert A.RandomAffine(10, shear=5)(x, generator=g).dtype == dtype


def test_v2_fill_none_keeps_the_zero_padded_border_of_bilinear_sampling():
    x = torch.randint(0, 256, (6, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    tf = v2.RandomRotation(20, interpolation=InterpolationMode.BILINEAR, fill=None)
    from gpufeed.plan import build_batched, split_transform

    ops = build_batched(split_transform(tf).device, torch.uint8, (24, 24))
    (rot,) = ops.transforms
    assert rot.fill is None
    p = rot.sample(x, torch.Generator().manual_seed(3))
    out = rot.apply(x, p)
    for i in range(6):
        ref = v2.functional.rotate(x[i], float(p["angle"][i]), InterpolationMode.BILINEAR, fill=None)
        assert torch.equal(out[i], ref), i


def test_v2_solarize_thresholds_are_v2s():
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(3, 3, 16, 16).contiguous()
    table = _table("wide", 31, 16, 16, OPS, v2_thresholds=True)
    for b in (16, 18, 24):  # where 255 * linspace(1, 0) and linspace(255, 0) differ in the last bit
        t = float(table[OPS.index("Solarize"), b])
        got = apply_op(x, torch.full((3,), OPS.index("Solarize")), torch.full((3,), t, dtype=torch.float64))
        want = v2.functional.solarize(x, threshold=255.0 * float(torch.linspace(1.0, 0.0, 31)[b]))
        assert torch.equal(got, want), b
    assert TrivialAugmentWide(v2_thresholds=True).v2_thresholds


def test_empty_batches_pass_through():
    x = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    for op in (
        A.GaussianBlur(3),
        A.RandomChoice((A.RandomInvert(1.0), A.RandomEqualize(1.0))),
        A.RandomResizedCrop(6, interpolation=("bilinear", "bicubic")),
    ):
        assert op(x, generator=g).shape[0] == 0


def test_grayscale_keeps_one_channel_images_at_one_channel_as_torchvision():
    x = torch.randint(0, 256, (2, 1, 5, 5), dtype=torch.uint8)
    out = A.Grayscale(3)(x)
    assert out.shape == TF.rgb_to_grayscale(x[0], 3).unsqueeze(0).expand(2, -1, -1, -1).shape == (2, 1, 5, 5)
    assert torch.equal(out, x)
