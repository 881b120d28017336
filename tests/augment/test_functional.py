"""Given the same parameters, each batched op equals torchvision's functional op, sample by sample."""

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image

from gpufeed.augment import functional as F
from gpufeed.augment.crop_flip import RandomCrop, RandomHorizontalFlip
from gpufeed.augment.erasing import RandomErasing
from gpufeed.augment.transforms import Compose, Normalize
from gpufeed.errors import ConfigError, DataError

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def _batch(n=6, c=3, h=9, w=7, seed=0):
    return torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _torchvision_crop(img, top, left, size, padding, pad_if_needed, fill, mode):
    """torchvision's RandomCrop.forward with its offsets pinned to (top, left)."""
    tv = T.RandomCrop(size, padding=padding, pad_if_needed=pad_if_needed, fill=fill, padding_mode=mode)
    tv.get_params = lambda _img, out: (top, left, *out)
    return tv(img)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize(
    ("size", "padding", "pad_if_needed"),
    [
        ((9, 7), 2, False),
        ((5, 4), None, False),
        ((8, 8), [1, 3], False),
        ((6, 9), [0, 1, 3, 2], False),
        ((12, 11), None, True),
        ((14, 10), 1, True),
    ],
)
def test_crop_equals_torchvision_random_crop_with_the_same_offsets(device, mode, size, padding, pad_if_needed):
    x = _batch().to(device)
    fill = 17 if mode == "constant" else 0
    op = RandomCrop(size, padding=padding, pad_if_needed=pad_if_needed, fill=fill, padding_mode=mode)
    params = op.sample(x, torch.Generator(device=device).manual_seed(1))
    out = op.apply(x, params)
    for i in range(x.shape[0]):
        top, left = int(params["top"][i]), int(params["left"][i])
        expected = _torchvision_crop(x[i].cpu(), top, left, size, padding, pad_if_needed, fill, mode)
        assert torch.equal(out[i].cpu(), expected), (i, top, left)


def test_crop_reflects_repeatedly_when_the_pad_is_wider_than_the_image():
    x = torch.arange(3, dtype=torch.uint8).view(1, 1, 1, 3)
    out = F.crop(x, torch.tensor([0]), torch.tensor([0]), (1, 11), (4, 0, 4, 0), padding_mode="reflect")
    # numpy.pad(x, 4, "reflect") on [0, 1, 2]
    assert out.flatten().tolist() == [0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]
    out = F.crop(x, torch.tensor([0]), torch.tensor([0]), (1, 11), (4, 0, 4, 0), padding_mode="symmetric")
    assert out.flatten().tolist() == [2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0]


def test_crop_with_per_channel_fill_pads_each_channel_with_its_value():
    x = torch.full((1, 3, 2, 2), 9, dtype=torch.uint8)
    out = F.crop(x, torch.tensor([0]), torch.tensor([0]), (2, 2), (1, 1, 1, 1), fill=(1, 2, 3))
    assert out[0, :, 0, 0].tolist() == [1, 2, 3]  # top-left is padding
    assert out[0, :, 1, 1].tolist() == [9, 9, 9]  # bottom-right is the image


def test_crop_matches_the_pil_pipeline_random_crop_to_tensor_normalize():
    x = _batch(n=4, h=32, w=32)
    aug = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), Normalize(MEAN, STD)])
    crop, flip, norm = aug.transforms
    g = torch.Generator().manual_seed(3)
    p_crop = crop.sample(x, g)
    y = crop.apply(x, p_crop)
    p_flip = flip.sample(y, g)
    out = norm.apply(flip.apply(y, p_flip), {})
    for i in range(4):
        pil = Image.fromarray(x[i].permute(1, 2, 0).numpy())
        pil = _torchvision_crop(pil, int(p_crop["top"][i]), int(p_crop["left"][i]), (32, 32), 4, False, 0, "constant")
        if p_flip["mask"][i]:
            pil = TF.hflip(pil)
        expected = TF.normalize(TF.to_tensor(pil), MEAN, STD)
        assert torch.equal(out[i], expected), i  # bit for bit, not approximately


def test_crop_before_normalize_pads_black_which_becomes_minus_mean_over_std():
    x = torch.full((2, 3, 4, 4), 200, dtype=torch.uint8)
    crop, norm = RandomCrop(4, padding=4), Normalize(MEAN, STD)
    out = norm.apply(crop.apply(x, {"top": torch.tensor([0, 4]), "left": torch.tensor([0, 4])}), {})
    assert torch.equal(out[0], TF.normalize(torch.zeros(3, 4, 4), MEAN, STD))  # all border
    assert torch.equal(out[1], TF.normalize(torch.full((3, 4, 4), 200 / 255), MEAN, STD))  # all image


@pytest.mark.parametrize("op, tv_op", [(F.hflip, TF.hflip), (F.vflip, TF.vflip)])
def test_flips_equal_torchvision_where_masked_and_leave_the_rest(device, op, tv_op):
    x = _batch().to(device)
    mask = torch.tensor([True, False, True, True, False, False], device=device)
    out = op(x, mask)
    for i in range(6):
        assert torch.equal(out[i].cpu(), tv_op(x[i].cpu()) if mask[i] else x[i].cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normalize_equals_to_tensor_then_normalize_bit_for_bit(device, dtype):
    x = _batch().to(device)
    out = F.normalize(x, MEAN, STD, dtype=dtype)
    expected = TF.normalize(x.float().div(255), MEAN, STD).to(dtype)
    assert out.dtype == dtype and torch.equal(out, expected)


def test_normalize_output_dtype_is_a_cast_of_the_float32_result():
    x = _batch()
    out = F.normalize(x, MEAN, STD, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, TF.normalize(x.float() / 255, MEAN, STD).bfloat16())


@pytest.mark.parametrize(
    ("src", "dst"), [(torch.uint8, torch.float32), (torch.float32, torch.uint8), (torch.float32, torch.float16)]
)
def test_convert_dtype_equals_convert_image_dtype(src, dst):
    x = _batch() if src == torch.uint8 else torch.rand(6, 3, 9, 7)
    assert torch.equal(F.convert_dtype(x, dst), TF.convert_image_dtype(x, dst))


def test_convert_dtype_refuses_other_integer_types():
    with pytest.raises(ConfigError, match="int16"):
        F.convert_dtype(_batch(), torch.int16)


def test_erase_equals_torchvision_erase_with_the_same_box(device):
    x = TF.normalize(_batch().float() / 255, MEAN, STD).to(device)
    op = RandomErasing(p=0.7, value=(0.1, 0.2, 0.3))
    params = op.sample(x, torch.Generator(device=device).manual_seed(4))
    out = op.apply(x, params)
    v = torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1)
    for i in range(x.shape[0]):
        ref = x[i].cpu()
        if params["mask"][i]:
            box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
            ref = TF.erase(ref, *box, v)
        assert torch.equal(out[i].cpu(), ref), i


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(3, 4, 4), r"got shape \(3, 4, 4\) \(add the channel axis: x.unsqueeze\(1\)\)"),
        (torch.zeros(2, 3, 4, 4, dtype=torch.int32), r"must be uint8 or floating, got dtype=torch.int32"),
        ([1, 2], r"must be a torch.Tensor of shape \(N, C, H, W\), got list"),
    ],
)
def test_check_batch_names_the_problem(bad, match):
    with pytest.raises(DataError, match=match):
        F.check_batch(bad)


def test_constant_rejects_wrong_length_and_non_pixel_fill_for_uint8():
    x = _batch()
    with pytest.raises(ConfigError, match=r"fill=\(1, 2\) must be a number or have 3 values"):
        F.constant((1, 2), x, "fill")
    with pytest.raises(ConfigError, match="0, 255"):
        F.constant(-1, x, "fill")


def test_reciprocal_scaling_equals_v2_to_dtype_and_default_equals_v1():
    import torchvision.transforms.v2.functional as F2

    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16)
    assert torch.equal(F.convert_dtype(x, torch.float32, reciprocal=True), F2.to_dtype(x, torch.float32, scale=True))
    assert torch.equal(F.convert_dtype(x, torch.float32), TF.convert_image_dtype(x, torch.float32))
    assert not torch.equal(F.convert_dtype(x, torch.float32), F.convert_dtype(x, torch.float32, reciprocal=True))
