"""RandomResizedCrop on uint8 computes what the user's pipeline computes: torchvision v1 through float32, v2 on the
CPU through PyTorch's fixed-point uint8 kernel (rounded and clamped between its two passes), PIL images through
Pillow's (22-bit weights; Pillow 13 runs the vertical pass first for some shapes). The box is fixed first
(scale=(1, 1), ratio=(1, 1): the whole square image), then drawn; the batched integer paths (what a GPU runs) are
checked on the CPU by calling them directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F1
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as F2
from PIL import Image
from torchvision.transforms import InterpolationMode

from gpufeed import augment as A
from gpufeed.augment.fixed_point import fixed_resized_crop, vertical_first
from gpufeed.augment.ragged_resize import batched_ragged
from gpufeed.errors import ConfigError
from gpufeed.pipeline.translate import build_batched
from gpufeed.store.ragged import Ragged

from stats import gen as _gen

SIDES = [(32, 24), (32, 48), (31, 17), (31, 45), (20, 9), (9, 13)]  # (input side, output side): down, up, odd


def _noise(n: int, side: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=_gen(seed))


def _plan(op, pil: bool = False):
    notes: list[str] = []
    ops = build_batched([op], torch.uint8, (0, 0), pil=pil, notes=notes)
    return ops.transforms[0], notes


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("side, out", SIDES)
def test_a_fixed_box_equals_v2_exactly_and_v1_within_one_level(side, out, mode, antialias):
    x = _noise(4, side)
    interpolation = InterpolationMode(mode)
    for module, functional in ((v2, F2), (T, F1)):
        op = module.RandomResizedCrop(out, (1.0, 1.0), (1.0, 1.0), interpolation, antialias=antialias)
        batched, notes = _plan(op)
        got = batched(x, generator=_gen(1))
        expected = torch.stack(
            [functional.resized_crop(im, 0, 0, side, side, [out, out], interpolation, antialias) for im in x]
        )
        diff = (got.int() - expected.int()).abs()
        if batched.kernel == "torch":  # v2's uint8 kernel (bilinear takes it on AVX2/AVX512/ARM CPUs)
            assert module is v2 and int(diff.max()) == 0, (side, out, mode, antialias)
        else:  # v1 rounds a float32 result; gpufeed's float32 sums may land on the other side of .5
            assert int(diff.max()) <= 1
        assert notes == []


def test_the_issue_case_bicubic_v2_on_uint8_differed_by_up_to_24_levels():
    # The float kernel (what gpufeed batched for v2 before) against v2's uint8 kernel, box fixed: the measured gap.
    x = _noise(8, 64)
    bicubic = InterpolationMode.BICUBIC
    expected = torch.stack([F2.resized_crop(im, 0, 0, 64, 64, [224, 224], bicubic, antialias=True) for im in x])
    through_float = A.RandomResizedCrop(224, (1.0, 1.0), (1.0, 1.0), interpolation="bicubic")(x, generator=_gen(0))
    assert int((through_float.int() - expected.int()).abs().max()) >= 20  # the kernels differ, not the boxes
    op = v2.RandomResizedCrop(224, (1.0, 1.0), (1.0, 1.0), bicubic)
    batched, _ = _plan(op)
    assert batched.kernel == "torch" and torch.equal(batched(x, generator=_gen(0)), expected)


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_drawn_boxes_equal_v2_on_the_dense_and_both_ragged_paths(mode, antialias):
    x = torch.randint(0, 256, (24, 3, 40, 30), dtype=torch.uint8, generator=_gen(2))
    for size in ((24, 28), (56, 44), (17, 61)):
        op = A.RandomResizedCrop(size, antialias=antialias, interpolation=mode, kernel="torch")
        p = op.sample(x, _gen(3))
        boxes = torch.stack([p[k] for k in ("top", "left", "height", "width")], 1).tolist()
        expected = torch.stack(
            [
                F2.resized_crop(x[i], *boxes[i], list(size), InterpolationMode(mode), antialias=antialias)
                for i in range(24)
            ]
        )
        ragged = Ragged.stack(list(x))
        assert torch.equal(op.apply(x, p), expected), size  # dense on the CPU: v2's own resize per image
        dense = fixed_resized_crop(x, p["top"], p["left"], p["height"], p["width"], size, antialias, mode, "torch")
        assert torch.equal(dense, expected), size  # dense as a GPU computes it: fixed_point's integer passes
        assert torch.equal(op.apply(ragged, p), expected), size  # ragged on the CPU: v2's own resize
        gpu_path = batched_ragged(ragged, p["top"], p["left"], p["height"], p["width"], size, antialias, mode, "torch")
        assert torch.equal(gpu_path, expected), size  # ragged as a GPU computes it: the same integers


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_pil_images_resize_as_pillow_does_on_the_cpu_and_batched(mode):
    x = torch.randint(0, 256, (40, 3, 64, 80), dtype=torch.uint8, generator=_gen(4))
    op = T.RandomResizedCrop((16, 40), interpolation=InterpolationMode(mode))
    batched, notes = _plan(op, pil=True)
    assert batched.kernel == "pil" and batched.antialias and notes == []  # exact: nothing to state
    p = batched.sample(x, _gen(5))
    boxes = torch.stack([p[k] for k in ("top", "left", "height", "width")], 1).tolist()
    pil = [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in x]
    expected = torch.stack(
        [
            torch.from_numpy(np.array(F1.resized_crop(pil[i], *boxes[i], [16, 40], InterpolationMode(mode))))
            for i in range(40)
        ]
    ).permute(0, 3, 1, 2)
    assert torch.equal(batched.apply(x, p), expected)  # on the CPU: Pillow itself
    assert torch.equal(batched.apply(Ragged.stack(list(x)), p), expected)
    # Pillow's integers batched, as a GPU computes them: both pass orders occur among these boxes
    vertical = vertical_first(p["height"], p["width"], (16, 40), "pil")
    assert vertical is not None and 0 < int(vertical.sum()) < 40
    box = (p["top"], p["left"], p["height"], p["width"])
    assert torch.equal(fixed_resized_crop(x, *box, (16, 40), True, mode, "pil"), expected)
    for hwc in (True, False):
        ragged = Ragged.stack(list(x), hwc=hwc)
        assert torch.equal(batched_ragged(ragged, *box, (16, 40), True, mode, "pil"), expected)


def test_pillow_13_order_of_passes_holds_on_random_shapes():
    # vertical_first's rule (python-pillow #9549) against Pillow on 300 random (in, out) shapes, bicubic: the
    # order shows (up to 22 levels apart on noise when wrong), and every one matches.
    rng = np.random.default_rng(0)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(4, 60, 2))
        out = tuple(int(v) for v in rng.integers(2, 80, 2))
        x = torch.from_numpy(rng.integers(0, 256, (1, 3, h, w), dtype=np.uint8))
        zero, hh, ww = torch.zeros(1, dtype=torch.long), torch.tensor([h]), torch.tensor([w])
        expected = Image.fromarray(x[0].permute(1, 2, 0).numpy()).resize(out[::-1], Image.Resampling.BICUBIC)
        got = fixed_resized_crop(x, zero, zero, hh, ww, out, True, "bicubic", "pil")
        assert torch.equal(got[0].permute(1, 2, 0), torch.from_numpy(np.array(expected))), (h, w, out)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ConfigError, match="kernel='cv2' must be one of"):
        A.RandomResizedCrop(8, kernel="cv2")


@pytest.mark.parametrize("kernel", ["torch", "pil"])
def test_the_batched_integer_paths_give_the_same_bytes_on_every_device(device, kernel):
    # What a GPU computes for v2's and Pillow's integers (dense and ragged) equals the CPU's exact result.
    x = torch.randint(0, 256, (16, 3, 48, 56), dtype=torch.uint8, generator=_gen(6))
    op = A.RandomResizedCrop((20, 44), interpolation="bicubic", kernel=kernel)
    p = op.sample(x, _gen(7))
    expected = op.apply(x, p)  # the CPU: v2's resize or Pillow itself
    on = {k: v.to(device) for k, v in p.items()}
    box = (on["top"], on["left"], on["height"], on["width"])
    dense = fixed_resized_crop(x.to(device), *box, (20, 44), True, "bicubic", kernel)
    ragged = batched_ragged(Ragged.stack(list(x.to(device))), *box, (20, 44), True, "bicubic", kernel)
    assert torch.equal(dense.cpu(), expected) and torch.equal(ragged.cpu(), expected)
