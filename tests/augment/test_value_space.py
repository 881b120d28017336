"""Every batched op against torchvision at the edges of its input's value space: thresholds, bits, fills, erase values
and magnitudes out of range, float images where torchvision wants uint8, PIL-only ops on tensors.

For each pipeline torchvision either refuses (then gpufeed refuses at plan time, before any data is read, with
torchvision's reason) or runs (then gpufeed's batched ops give the same pixels). Each case is deterministic: p=1,
a fixed angle, a crop or erase box that can only be the whole image, so the two outputs compare exactly.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image

from gpufeed.errors import ConfigError, UnsupportedTransformError
from gpufeed.pipeline.translate import build_batched, kind, split_transform
from gpufeed.read.samples import to_chw
from pinned import pin

M, S = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
BOX = {"scale": (0.3, 0.3), "ratio": (1.0, 1.0)}  # RandomErasing: a box of fixed size (pinned where it lies)


def _images(n: int = 4, side: int = 12) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(a) for a in rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)]


def _space(m, space: str, op) -> list:
    """``op`` placed where the image has this value space in the user's pipeline."""
    if space == "pil":
        return [op, m.PILToTensor()]
    if space == "uint8":
        return [m.PILToTensor(), op]
    if space == "float":
        return [m.PILToTensor(), m.ConvertImageDtype(torch.float32) if m is T else v2.ToDtype(torch.float32, True), op]
    assert space == "normalized"
    return [m.ToTensor(), m.Normalize(M, S), op]


def _plan(pipeline, images):
    """gpufeed's plan for the stored images: what it refuses, it refuses here, before any data is read."""
    split = split_transform(pipeline)
    assert not split.cached
    stored = torch.stack([to_chw(img) for img in images])
    return split, stored, build_batched(split.device, stored.dtype, tuple(stored.shape[2:]), pil=True, channels=3)


def _both(pipeline, images):
    """gpufeed's batched output, and torchvision's per sample with the random boxes pinned to gpufeed's draws
    (crops and erasing; the other ops here have p=1 and fixed parameters)."""
    split, stored, ops = _plan(pipeline, images)
    g, x, drawn = torch.Generator().manual_seed(0), stored, []
    for op in ops.transforms if ops is not None else []:
        params = op.sample(x, g) if op.random else {}
        drawn.append(params)
        x = op.apply(x, params)
    pinned_kinds = ("RandomCrop", "RandomErasing")
    device_ops = [op for op in split.device if kind(op) not in (None, "ToPureTensor", "ToImage", "PILToTensor")]
    reference = []
    for i, img in enumerate(images):
        steps = [
            pin(op, drawn[[kind(o) for o in device_ops].index(kind(op))], i) if kind(op) in pinned_kinds else op
            for op in split.device
        ]
        out = img
        for op in steps:
            out = op(out)
        reference.append(to_chw(out) if not isinstance(out, torch.Tensor) else out.as_subclass(torch.Tensor))
    return x, torch.stack(reference)


def _torchvision_refuses(pipeline, images):
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            for img in images:
                pipeline(img)
    except Exception as e:  # what torchvision refuses, and its reason
        return e
    return None


FALLBACK = "fallback"  # torchvision runs it, gpufeed does not batch it: refused at plan time for the fallback

# (id, module, value space, op, what torchvision's refusal says (a regex), or None where it runs)
CASES = [
    # RandomSolarize: the threshold against the image's maximum (255 for uint8, 1 for float; PIL never refuses)
    ("v1 solarize 300 on uint8", T, "uint8", T.RandomSolarize(300, p=1.0), "Threshold should be less than bound"),
    ("v1 solarize 128 on float", T, "float", T.RandomSolarize(128, p=1.0), "Threshold should be less than bound"),
    ("v2 solarize 128 on float", v2, "float", v2.RandomSolarize(128, p=1.0), "Threshold should be less or equal"),
    ("v1 solarize 300 on PIL", T, "pil", T.RandomSolarize(300, p=1.0), None),
    ("v1 solarize 0.5 on float", T, "float", T.RandomSolarize(0.5, p=1.0), None),
    ("v2 solarize 1.0 on normalized", v2, "normalized", v2.RandomSolarize(1.0, p=1.0), None),
    ("v1 solarize -1 on uint8 (wraps to 255)", T, "uint8", T.RandomSolarize(-1, p=1.0), None),
    ("v1 solarize -1.0 on uint8", T, "uint8", T.RandomSolarize(-1.0, p=1.0), None),
    ("v1 solarize -1 on PIL (all)", T, "pil", T.RandomSolarize(-1, p=1.0), None),
    ("v1 solarize 127.5 on uint8", T, "uint8", T.RandomSolarize(127.5, p=1.0), None),
    ("v1 solarize 300 with p=0", T, "uint8", T.RandomSolarize(300, p=0.0), None),
    ("v1 solarize 300 in RandomApply", T, "uint8", T.RandomApply([T.RandomSolarize(300, p=1.0)], p=0.5), "less than"),
    # RandomPosterize: v1's tensor kernel takes uint8 only; v2 posterizes floats; bits within [0, 8] (PIL [1, 8])
    ("v1 posterize on float", T, "float", T.RandomPosterize(4, p=1.0), "Only torch.uint8 image tensors"),
    ("v2 posterize on float", v2, "float", v2.RandomPosterize(3, p=1.0), None),
    ("v2 posterize on normalized", v2, "normalized", v2.RandomPosterize(2, p=1.0), None),
    ("v2 posterize 8 bits on float", v2, "float", v2.RandomPosterize(8, p=1.0), None),
    ("v1 posterize 9 bits on uint8", T, "uint8", T.RandomPosterize(9, p=1.0), "bits should be between 0 and 8"),
    ("v2 posterize 9 bits on uint8", v2, "uint8", v2.RandomPosterize(9, p=1.0), r"range \[0, 8\]"),
    ("v1 posterize 0 bits on uint8", T, "uint8", T.RandomPosterize(0, p=1.0), None),
    ("v1 posterize 0 bits on PIL", T, "pil", T.RandomPosterize(0, p=1.0), "between or equal to 1 and 8"),
    # RandomEqualize: v1 uint8 only; v2 converts a float image to uint8 levels, equalizes, and back
    ("v1 equalize on float", T, "float", T.RandomEqualize(p=1.0), "Only torch.uint8 image tensors"),
    ("v2 equalize on float", v2, "float", v2.RandomEqualize(p=1.0), None),
    ("v2 equalize on normalized", v2, "normalized", v2.RandomEqualize(p=1.0), None),
    # RandomAdjustSharpness: a negative factor is refused by the tensor kernels, not by PIL's
    ("v1 sharpness -1 on uint8", T, "uint8", T.RandomAdjustSharpness(-1, p=1.0), "is not non-negative"),
    ("v2 sharpness -1 on float", v2, "float", v2.RandomAdjustSharpness(-1, p=1.0), "is not non-negative"),
    ("v1 sharpness -1 on PIL", T, "pil", T.RandomAdjustSharpness(-1, p=1.0), None),
    # RandomErasing: v1 needs a tensor; a value of the wrong length is refused; a uint8 image casts the value
    ("v1 erasing on PIL", T, "pil", T.RandomErasing(p=1.0, **BOX), "'Image' object has no attribute 'shape'"),
    ("v2 erasing on PIL", v2, "pil", v2.RandomErasing(p=1.0, value=7, **BOX), None),
    ("v1 erasing 2 values, 3 channels", T, "float", T.RandomErasing(1.0, value=(1, 2), **BOX), "single value or 3"),
    ("v1 erasing 300 on uint8 (cast to 44)", T, "uint8", T.RandomErasing(1.0, value=300, **BOX), FALLBACK),
    ("v2 erasing -1 on uint8 (cast to 255)", v2, "uint8", v2.RandomErasing(1.0, value=-1, **BOX), FALLBACK),
    ("v1 erasing 0.5 on uint8 (cast to 0)", T, "uint8", T.RandomErasing(1.0, value=0.5, **BOX), FALLBACK),
    ("v2 erasing random on uint8", v2, "uint8", v2.RandomErasing(1.0, value="random", **BOX), FALLBACK),
    ("v1 erasing 9 on uint8", T, "uint8", T.RandomErasing(1.0, value=9, **BOX), None),
    ("v1 erasing 5 on float", T, "float", T.RandomErasing(1.0, value=5, **BOX), None),
    # RandomCrop's padding fill: a uint8 tensor cannot hold 300 or -1 (torch.nn.functional.pad refuses); PIL clips
    ("v1 crop fill 300 on uint8", T, "uint8", T.RandomCrop(14, padding=1, fill=300), "cannot be converted to type"),
    ("v2 crop fill -1 on uint8", v2, "uint8", v2.RandomCrop(14, padding=1, fill=-1), "cannot be converted to type"),
    ("v1 crop fill 0.5 on uint8", T, "uint8", T.RandomCrop(14, padding=1, fill=0.5), None),
    ("v1 crop fill 300 on PIL", T, "pil", T.RandomCrop(14, padding=1, fill=300), None),
    ("v2 crop fill 2.0 on float", v2, "float", v2.RandomCrop(14, padding=1, fill=2.0), None),
    ("v1 crop fill 254.9 on uint8", T, "uint8", T.RandomCrop(14, padding=1, fill=254.9), None),
    ("v1 crop fill tuple on uint8", T, "uint8", T.RandomCrop(14, padding=1, fill=(1, 2, 3)), "inappropriate fill"),
    ("v2 crop fill (300, -1, 2.7) on uint8", v2, "uint8", v2.RandomCrop(14, padding=1, fill=(300, -1, 2.7)), None),
    ("v1 crop fill (300, -5, 7.9) on PIL", T, "pil", T.RandomCrop(14, padding=1, fill=(300, -5, 7.9)), None),
    # Rotation fills out of range: blended in float, rounded, cast (tensor), or clipped (PIL)
    ("v1 rotation fill 300 on uint8", T, "uint8", T.RandomRotation((30, 30), fill=300), None),
    ("v2 rotation fill -5 on uint8", v2, "uint8", v2.RandomRotation((30, 30), fill=-5), None),
    ("v1 rotation fill 300 on PIL", T, "pil", T.RandomRotation((30, 30), fill=300), None),
    ("v1 rotation fill 0.5 on uint8", T, "uint8", T.RandomRotation((30, 30), fill=0.5), None),
    # Grayscale after a random op (batched): 2 output channels are refused
    ("v1 grayscale 2 channels", T, "uint8", T.Compose([T.RandomInvert(1.0), T.Grayscale(2)]), "either 1 or 3"),
    ("v2 grayscale 2 channels", v2, "uint8", v2.Compose([v2.RandomInvert(1.0), v2.Grayscale(2)]), "must be 1 or 3"),
    # Normalize with a zero std
    ("v1 normalize std 0", T, "float", T.Normalize(M, (1.0, 0.0, 1.0)), "std evaluated to zero"),
    ("v2 normalize std 0", v2, "float", v2.Normalize(M, (1.0, 0.0, 1.0)), "std evaluated to zero"),
    # RandAugment's magnitude indexes its bins
    ("v1 randaugment magnitude 31 of 31 bins", T, "uint8", T.RandAugment(magnitude=31), "index 31 is out of bounds"),
    ("v1 autoaugment on float", T, "float", T.AutoAugment(), "Only torch.uint8 image tensors"),
    ("v2 trivialaugment on float (v2 runs it)", v2, "float", v2.TrivialAugmentWide(), FALLBACK),
    # PIL-only conversions given a tensor
    ("v1 ToTensor on a tensor", T, "uint8", T.ToTensor(), "pic should be PIL Image or ndarray"),
    ("v1 PILToTensor on a tensor", T, "uint8", T.PILToTensor(), "pic should be PIL Image"),
    ("v2 PILToTensor on a tensor (passes it)", v2, "uint8", v2.PILToTensor(), None),
    ("v2 ToTensor on a tensor (passes it)", v2, "uint8", v2.ToTensor(), None),
    # tensor-only conversions given a PIL image: v1 refuses, v2 passes the image through unscaled
    ("v1 ConvertImageDtype on PIL", T, "pil", T.ConvertImageDtype(torch.float32), "Input img should be Tensor"),
    ("v2 ToDtype on PIL (passes it)", v2, "pil", v2.ToDtype(torch.float32, scale=True), None),
    ("v1 Normalize on PIL", T, "pil", T.Normalize(M, S), "img should be Tensor Image"),
    ("v2 Normalize on PIL", v2, "pil", v2.Normalize(M, S), "does not support PIL images"),
    # What torchvision runs on normalized values, gpufeed runs the same way
    ("v1 invert on normalized", T, "normalized", T.RandomInvert(1.0), None),
    ("v1 autocontrast on float", T, "float", T.RandomAutocontrast(1.0), None),
    ("v2 brightness on normalized (clamps to 0-1)", v2, "normalized", v2.ColorJitter(brightness=(1.5, 1.5)), None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gpufeed_refuses_what_torchvision_refuses_and_computes_what_it_computes(case):
    _, m, space, op, outcome = case
    pipeline = m.Compose(_space(m, space, op))
    images = _images()
    error = _torchvision_refuses(pipeline, images)
    if outcome == FALLBACK:  # torchvision runs it; gpufeed refuses before reading the data, so the fallback can
        assert error is None, f"torchvision refused: {error!r}"
        with pytest.raises(UnsupportedTransformError, match="fallback='prefetch'"):
            _plan(pipeline, images)
    elif outcome is not None:  # torchvision refuses on every sample: so does the plan, with torchvision's words
        assert error is not None and re.search(outcome, str(error)), f"torchvision ran, or said {error}"
        with pytest.raises(ConfigError, match=outcome) as refused:
            _plan(pipeline, images)
        assert not isinstance(refused.value, UnsupportedTransformError)  # the fallback would fail the same way
        assert "torchvision refuses it" in str(refused.value)
    else:
        assert error is None, f"torchvision refused: {error!r}"
        got, expected = _both(pipeline, images)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)


def test_v2_equalize_and_posterize_of_float_images_give_the_same_values_on_every_device(device):
    # Equalize casts float to uint8 levels; a value outside 0-1 (after Normalize) casts as the CPU casts it.
    from gpufeed.augment.random_ops import RandomEqualize, RandomPosterize

    x = torch.rand(6, 3, 10, 12, generator=torch.Generator().manual_seed(0)) * 3 - 1
    for op in (RandomEqualize(p=1.0), RandomPosterize(3, p=1.0)):
        cpu = op(x, generator=torch.Generator().manual_seed(0))
        on = op(x.to(device), generator=torch.Generator(device=device).manual_seed(0))
        assert torch.equal(on.cpu(), cpu)
        ref = v2.RandomEqualize(p=1.0) if isinstance(op, RandomEqualize) else v2.RandomPosterize(3, p=1.0)
        assert torch.equal(cpu, torch.stack([ref(im) for im in x]))
