"""Batched transforms: parameter distributions match torchvision's, randomness comes only from the generator."""

import math

import pytest
import torch
import torchvision.transforms as T

from gpufeed.augment import (
    Compose,
    ConvertDtype,
    Cutout,
    Normalize,
    RandomCrop,
    RandomErasing,
    RandomHorizontalFlip,
    RandomVerticalFlip,
)
from gpufeed.errors import ConfigError

from stats import ALPHA, DRAWS, chi_square_p_value, ks_critical, ks_statistic
from stats import gen as _gen


def test_random_crop_offsets_are_uniform_over_the_inclusive_range(device):
    x = torch.zeros(DRAWS, 1, 4, 4, dtype=torch.uint8, device=device)
    params = RandomCrop(4, padding=4).sample(x, _gen(device=device))
    top, left = params["top"].cpu(), params["left"].cpu()
    assert top.min() == 0 and top.max() == 8 and left.min() == 0 and left.max() == 8
    assert chi_square_p_value(torch.bincount(top, minlength=9)) > ALPHA
    assert chi_square_p_value(torch.bincount(left, minlength=9)) > ALPHA
    assert chi_square_p_value(torch.bincount(top * 9 + left, minlength=81)) > ALPHA  # independent axes


def test_random_crop_samples_differ_within_a_batch():
    x = torch.zeros(64, 1, 4, 4, dtype=torch.uint8)
    params = RandomCrop(4, padding=4).sample(x, _gen())
    assert len(set(zip(params["top"].tolist(), params["left"].tolist(), strict=True))) > 30


@pytest.mark.parametrize("p", [0.5, 0.2])
@pytest.mark.parametrize("op_cls, dim", [(RandomHorizontalFlip, 3), (RandomVerticalFlip, 2)])
def test_flip_rate_is_p_and_flips_the_right_axis(device, p, op_cls, dim):
    x = torch.arange(16, dtype=torch.uint8, device=device).view(1, 1, 4, 4).expand(DRAWS, 1, 4, 4).contiguous()
    out = op_cls(p)(x, generator=_gen(device=device))
    flipped = (out == x.flip(dim)).flatten(1).all(dim=1)
    kept = (out == x).flatten(1).all(dim=1)
    assert bool((flipped ^ kept).all())  # every sample is exactly one of the two
    rate = flipped.double().mean().item()
    assert abs(rate - p) < 4.5 * math.sqrt(p * (1 - p) / DRAWS)  # 4.5 sigma


def test_random_erasing_parameters_follow_torchvision_distribution():
    img = torch.zeros(3, 32, 32)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tv = [T.RandomErasing.get_params(img, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=[0.0]) for _ in range(DRAWS)]
    tv_top, tv_left, tv_h, tv_w = (torch.tensor([p[k] for p in tv if p[2] < 32]) for k in range(4))
    params = RandomErasing(p=1.0).sample(torch.zeros(DRAWS, 3, 32, 32), _gen())
    fits = params["mask"]
    # the rare "no attempt fits" case leaves the image alone, as torchvision returns the image itself
    tv_fit_rate, fit_rate = len(tv_h) / DRAWS, fits.double().mean().item()
    assert abs(fit_rate - tv_fit_rate) < 4.5 * math.sqrt(tv_fit_rate * (1 - tv_fit_rate) * 2 / DRAWS) + 1e-9
    for ours, theirs in [
        (params["height"], tv_h),
        (params["width"], tv_w),
        (params["top"], tv_top),
        (params["left"], tv_left),
        (params["height"] * params["width"], tv_h * tv_w),
    ]:
        assert ks_statistic(ours[fits], theirs) < ks_critical(int(fits.sum()), len(theirs))


def test_random_erasing_applies_with_probability_p():
    params = RandomErasing(p=0.3).sample(torch.zeros(DRAWS, 3, 32, 32), _gen())
    rate = params["mask"].double().mean().item()
    assert abs(rate - 0.3) < 4.5 * math.sqrt(0.3 * 0.7 / DRAWS)


def test_random_erasing_random_value_is_standard_normal_inside_the_box():
    x = torch.full((512, 3, 32, 32), 100.0)
    out = RandomErasing(p=1.0, value="random")(x, generator=_gen())
    erased = out[out != 100.0]
    assert erased.numel() > 100_000
    assert abs(erased.mean().item()) < 0.02 and abs(erased.std().item() - 1) < 0.02


def test_random_erasing_random_value_needs_float_input():
    with pytest.raises(ConfigError, match="float input"):
        RandomErasing(p=1.0, value="random")(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), generator=_gen())


def test_cutout_box_is_clipped_at_the_border_and_centres_are_uniform():
    x = torch.full((2, 1, 5, 5), 255, dtype=torch.uint8)
    op = Cutout(3)
    out = op.apply(x, {"mask": torch.tensor([True, True]), "top": torch.tensor([-1, 1]), "left": torch.tensor([-1, 1])})
    assert (out[0] == 0).sum() == 4 and bool((out[0, 0, :2, :2] == 0).all())  # 2x2 corner left of a 3x3 box
    assert (out[1] == 0).sum() == 9 and bool((out[1, 0, 1:4, 1:4] == 0).all())
    params = op.sample(torch.zeros(DRAWS, 1, 7, 7), _gen())
    centre = params["top"] + 1
    assert centre.min() == 0 and centre.max() == 6
    assert chi_square_p_value(torch.bincount(centre, minlength=7)) > ALPHA


def test_call_equals_apply_of_sample_with_the_same_generator_state():
    x = torch.randint(0, 256, (32, 3, 16, 16), dtype=torch.uint8, generator=_gen(9))
    for op in [
        RandomCrop(12, padding=2, padding_mode="reflect"),
        RandomHorizontalFlip(),
        RandomErasing(p=0.8),
        Cutout(5, p=0.5),
    ]:
        assert torch.equal(op(x, generator=_gen(5)), op.apply(x, op.sample(x, _gen(5))))


def test_same_seed_same_output_and_other_seed_other_output():
    aug = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3)])
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=_gen(1))
    assert torch.equal(aug(x, generator=_gen(7)), aug(x, generator=_gen(7)))
    assert not torch.equal(aug(x, generator=_gen(7)), aug(x, generator=_gen(8)))


def test_transforms_neither_use_nor_disturb_the_global_rng():
    aug = Compose([RandomCrop(8, padding=2), RandomHorizontalFlip(), RandomErasing(p=1.0, value="random")])
    x = torch.rand(16, 3, 8, 8)
    torch.manual_seed(42)
    expected = torch.rand(4)
    torch.manual_seed(42)
    aug(x, generator=_gen())
    assert torch.equal(torch.rand(4), expected)


def test_random_transform_without_generator_says_how_to_make_one():
    with pytest.raises(ConfigError, match=r"generator=torch.Generator\(device='cpu'\)"):
        RandomCrop(4, padding=1)(torch.zeros(2, 1, 4, 4))


def test_deterministic_transforms_need_no_generator():
    x = torch.full((1, 1, 1, 1), 255, dtype=torch.uint8)
    assert Compose([ConvertDtype(torch.float32), Normalize([0.0], [2.0])])(x).item() == 0.5


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RandomCrop(32, padding=-1), "padding=-1 must be >= 0"),
        (lambda: RandomCrop(0), "size=0"),
        (lambda: RandomCrop(8, padding=(1, 2, 3)), "padding=.* 2 or 4 ints"),
        (lambda: RandomCrop(8, padding_mode="wrap"), "padding_mode='wrap'"),
        (lambda: RandomHorizontalFlip(1.5), "p=1.5"),
        (lambda: Normalize([0.5, 0.5], [0.1, 0.1, 0.1]), "same length"),
        (lambda: Normalize([0.5], [0.0]), "must not contain 0"),
        (lambda: RandomErasing(scale=(0.5, 0.1)), "scale="),
        (lambda: Cutout(0), "size=0"),
        (lambda: Compose([T.RandomCrop(32)]), r"transforms\[0\]=RandomCrop"),
    ],
)
def test_bad_arguments_raise_config_errors_naming_them(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_crop_larger_than_the_padded_image_is_an_error_suggesting_padding():
    with pytest.raises(ConfigError, match="pad_if_needed"):
        RandomCrop(10)(torch.zeros(1, 1, 8, 8), generator=_gen())


def test_normalize_with_the_wrong_number_of_channels_names_them():
    with pytest.raises(ConfigError, match="one per channel"):
        Normalize([0.5] * 3, [0.2] * 3)(torch.zeros(1, 1, 2, 2))


@pytest.mark.parametrize(
    "ops",
    [
        [RandomCrop(12, padding=3), RandomHorizontalFlip()],
        [RandomHorizontalFlip(), RandomVerticalFlip(), RandomCrop((10, 14), padding=(1, 2, 3, 4), fill=9)],
        [RandomCrop(14, padding=2, padding_mode="reflect"), RandomCrop(10, padding=1, fill=5), RandomVerticalFlip()],
        [RandomCrop(14, padding=2, fill=1), RandomHorizontalFlip(), RandomCrop(12, padding=3, fill=200)],
        [RandomCrop(16, padding=2, fill=(1, 2, 3)), RandomHorizontalFlip(), RandomCrop(16, padding=1, fill=(1, 2, 3))],
        [RandomCrop(12, padding=4), RandomErasing(p=1.0, value=7), RandomHorizontalFlip(), RandomCrop(12, padding=2)],
    ],
)
def test_compose_fuses_crops_and_flips_into_the_same_pixels_as_one_by_one(device, ops):
    x = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8, generator=_gen(2)).to(device)
    fused = Compose(ops)(x, generator=_gen(3, device))
    g, y = _gen(3, device), x
    for op in ops:
        y = op.apply(y, op.sample(y, g))
    assert torch.equal(fused, y)


def test_a_nested_compose_draws_and_computes_what_the_flat_one_does(device):
    from gpufeed.augment import RandomResizedCrop

    x = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8, generator=_gen(4)).to(device)
    inner = Compose([RandomCrop(16, padding=2), Compose([RandomHorizontalFlip()])])
    nested = Compose([inner, RandomResizedCrop(24), RandomVerticalFlip(), Normalize([0.5] * 3, [0.2] * 3)])
    flat = Compose([RandomCrop(16, padding=2), RandomHorizontalFlip(), RandomResizedCrop(24), RandomVerticalFlip(),
                    Normalize([0.5] * 3, [0.2] * 3)])  # fmt: skip
    out = nested(x, generator=_gen(5, device))
    assert out.shape == (16, 3, 24, 24) and nested.output_size(16, 16) == (24, 24)
    assert torch.equal(out, flat(x, generator=_gen(5, device)))
