import itertools
import math

import pytest
import torch
import torchvision.transforms.functional as TF

from gpufeed.augment import ColorJitter
from gpufeed.errors import ConfigError

from stats import DRAWS, chi_square_p_value
from stats import gen as _gen

_TV = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("channels", [3, 1])
def test_pixels_equal_torchvision_adjustments_in_the_drawn_order(device, dtype, channels):
    x = torch.randint(0, 256, (48, channels, 12, 12), dtype=torch.uint8, generator=_gen(1))
    x = (x if dtype == torch.uint8 else x.float() / 255).to(device)
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    params = op.sample(x, _gen(2, device))
    out = op.apply(x, params)
    for i in range(48):
        y = x[i]  # torchvision's kernels on the same device: CUDA rewrites x / n as x * (1 / n), the CPU does not
        for j in params["order"][i].tolist():
            y = _TV[j](y, float(params["factors"][j][i]))
        assert torch.equal(out[i], y), i


def test_order_is_a_uniform_permutation_and_factors_are_uniform_in_range():
    op = ColorJitter(brightness=(0.5, 1.5), hue=0.2)
    params = op.sample(torch.zeros(DRAWS, 3, 2, 2), _gen())
    perms = {p: k for k, p in enumerate(itertools.permutations(range(4)))}
    counts = torch.bincount(torch.tensor([perms[tuple(p)] for p in params["order"].tolist()]), minlength=24)
    assert chi_square_p_value(counts) > 1e-3
    b, h = params["factors"][0], params["factors"][3]
    assert params["factors"][1] is None and params["factors"][2] is None
    assert 0.5 <= b.min() and b.max() < 1.5 and -0.2 <= h.min() and h.max() < 0.2
    assert abs(b.mean().item() - 1.0) < 4.5 * math.sqrt(1 / 12 / DRAWS)
    assert chi_square_p_value(torch.histc(h, bins=20, min=-0.2, max=0.2)) > 1e-3


def test_ranges_follow_torchvision_conventions():
    op = ColorJitter(brightness=1.5, contrast=0, saturation=(0.2, 0.9), hue=0.5)
    assert op.brightness == (0.0, 2.5) and op.contrast is None and op.saturation == (0.2, 0.9)
    assert op.hue == (-0.5, 0.5)
    with pytest.raises(ConfigError, match="hue=0.7"):
        ColorJitter(hue=0.7)
    with pytest.raises(ConfigError, match="brightness=-1"):
        ColorJitter(brightness=-1)


def _pil_kernel_differences(trials=2, n=256, seed=0):
    """The largest |gpufeed - torchvision on PIL| per adjustment, over noise, smooth and dark images."""
    import numpy as np
    from PIL import Image

    from gpufeed.augment import color as C

    rng, worst = np.random.default_rng(seed), dict.fromkeys(("brightness", "contrast", "saturation", "hue"), 0)
    for trial in range(trials):
        noise = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        coarse = torch.from_numpy(rng.integers(0, 256, (n, 3, 4, 4)).astype(np.float32))
        smooth = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bicubic").round().clamp(0, 255)
        for data in (noise, smooth.to(torch.uint8).permute(0, 2, 3, 1).numpy(), noise // 8):
            x = torch.from_numpy(np.ascontiguousarray(data)).permute(0, 3, 1, 2).contiguous()
            pils = [Image.fromarray(a) for a in data]
            for name, ours, tv, (lo, hi) in zip(
                worst, C._ADJUST, _TV, [(0, 3), (0, 3), (0, 3), (-0.5, 0.5)], strict=True
            ):
                f = torch.empty(n).uniform_(lo, hi, generator=_gen(trial))
                ref = torch.stack(
                    [torch.from_numpy(np.array(tv(p, float(v)))).permute(2, 0, 1) for p, v in zip(pils, f, strict=True)]
                )
                worst[name] = max(worst[name], int((ours(x, f).int() - ref.int()).abs().max()))
    return worst


@pytest.mark.slow
def test_the_stated_pil_bounds_hold_and_are_the_measured_ones():
    from gpufeed.pipeline.translate import PIL_BOUNDS

    measured = _pil_kernel_differences()
    assert all(measured[k] <= PIL_BOUNDS[k] for k in PIL_BOUNDS), measured  # never understated
    assert all(measured[k] >= PIL_BOUNDS[k] - 1 for k in PIL_BOUNDS), measured  # nor much overstated


# --- the restructured kernels against the expressions they replace (torchvision's, with a factor per sample) ---


def _blend_as_before(img1, img2, f):
    from gpufeed.augment.color import _col

    ratio, rest = _col(f, img1)
    bound = 255 if img1.dtype == torch.uint8 else 1.0
    return (ratio * img1 + rest * img2).clamp(0, bound).to(img1.dtype)


def _hsv2rgb_as_before(img):
    h, s, v = img.unbind(dim=-3)
    i = torch.floor(h * 6.0)
    f = (h * 6.0) - i
    i = i.to(dtype=torch.int32) % 6
    p = torch.clamp((v * (1.0 - s)), 0.0, 1.0)
    q = torch.clamp((v * (1.0 - s * f)), 0.0, 1.0)
    t = torch.clamp((v * (1.0 - s * (1.0 - f))), 0.0, 1.0)
    mask = i.unsqueeze(dim=-3) == torch.arange(6, device=i.device).view(-1, 1, 1)
    a1 = torch.stack((v, q, p, p, t, v), dim=-3)
    a2 = torch.stack((t, v, v, q, p, p), dim=-3)
    a3 = torch.stack((p, p, t, v, v, q), dim=-3)
    a4 = torch.stack((a1, a2, a3), dim=-4)
    return torch.einsum("...ijk, ...xijk -> ...xjk", mask.to(dtype=img.dtype), a4)


def _images(seed, n, channels, h, w, dtype):
    x = torch.randint(0, 256, (n, channels, h, w), dtype=torch.uint8, generator=_gen(seed))
    if dtype == torch.uint8:
        return x
    x = x.to(dtype) / 255
    # and values no uint8 image holds, with the ends of the range exactly
    x += torch.rand(x.shape, generator=_gen(seed + 1), dtype=dtype) / 255
    x.view(-1)[: x.numel() // 7] = 0.0
    x.view(-1)[-(x.numel() // 7) :] = 1.0
    return x.clamp_(0, 1)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_brightness_contrast_and_saturation_equal_the_expressions_they_replace_bit_for_bit(dtype, seed):
    from gpufeed.augment import color as C

    g = _gen(100 + seed)
    n, h, w = (int(v) for v in torch.randint(1, 40, (3,), generator=g))
    x = _images(seed, n, 3, h, w, dtype)
    f = torch.rand(n, generator=g) * 3  # past the bound too: the clamp is part of what is compared
    f[0] = 1.0
    work = dtype if dtype.is_floating_point else torch.float32  # torchvision's: the mean is taken in float

    def mean(y):
        return torch.mean(C.gray(y).to(work), dim=(-3, -2, -1), keepdim=True)

    assert torch.equal(C.adjust_brightness(x, f), _blend_as_before(x, torch.zeros_like(x), f))
    assert torch.equal(C.adjust_contrast(x, f), _blend_as_before(x, mean(x), f))
    assert torch.equal(C.adjust_saturation(x, f), _blend_as_before(x, C.gray(x), f))
    one = x[:, :1]  # one channel: contrast blends it with its own mean
    assert torch.equal(C.adjust_contrast(one, f), _blend_as_before(one, mean(one), f))
    assert torch.equal(C.blend(x, one, f), _blend_as_before(x, one, f))  # a smaller second operand, broadcast
    assert torch.equal(x, _images(seed, n, 3, h, w, dtype))  # the input untouched (the products are in place)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_the_hsv_round_trip_equals_the_one_hot_selection_it_replaces_bit_for_bit(dtype, seed):
    from gpufeed.augment import color as C

    g = _gen(200 + seed)
    n, h, w = (int(v) for v in torch.randint(1, 40, (3,), generator=g))
    x = _images(seed, n, 3, h, w, dtype)
    hsv = C._rgb2hsv(x)
    assert torch.equal(C._hsv2rgb(hsv), _hsv2rgb_as_before(hsv))
    shift = torch.rand(n, 1, 1, generator=g, dtype=dtype) - 0.5
    shifted = torch.stack(((hsv[:, 0] + shift) % 1.0, hsv[:, 1], hsv[:, 2]), 1)
    assert torch.equal(C._hsv2rgb(shifted), _hsv2rgb_as_before(shifted))  # every sector, at every hue shift
    # whole uniform HSV cubes as well, sector edges (h * 6 an integer) included
    hue = torch.rand(n * h * w, generator=g, dtype=dtype)
    hue[::5] = torch.randint(0, 6, hue[::5].shape, generator=g).to(dtype) / 6
    cube = torch.cat((hue.view(n, 1, h, w), torch.rand(n, 2, h, w, generator=g, dtype=dtype)), 1)
    assert torch.equal(C._hsv2rgb(cube), _hsv2rgb_as_before(cube))


def _on_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def test_one_sample_s_contrast_is_the_same_on_one_thread_and_two():
    # torch splits a reduction with a single output (one sample's mean gray) between its threads, and the float32 sum
    # then follows their count: this 400x400 image's mean gray is 226.98492 on one thread, 226.98495 on two, and
    # 8,582 of its pixels came out one level apart. ColorJitter's and the auto-augment ops' host path run each
    # adjustment on the samples its slot picks, one sample as often as not, under gpufeed's thread choice.
    from gpufeed.augment.color import adjust_contrast

    g = torch.Generator().manual_seed(0)
    x = [torch.randint(200, 256, (1, 3, 400, 400), dtype=torch.uint8, generator=g) for _ in range(3)][-1]
    f = torch.tensor([0.7694976329803467])
    one, two = (_on_threads(t, lambda: adjust_contrast(x, f)) for t in (1, 2))
    assert torch.equal(one, two)
    floats = x.float() / 255  # a float batch (ToTensor before ColorJitter): its gray is no integer, every order differs
    one, two = (_on_threads(t, lambda: adjust_contrast(floats, f)) for t in (1, 2))
    assert torch.equal(one, two)
