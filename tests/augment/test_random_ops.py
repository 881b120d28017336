"""torchvision's per-image random ops, batched: given the same draws each equals torchvision's tensor kernel;
the coins and draws follow torchvision's distributions; the containers decide per sample."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode

from gpufeed import augment as R
from gpufeed.augment.color import ColorJitter
from gpufeed.augment.crop_flip import RandomHorizontalFlip

from stats import chi_square_p_value


def _images(n: int = 12, h: int = 20, w: int = 28, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)
    x[1] = 90
    x[2] //= 5
    return x


def _always(op_cls, **kwargs):
    return op_cls(p=1.0, **kwargs)


FIXED = [
    (R.RandomSolarize, {"threshold": 100.0}, lambda im: TF.solarize(im, 100.0)),
    (R.RandomPosterize, {"bits": 3}, lambda im: TF.posterize(im, 3)),
    (R.RandomAutocontrast, {}, TF.autocontrast),
    (R.RandomEqualize, {}, TF.equalize),
    (R.RandomInvert, {}, TF.invert),
    (R.RandomAdjustSharpness, {"sharpness_factor": 2.5}, lambda im: TF.adjust_sharpness(im, 2.5)),
    (R.RandomGrayscale, {}, lambda im: TF.rgb_to_grayscale(im, 3)),
]


@pytest.mark.parametrize("op_cls, kwargs, reference", FIXED, ids=[c.__name__ for c, _, _ in FIXED])
def test_each_fixed_op_equals_torchvision_where_its_coin_says(op_cls, kwargs, reference):
    x = _images()
    op = op_cls(p=0.5, **kwargs)
    params = op.sample(x, torch.Generator().manual_seed(1))
    out = op.apply(x, params)
    assert 0 < int(params["apply"].sum()) < len(x)
    for i in range(len(x)):
        want = reference(x[i]) if params["apply"][i] else x[i]
        assert torch.equal(out[i], want), (op_cls.__name__, i)


def test_grayscale_to_one_channel_after_a_random_op():
    x = _images()
    out = R.Grayscale(1)(x)
    assert out.shape == (12, 1, 20, 28)
    assert all(torch.equal(out[i], TF.rgb_to_grayscale(x[i], 1)) for i in range(12))


def test_grayscale_keeps_one_channel_images_at_one_channel_as_torchvision():
    x = torch.randint(0, 256, (2, 1, 5, 5), dtype=torch.uint8)
    out = R.Grayscale(3)(x)
    assert out.shape == TF.rgb_to_grayscale(x[0], 3).unsqueeze(0).expand(2, -1, -1, -1).shape == (2, 1, 5, 5)
    assert torch.equal(out, x)


@pytest.mark.parametrize("kernel_size", [3, (5, 7)])
def test_gaussian_blur_equals_torchvision_with_each_samples_sigma(kernel_size):
    x = _images()
    op = R.GaussianBlur(kernel_size, (0.1, 2.0))
    params = op.sample(x, torch.Generator().manual_seed(2))
    out = op.apply(x, params)
    ks = [kernel_size] * 2 if isinstance(kernel_size, int) else list(kernel_size)
    for i in range(len(x)):
        s = float(params["sigma"][i])
        assert torch.equal(out[i], TF.gaussian_blur(x[i], ks, [s, s])), i


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("center", [None, (3.0, 5.0)])
def test_random_rotation_equals_torchvision_at_each_samples_angle(interpolation, center):
    x = _images()
    op = R.RandomRotation(40, interpolation=interpolation, center=center, fill=(7.0, 8.0, 9.0))
    params = op.sample(x, torch.Generator().manual_seed(3))
    out = op.apply(x, params)
    mode = InterpolationMode(interpolation)
    c = list(center) if center is not None else None
    for i in range(len(x)):
        want = TF.rotate(x[i], float(params["angle"][i]), mode, center=c, fill=[7.0, 8.0, 9.0])
        assert torch.equal(out[i], want), i


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("center", [None, (3.0, 5.0)])
def test_on_pil_images_rotation_and_affine_equal_torchvisions_pil_kernels(interpolation, center):
    import numpy as np
    from PIL import Image

    x = _images()
    mode = InterpolationMode(interpolation)
    c = list(center) if center is not None else None
    rotation = R.RandomRotation(40, interpolation=interpolation, center=center, fill=7.0, pil=True)
    affine = R.RandomAffine(
        25, (0.2, 0.1), (0.7, 1.3), (-10, 10, -5, 5), interpolation, fill=(7.0, 8.0, 9.0), center=center, pil=True
    )
    for op in (rotation, affine):
        params = op.sample(x, torch.Generator().manual_seed(3))
        out = op.apply(x, params)
        for i in range(len(x)):
            img = Image.fromarray(x[i].permute(1, 2, 0).numpy())
            p = {k: float(v[i]) for k, v in params.items()}
            if op is rotation:
                want = TF.rotate(img, p["angle"], mode, center=c, fill=7)
            else:
                moves = [int(p["tx"]), int(p["ty"])]
                want = TF.affine(img, p["angle"], moves, p["scale"], [p["sx"], p["sy"]], mode, [7, 8, 9], c)
            assert np.array_equal(out[i].permute(1, 2, 0).numpy(), np.asarray(want)), (type(op).__name__, i)


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_random_affine_equals_torchvision_with_each_samples_draws(interpolation):
    x = _images()
    op = R.RandomAffine(25, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5), interpolation=interpolation)
    params = op.sample(x, torch.Generator().manual_seed(4))
    out = op.apply(x, params)
    mode = InterpolationMode(interpolation)
    for i in range(len(x)):
        p = {k: float(v[i]) for k, v in params.items()}
        want = TF.affine(
            x[i], p["angle"], [int(p["tx"]), int(p["ty"])], p["scale"], [p["sx"], p["sy"]], mode, fill=[0.0] * 3
        )
        assert torch.equal(out[i], want), i


def test_the_coins_and_draws_follow_torchvisions_distributions():
    n = 20_000
    x = torch.zeros(n, 3, 2, 2, dtype=torch.uint8)
    g = torch.Generator().manual_seed(5)
    applied = R.RandomInvert(p=0.3).sample(x, g)["apply"].double().mean()
    assert abs(float(applied) - 0.3) < 3.3 * (0.21 / n) ** 0.5
    angles = R.RandomRotation((-30, 30)).sample(x, g)["angle"]
    assert chi_square_p_value(torch.histc(angles, 20, -30, 30)) > 1e-3
    tx = R.RandomAffine(0, translate=(0.5, 0.0)).sample(torch.zeros(n, 3, 2, 8, dtype=torch.uint8), g)["tx"]
    assert set(tx.tolist()) == {-4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0}  # round(U(-4, 4)), whole pixels
    which = R.RandomChoice((R.RandomInvert(1.0), R.RandomEqualize(1.0)), p=(1.0, 3.0)).sample(x, g)["which"]
    assert abs(float(which.double().mean()) - 0.75) < 0.01
    order = R.RandomOrder((R.RandomInvert(1.0), R.RandomEqualize(1.0), R.Grayscale(3))).sample(x, g)["order"]
    perms = order[:, 0] * 9 + order[:, 1] * 3 + order[:, 2]
    assert chi_square_p_value(torch.bincount(perms, minlength=27)[torch.bincount(perms, minlength=27) > 0]) > 1e-3


def test_random_apply_runs_its_ops_in_order_on_the_samples_its_coin_picks_and_nothing_else():
    x = _images(64)
    # solarize then posterize: the other order gives other pixels, so the order is checked too
    op = R.RandomApply((R.RandomSolarize(100.0, p=1.0), R.RandomPosterize(3, p=1.0)), p=0.8)
    params = op.sample(x, torch.Generator().manual_seed(6))
    out = op.apply(x, params)
    picked = params["apply"]
    assert 40 < int(picked.sum()) < 64  # Binomial(64, 0.8): 51 expected
    for i in range(64):
        want = TF.posterize(TF.solarize(x[i], 100.0), 3) if picked[i] else x[i]
        assert torch.equal(out[i], want), i


def test_random_apply_draws_its_ops_parameters_for_the_picked_samples_only():
    x = _images(64)
    jitter = ColorJitter(0.4, 0.4, 0.4, 0.1)
    op = R.RandomApply((jitter, RandomHorizontalFlip(1.0)), p=0.8)
    params = op.sample(x, torch.Generator().manual_seed(6))
    out = op.apply(x, params)
    picked = params["apply"].nonzero().flatten().tolist()
    assert torch.equal(out[~params["apply"]], x[~params["apply"]])
    # the inner ops draw from a generator seeded by the container's draw (salted by their place), over the picked
    # samples alone; each picked sample is then torchvision's adjustments in the drawn order, then its hflip
    drawn = jitter.sample(x[picked], torch.Generator().manual_seed(params["seed"]))
    adjust = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    for k, i in enumerate(picked):
        want = x[i]
        for j in drawn["order"][k].tolist():
            want = adjust[j](want, float(drawn["factors"][j][k]))
        assert torch.equal(out[i], TF.hflip(want)), i


def test_a_container_with_an_op_that_changes_the_size_is_refused_where_it_would():
    from gpufeed.augment.resize import RandomResizedCrop
    from gpufeed.errors import DataError

    x = torch.zeros(8, 3, 12, 12)
    shrink = R.RandomApply((RandomResizedCrop(8),), p=1.0)
    with pytest.raises(DataError, match=r"turn \(3, 12, 12\) images into \(3, 8, 8\)"):
        shrink(x, generator=torch.Generator().manual_seed(0))
    same = R.RandomApply((RandomResizedCrop(12),), p=1.0)  # the same size: fine
    assert same(x, generator=torch.Generator().manual_seed(0)).shape == x.shape


SSL = {
    # SimCLR: crop, flip, colour jitter 80% of the time, grayscale 20%, blur
    "SimCLR": lambda T: [
        T.RandomResizedCrop(32),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.GaussianBlur(3, (0.1, 2.0)),
    ],
    # BYOL's second view: blur 10%, solarize 20%
    "BYOL": lambda T: [
        T.RandomResizedCrop(32),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.RandomApply([T.GaussianBlur(3, (0.1, 2.0))], p=0.1),
        T.RandomSolarize(128, p=0.2),
    ],
    "affine and choice": lambda T: [
        T.RandomAffine(15, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5),
        T.RandomChoice([T.RandomEqualize(1.0), T.RandomAutocontrast(1.0), T.RandomInvert(1.0)]),
        T.RandomOrder([T.RandomPosterize(4), T.RandomAdjustSharpness(2.0)]),
    ],
}


@pytest.mark.parametrize("name", list(SSL))
def test_a_self_supervised_recipe_is_batched_and_distributed_as_torchvisions(name):
    import torchvision.transforms as T

    import gpufeed as gf

    from fakes import image_summaries, varied_cifar
    from stats import ks_critical, ks_statistic

    n = 3000
    recipe = T.Compose([T.PILToTensor(), *SSL[name](T), T.ConvertImageDtype(torch.float32)])
    ds = varied_cifar(n, seed=1)
    ds.transform = recipe
    loader = gf.accelerate(ds, batch_size=500, shuffle=False, device="cpu", cache=False, progress=False, seed=4)
    assert loader.plan.storage != "fallback"
    ours = torch.cat([x for x, _ in loader])
    before = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float() / 255
    torch.manual_seed(4)
    theirs = torch.stack([ds[i][0] for i in range(n)])
    a, b = image_summaries(ours, before), image_summaries(theirs, before)
    for key in a:
        assert ks_statistic(a[key], b[key]) < ks_critical(n, n), key


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_random_perspective_equals_torchvision_with_each_samples_corners(interpolation):
    x = _images()
    op = R.RandomPerspective(0.6, p=0.7, interpolation=interpolation, fill=(5.0, 6.0, 7.0))
    params = op.sample(x, torch.Generator().manual_seed(7))
    out = op.apply(x, params)
    h, w = x.shape[2:]
    start = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
    for i in range(len(x)):
        if not params["apply"][i]:
            assert torch.equal(out[i], x[i])
            continue
        ends = params["ends"][i].tolist()
        want = TF.perspective(x[i], start, ends, InterpolationMode(interpolation), fill=[5.0, 6.0, 7.0])
        assert torch.equal(out[i], want), i
    # the corners are drawn as torchvision's get_params draws them: within the same bounds
    n = 4000
    many = op.sample(torch.zeros(n, 3, h, w, dtype=torch.uint8), torch.Generator().manual_seed(8))["ends"]
    bw, bh = int(0.6 * (w // 2)) + 1, int(0.6 * (h // 2)) + 1
    assert set(many[:, 0, 0].tolist()) == set(range(bw)) and set(many[:, 2, 1].tolist()) == set(range(h - bh, h))


def test_on_pil_images_v2s_affine_matrix_order_is_followed():
    # v2 orders the inverse matrix's float64 arithmetic differently from v1: on PIL (float64 all the way) a
    # bilinear sample moves now and then at odd sizes; gpufeed builds the matrix the op's way
    import numpy as np
    import torchvision.transforms.v2.functional as TF2
    from PIL import Image

    x = torch.randint(0, 256, (60, 3, 21, 21), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    op = R.RandomAffine(25, (0.2, 0.1), (0.7, 1.3), (-10, 10, -5, 5), "bilinear", fill=(7, 8, 9), pil=True, v2=True)
    params = op.sample(x, torch.Generator().manual_seed(2))
    out = op.apply(x, params)
    for i in range(len(x)):
        p = {k: float(v[i]) for k, v in params.items()}
        img = Image.fromarray(x[i].permute(1, 2, 0).numpy())
        moves = [int(p["tx"]), int(p["ty"])]
        want = TF2.affine(img, p["angle"], moves, p["scale"], [p["sx"], p["sy"]], InterpolationMode.BILINEAR, [7, 8, 9])
        assert np.array_equal(out[i].permute(1, 2, 0).numpy(), np.asarray(want)), i


def test_pil_fills_are_clipped_as_pillow_stores_them_and_a_wrong_count_is_refused():
    from gpufeed.augment import pil
    from gpufeed.errors import ConfigError

    assert pil.parse_fill(300, 3) == [255, 255, 255] and pil.parse_fill((-5, 7.9, 1), 3) == [0, 7, 1]
    assert pil.parse_fill(None, 1) == [0]
    with pytest.raises(ConfigError, match="ValueError"):
        pil.parse_fill((1, 2, 3), 1)


def test_arguments_take_torchvisions_order():
    assert R.RandomAdjustSharpness(0.5).sharpness_factor == 0.5 and R.RandomPosterize(1).bits == 1
    assert R.RandomSolarize(100, 0.3).p == 0.3 and R.RandomInvert(0.2).p == 0.2


@pytest.mark.parametrize("dtype", [torch.float64])
def test_geometric_ops_and_blur_run_in_the_images_float_dtype_as_torchvision(dtype):
    x = torch.rand(4, 3, 16, 20, dtype=dtype, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    blur = R.GaussianBlur(5, (0.5, 1.5))
    p = blur.sample(x, g)
    out = blur.apply(x, p)
    for i in range(4):
        s = float(p["sigma"][i])
        assert out.dtype == dtype and torch.allclose(out[i], TF.gaussian_blur(x[i], [5, 5], [s, s]), atol=1e-12)
    rot = R.RandomRotation(30, interpolation="bilinear")
    p = rot.sample(x, g)
    out = rot.apply(x, p)
    for i in range(4):
        ref = TF.rotate(x[i], float(p["angle"][i]), InterpolationMode.BILINEAR, fill=[0.0] * 3)
        assert torch.allclose(out[i], ref, atol=1e-12)
    persp = R.RandomPerspective(0.5, p=1.0)
    assert persp(x, generator=g).dtype == dtype
    assert R.RandomAffine(10, shear=5)(x, generator=g).dtype == dtype


def test_empty_batches_pass_through():
    x = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    for op in (R.GaussianBlur(3), R.RandomChoice((R.RandomInvert(1.0), R.RandomEqualize(1.0)))):
        assert op(x, generator=g).shape == (0, 3, 8, 8)
