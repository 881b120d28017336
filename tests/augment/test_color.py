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
