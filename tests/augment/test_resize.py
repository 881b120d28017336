import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF

from gpufeed.augment import Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip
from gpufeed.errors import ConfigError
from gpufeed.store.ragged import Ragged

from stats import DRAWS, ks_critical, ks_statistic
from stats import gen as _gen

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.25)


def _pinned_reference(x, params, i, size, antialias):
    box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
    return TF.resized_crop(x[i], *box, list(size), antialias=antialias)


def test_float_pixels_equal_torchvision_resized_crop(device):
    x = torch.rand(48, 3, 40, 30, generator=_gen(1)).to(device)
    for antialias in (True, False):
        op = RandomResizedCrop((24, 28), antialias=antialias)
        params = op.sample(x, _gen(2, device))
        out = op.apply(x, params)
        for i in range(48):
            ref = _pinned_reference(x.cpu(), {k: v.cpu() for k, v in params.items()}, i, (24, 28), antialias)
            assert (out[i].cpu() - ref).abs().max() < 1e-5  # float rounding of weights and sums


def test_uint8_pixels_are_within_one_level_of_torchvision():
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=_gen(3))
    op = RandomResizedCrop(24)
    params = op.sample(x, _gen(4))
    out = op.apply(x, params)
    ref = torch.stack([_pinned_reference(x, params, i, (24, 24), True) for i in range(64)])
    diff = (out.int() - ref.int()).abs()
    assert diff.max() <= 1 and (diff > 0).double().mean() < 0.01  # torchvision's uint8 kernel is fixed point


def test_box_distribution_matches_torchvision_get_params():
    img = torch.zeros(3, 40, 30)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tv = torch.tensor([T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(DRAWS)])
    params = RandomResizedCrop(24).sample(torch.zeros(DRAWS, 3, 40, 30), _gen(5))
    ours = torch.stack([params[k] for k in ("top", "left", "height", "width")], dim=1)
    for k in range(4):
        assert ks_statistic(ours[:, k], tv[:, k]) < ks_critical(DRAWS, DRAWS)
    area = ours[:, 2] * ours[:, 3]
    assert ks_statistic(area, tv[:, 2] * tv[:, 3]) < ks_critical(DRAWS, DRAWS)


def test_no_fitting_draw_falls_back_to_torchvisions_central_crop():
    x = torch.zeros(5, 1, 20, 20)
    params = RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(2.0, 3.0)).sample(x, _gen())
    # a 20x20 image cannot hold any box of ratio >= 2 covering its whole area: central crop at ratio 2
    expected = T.RandomResizedCrop.get_params(torch.zeros(1, 20, 20), [1.0, 1.0], [2.0, 3.0])
    for i in range(5):
        assert tuple(int(params[k][i]) for k in ("top", "left", "height", "width")) == expected


def test_bicubic_equals_torchvision_on_floats_and_within_one_level_on_uint8():
    from torchvision.transforms import InterpolationMode

    bicubic = InterpolationMode.BICUBIC
    x = torch.rand(40, 3, 40, 30, generator=_gen(5))
    x8 = (x * 255).round().to(torch.uint8)
    for antialias in (True, False):
        for size in ((24, 28), (56, 44)):  # shrinking and growing
            op = RandomResizedCrop(size, antialias=antialias, interpolation="bicubic")
            params = op.sample(x, _gen(6))
            out, out8 = op.apply(x, params), op.apply(x8, params)
            for i in range(40):
                box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
                ref = TF.resized_crop(x[i], *box, list(size), bicubic, antialias=antialias)
                assert (out[i] - ref).abs().max() < 1e-4, (antialias, size, i)  # float rounding only
                ref8 = TF.resized_crop(x8[i], *box, list(size), bicubic, antialias=antialias)
                assert (out8[i].int() - ref8.int()).abs().max() <= 1, (antialias, size, i)


def test_nearest_equals_torchvision_exactly_shrinking_and_growing():
    from torchvision.transforms import InterpolationMode

    x = torch.rand(60, 3, 37, 29, generator=_gen(7))
    x8 = (x * 255).to(torch.uint8)
    for size in ((16, 20), (50, 44), (74, 58)):  # 74 = 2 x 37 takes PyTorch's shift path
        op = RandomResizedCrop(size, scale=(0.5, 1.0), interpolation="nearest")
        params = op.sample(x, _gen(8))
        out, out8 = op.apply(x, params), op.apply(x8, params)
        for i in range(60):
            box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
            assert torch.equal(out[i], TF.resized_crop(x[i], *box, list(size), InterpolationMode.NEAREST))
            assert torch.equal(out8[i], TF.resized_crop(x8[i], *box, list(size), InterpolationMode.NEAREST))


def test_an_empty_batch_passes_through_with_a_random_interpolation():
    x = torch.zeros(0, 3, 8, 8, dtype=torch.uint8)
    op = RandomResizedCrop(6, interpolation=("bilinear", "bicubic"))
    assert op(x, generator=torch.Generator().manual_seed(0)).shape == (0, 3, 6, 6)


@pytest.mark.parametrize("reciprocal", [False, True])
def test_pillow_boxes_with_their_flips_and_normalize_equal_the_ops_one_by_one(reciprocal):
    # Compose runs them per image on the CPU's threads (augment/pillow_resize.py): a Ragged batch of photos, a batch
    # of one size channels-first (its boxes copied for Pillow), gray images; the same draws as the ops one by one
    g = torch.Generator().manual_seed(0)
    photos = [torch.randint(0, 256, (3, *hw), dtype=torch.uint8, generator=g) for hw in [(40, 52), (33, 30), (61, 47)]]
    batches = [
        Ragged.stack(photos * 3),
        torch.randint(0, 256, (7, 3, 45, 38), dtype=torch.uint8, generator=g),
        Ragged.stack([p[:1] for p in photos] * 2),
    ]
    for x in batches:
        channels = int(x.shapes[0, 0]) if isinstance(x, Ragged) else x.shape[1]
        for mode in ("bilinear", "bicubic"):
            crop = RandomResizedCrop((24, 28), interpolation=mode, kernel="pil")
            flip, vflip = RandomHorizontalFlip(), RandomVerticalFlip()
            norm = Normalize([0.4] * channels, [0.3] * channels, reciprocal=reciprocal)
            for ops in ([crop, flip, vflip, norm], [crop, flip]):  # float out; uint8 out
                ours = Compose(ops)(x, generator=torch.Generator().manual_seed(5))
                s = torch.Generator().manual_seed(5)
                one_by_one = x
                for op in ops:
                    one_by_one = op(one_by_one, generator=s)
                assert ours.dtype == one_by_one.dtype and torch.equal(ours, one_by_one), (type(x).__name__, mode)


def test_pillow_reads_rows_it_cannot_take_in_place_from_a_copy_and_a_wrong_normalize_is_refused():
    row = torch.randint(0, 256, (1, 3, 1, 64), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    x = row.expand(4, 3, 48, 64)  # every row the same: a stride of 0 between them
    crop = RandomResizedCrop(32, kernel="pil")
    ours = crop(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ours, crop(x.contiguous(), generator=torch.Generator().manual_seed(0)))
    gray = torch.randint(0, 256, (4, 1, 40, 40), dtype=torch.uint8)
    with pytest.raises(ConfigError, match="mean="):  # as Normalize refuses it one op at a time
        Compose([crop, Normalize(MEAN, STD)])(gray, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kernel", ["pil", "float"])
def test_an_empty_batch_passes_a_resize_with_its_flips_and_a_float64_normalize(kernel):
    from gpufeed.augment import RandomApply

    aug = Compose([RandomResizedCrop(24, kernel=kernel), RandomHorizontalFlip(), RandomApply([RandomVerticalFlip()]),
                   Normalize(MEAN, STD, dtype=torch.float64)])  # fmt: skip
    out = aug(torch.zeros(0, 3, 40, 40, dtype=torch.uint8), generator=torch.Generator().manual_seed(0))
    assert out.shape == (0, 3, 24, 24) and out.dtype == torch.float64


def test_pillow_boxes_on_the_pools_threads_equal_torchvisions_pil_resize_and_pillows_pixels_are_read_in_place(
    monkeypatch,
):
    # images with enough work (box and output pixels: pillow_resize._THREADED_PIXELS) go to the pool's threads, and
    # each resized image is read where Pillow keeps it (the Arrow export): the pixels of torchvision's PIL path
    import numpy
    import PIL.Image
    from torchvision.transforms import InterpolationMode

    import gpufeed.augment.pillow_resize as pillow_resize
    from gpufeed.augment.pillow_resize import _pixels

    workers = []
    spread = pillow_resize.spread
    monkeypatch.setattr(
        pillow_resize, "spread", lambda each, n, threads: workers.append(threads) or spread(each, n, threads)
    )
    small = torch.zeros(4, 3, 32, 32, dtype=torch.uint8)
    RandomResizedCrop(32, kernel="pil")(small, generator=_gen(0))
    assert workers == [1]  # 32 px boxes to 32 px: on this thread
    g = torch.Generator().manual_seed(3)
    photos = [torch.randint(0, 256, (3, *hw), dtype=torch.uint8, generator=g) for hw in [(150, 190), (201, 133)]]
    x = Ragged.stack(photos * 4)
    for mode in ("bilinear", "bicubic"):
        op = RandomResizedCrop((120, 116), interpolation=mode, kernel="pil")
        params = op.sample(x, _gen(4))
        out = op.apply(x, params)
        for i in range(len(x)):
            box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
            image = TF.to_pil_image(x.image(i))
            ref = TF.pil_to_tensor(TF.resized_crop(image, *box, [120, 116], InterpolationMode(mode), antialias=True))
            assert torch.equal(out[i], ref), (mode, i)
    assert workers[1:] == [None, None]  # photos' boxes to 120 px: on the pool

    rgb = PIL.Image.fromarray(numpy.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=numpy.uint8))
    for image in (rgb, rgb.convert("L")):
        expected = numpy.array(image).reshape(30, 40, -1)
        view = _pixels(image)
        del image  # the view holds the export, which holds Pillow's pixels
        assert numpy.array_equal(view[..., : expected.shape[2]], expected) and not view.flags.writeable

    import PIL

    import gpufeed.augment.pillow_resize as pillow_resize

    core = PIL.Image.core
    if hasattr(core, "set_alignment"):  # rows padded to 16 bytes (PILLOW_ALIGNMENT): numpy's copy of the pixels
        core.set_alignment(16)
        try:
            padded = PIL.Image.fromarray(numpy.array(rgb)[:, :37])
            copied = _pixels(padded)
            assert numpy.array_equal(copied, numpy.array(padded)) and copied.flags.writeable
        finally:
            core.set_alignment(1)
    monkeypatch.setattr(PIL, "__version__", "11.2.1")  # its export never released an RGB image: the copy
    pillow_resize._exports_safely.cache_clear()
    try:
        assert not pillow_resize._exports_safely() and _pixels(rgb).flags.writeable
    finally:
        monkeypatch.undo()
        pillow_resize._exports_safely.cache_clear()
    assert pillow_resize._exports_safely() == (tuple(map(int, PIL.__version__.split(".")[:2])) >= (11, 3))

    class Older:  # a Pillow without the export: numpy's copy
        def __init__(self, image):
            self.im, self.height, self.width = object(), image.height, image.width
            self.__array_interface__ = image.__array_interface__

    assert numpy.array_equal(_pixels(Older(rgb)), numpy.array(rgb))
    several_blocks = PIL.Image.new("RGB", (2100, 2100), (1, 2, 3))  # over Pillow's 16 MiB block: no export
    assert _pixels(several_blocks).shape == (2100, 2100, 3)
