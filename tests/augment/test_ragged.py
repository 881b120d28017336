"""Images of different sizes in one batch: RandomResizedCrop draws each box from its own image and
crops and resizes them as torchvision would, on the CPU path (exact) and the batched GPU path."""

import math

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2.functional as F2

from gpufeed import DataError
from gpufeed.augment import Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop
from gpufeed.augment.ragged_resize import batched_ragged
from gpufeed.store.ragged import Ragged

from stats import gen as _gen

SIZES = [(300, 500), (375, 500), (500, 333), (64, 48), (250, 251), (40, 400)]


def _images(sizes=SIZES, seed=0, dtype=torch.uint8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g).to(dtype) for h, w in sizes]


def test_a_ragged_batch_keeps_each_image_as_it_is():
    images = _images()
    r = Ragged.stack(images)
    assert len(r) == 6 and r.shapes[:, 1:].tolist() == [list(s) for s in SIZES]
    assert all(torch.equal(r.image(i), im) for i, im in enumerate(images))
    picked = r.select(torch.tensor([4, 1]))
    assert torch.equal(picked.image(0), images[4]) and picked.data.data_ptr() == r.data.data_ptr()  # views
    with pytest.raises(DataError, match=r"image 1 is \(1, 4, 4\)"):
        Ragged.stack([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)])


@pytest.mark.parametrize("kernel", ["torch", "float"], ids=["v2", "v1"])
@pytest.mark.parametrize("antialias", [True, False])
def test_each_image_is_cropped_and_resized_exactly_as_torchvision_does(antialias, kernel):
    import torchvision.transforms.functional as F1

    images = _images()
    op = RandomResizedCrop((56, 72), antialias=antialias, kernel=kernel)
    functional = F2 if kernel == "torch" else F1  # v2's uint8 kernel, or v1's through float32
    x = Ragged.stack(images)
    params = op.sample(x, _gen(1))
    out = op.apply(x, params)
    assert out.shape == (6, 3, 56, 72) and out.dtype == torch.uint8
    for i, im in enumerate(images):
        box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
        assert 0 <= box[0] <= im.shape[1] - box[2] and 0 <= box[1] <= im.shape[2] - box[3]
        assert torch.equal(out[i], functional.resized_crop(im, *box, [56, 72], antialias=antialias)), i


@pytest.mark.parametrize("hwc", [True, False], ids=["channels-last", "channels-first"])
@pytest.mark.parametrize("antialias", [True, False])
def test_the_batched_path_matches_torchvision_in_a_few_kernels(antialias, hwc):
    images = [im / 255 for im in _images(dtype=torch.float32)]
    x = Ragged.stack(images, hwc=hwc)
    assert all(torch.equal(x.image(i), im) for i, im in enumerate(images))
    op = RandomResizedCrop(48, antialias=antialias)
    p = op.sample(x, _gen(2))
    boxes = torch.stack([p["top"], p["left"], p["height"], p["width"]], 1).tolist()
    out = batched_ragged(x, p["top"], p["left"], p["height"], p["width"], (48, 48), antialias)
    for i, im in enumerate(images):
        ref = F2.resized_crop(im, *boxes[i], [48, 48], antialias=antialias)
        assert (out[i] - ref).abs().max() < 2e-5, i  # float rounding of the weights and sums
    x8 = Ragged.stack(_images())
    out8 = batched_ragged(x8, p["top"], p["left"], p["height"], p["width"], (48, 48), antialias)
    ref8 = torch.stack([F2.resized_crop(x8.image(i), *boxes[i], [48, 48], antialias=antialias) for i in range(6)])
    assert (out8.int() - ref8.int()).abs().max() <= 1  # torchvision's uint8 kernel is fixed point


def _ks(a, b):
    grid = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a.sort().values, grid, right=True).double() / a.numel()
    cdf_b = torch.searchsorted(b.sort().values, grid, right=True).double() / b.numel()
    return float((cdf_a - cdf_b).abs().max())


def test_boxes_follow_torchvision_get_params_for_each_images_own_size():
    # Two sizes in one batch, many draws: the box area fraction and log aspect match torchvision's draws.
    n = 4000
    sizes = [(300, 500), (500, 120)] * (n // 2)
    x = Ragged(
        torch.zeros(1, dtype=torch.uint8), torch.zeros(n, dtype=torch.long), torch.tensor([[3, h, w] for h, w in sizes])
    )
    op = RandomResizedCrop(32)
    p = op.sample(x, _gen(3))
    torch.manual_seed(0)
    for which, (h, w) in enumerate(sizes[:2]):
        ours = (p["height"][which::2] * p["width"][which::2]).double() / (h * w)
        ref = []
        img = torch.zeros(1, h, w)
        for _ in range(n // 2):
            _, _, bh, bw = T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])
            ref.append(bh * bw / (h * w))
        ref = torch.tensor(ref, dtype=torch.float64)
        # Two-sample KS statistic on the area fractions; critical value at alpha = 1e-3 for n = m = 2000.
        assert _ks(ours, ref) < 1.95 * math.sqrt(2 / (n // 2)), (h, w)
        assert bool((p["height"][which::2] <= h).all() and (p["width"][which::2] <= w).all())


def test_a_compose_takes_a_ragged_batch_when_it_starts_with_random_resized_crop():
    images = _images()
    aug = Compose([RandomResizedCrop(32), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.2] * 3)])
    out = aug(Ragged.stack(images), generator=_gen(4))
    assert out.shape == (6, 3, 32, 32) and out.dtype == torch.float32
    with pytest.raises(DataError, match="RandomHorizontalFlip needs images of one size.*RandomResizedCrop first"):
        Compose([RandomHorizontalFlip(), RandomResizedCrop(32)])(Ragged.stack(images), generator=_gen(4))


@pytest.mark.parametrize("antialias", [True, False])
def test_bicubic_on_images_of_different_sizes_per_box_and_batched(antialias):
    from torchvision.transforms import InterpolationMode

    images = [im / 255 for im in _images(dtype=torch.float32)]
    x = Ragged.stack(images)
    op = RandomResizedCrop(48, antialias=antialias, interpolation="bicubic")
    p = op.sample(x, _gen(3))
    boxes = torch.stack([p["top"], p["left"], p["height"], p["width"]], 1).tolist()
    per_box = op.apply(x, p)  # the CPU path: torchvision's own kernel per box
    batched = batched_ragged(x, p["top"], p["left"], p["height"], p["width"], (48, 48), antialias, "bicubic")
    for i, im in enumerate(images):
        ref = F2.resized_crop(im, *boxes[i], [48, 48], InterpolationMode.BICUBIC, antialias=antialias)
        assert (per_box[i] - ref).abs().max() < 1e-6, i
        assert (batched[i] - ref).abs().max() < 1e-4, i  # float rounding of the weights and sums
