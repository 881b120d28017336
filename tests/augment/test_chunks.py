"""The CPU path (rows gathered first, chunks sized to the cache, Normalize fused) gives the same tensors as the
one-gather path and torchvision's ops, with chunks of a few samples and with the whole batch in one."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms.functional as TF1
import torchvision.transforms.v2.functional as TF

from gpufeed import augment as A
from gpufeed.augment import chunks as C
from gpufeed.augment import functional as F
from gpufeed.augment import geometry as G

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(params=[(3, 0), (10**6, 10**9)])
def chunk(request, monkeypatch):
    """Chunks of 3 samples (every test crosses chunk boundaries), flips one sample at a time; or the whole
    batch in one chunk, flips all at once."""
    size, flip_each = request.param
    monkeypatch.setattr(C, "chunk_samples", lambda bytes_per_sample: size)
    monkeypatch.setattr(C, "FLIP_EACH_PIXELS", flip_each)
    return size


def _reference(x, ops, g):
    """The same ops applied one by one, without fusion, chunks or slices."""
    for op in ops:
        x = op.apply(x, op.sample(x, g) if op.random else {})
    return x


@pytest.mark.parametrize("size, pad", [(9, 2), (24, 3), (40, 5), (37, 0)])
@pytest.mark.parametrize("fill", [0, 7, (1, 2, 3)])
def test_crop_flip_normalize_equals_the_ops_one_by_one(size, pad, fill, chunk):
    x = torch.randint(
        0, 256, (11, 3, size + 3, size - 1), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    ops = [
        A.RandomCrop(size, padding=pad, fill=fill, pad_if_needed=True),
        A.RandomHorizontalFlip(),
        A.RandomVerticalFlip(),
        A.Normalize(MEAN, STD),
    ]
    got = A.Compose(ops)(x, generator=torch.Generator().manual_seed(5))
    ref = _reference(x, ops, torch.Generator().manual_seed(5))
    assert got.dtype == torch.float32 and torch.equal(got, ref)


def test_the_fused_normalize_equals_torchvisions_per_image(chunk):
    x = torch.randint(0, 256, (7, 3, 30, 34), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    top, left = torch.tensor([0, 1, 2, 3, 4, 5, 6]), torch.tensor([6, 5, 4, 3, 2, 1, 0])
    m = G.crop_map(top, left, (28, 28), (30, 34), padding=(3, 3, 3, 3))
    m = m.then(G.flip_map(torch.tensor([True, False] * 3 + [True]), 28, "cols"))
    got, done = A.transforms._remap(x, m, A.Normalize(MEAN, STD))
    assert done
    for i in range(7):
        img = TF.pad(x[i], [3, 3, 3, 3])
        img = TF.crop(img, int(top[i]), int(left[i]), 28, 28)
        img = TF.horizontal_flip(img) if i % 2 == 0 else img
        ref = TF1.normalize(TF1.convert_image_dtype(img, torch.float32), list(MEAN), list(STD))  # v1: / 255
        assert torch.equal(got[i], ref), i


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_output_dtypes_compute_in_float32_then_cast_as_normalize_does(dtype, chunk):
    x = torch.randint(0, 256, (5, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    ops = [A.RandomCrop(16, padding=2), A.RandomHorizontalFlip(), A.Normalize(MEAN, STD, dtype=dtype)]
    got = A.Compose(ops)(x, generator=torch.Generator().manual_seed(0))
    ref = _reference(x, ops, torch.Generator().manual_seed(0))
    assert got.dtype == dtype and torch.equal(got, ref)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "symmetric"])
@pytest.mark.parametrize("axes", ["both", "rows", "cols"])
def test_rows_first_equals_the_flat_gather_for_every_padding_and_axis(mode, axes):
    n = 6
    x = torch.randint(0, 256, (n, 3, 20, 17), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    m = G.crop_map(torch.arange(n), torch.arange(n), (21, 19), (20, 17), (3, 4, 2, 5), padding_mode=mode, fill=9)
    m = m.then(G.flip_map(torch.tensor([True, False] * 3), 19, "cols"))
    if axes != "both":
        m = G.IndexMap(
            m.rows if axes == "rows" else None, m.cols if axes == "cols" else None, None, None, m.fill
        )  # fmt: skip
    fill = F.constant(9, x, "fill")
    assert torch.equal(G.remap(x, m, fill, rows_first=True), G.remap(x, m, fill))
    assert torch.equal(C.remap_windows(x, m, fill), G.remap(x, m, fill))  # reflected columns: rows first


@pytest.mark.parametrize("fill", [0, 200])
def test_windows_past_either_end_of_the_batch_read_the_right_pixels(fill):
    # sample 0 cropped at the padded top-left corner (its first window starts before the batch), the last at the
    # bottom-right (its last window ends after it); one flipped; 1-pixel-wide and 1-row images too
    for shape in [(3, 3, 8, 8), (2, 1, 1, 5), (2, 2, 6, 1)]:
        n, c, h, w = shape
        x = torch.randint(1, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(n + h))
        pad = (3, 2, 3, 2)
        top = torch.tensor([0] * (n - 1) + [h + 4 - h])
        left = torch.tensor([0] * (n - 1) + [w + 6 - w])
        m = G.crop_map(top, left, (h, w), (h, w), pad, fill=fill)
        m = m.then(G.flip_map(torch.tensor([False] * (n - 1) + [True]), w, "cols"))
        tensor_fill = F.constant(fill, x, "fill")
        assert torch.equal(C.remap_windows(x, m, tensor_fill), G.remap(x, m, tensor_fill)), shape


def test_a_crop_larger_than_the_image_is_mostly_fill(chunk):
    x = torch.randint(1, 256, (4, 1, 3, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    ops = [A.RandomCrop(90, padding=0, pad_if_needed=True, fill=0)]
    got = A.Compose(ops)(x, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got, _reference(x, ops, torch.Generator().manual_seed(1)))
    assert int((got > 0).sum()) == 4 * 9  # each image's 9 pixels somewhere in 90x90 of fill


def test_normalize_alone_on_the_cpu_is_chunked_and_exact(chunk):
    x = torch.randint(0, 256, (10, 3, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(8))
    for reciprocal in (False, True):
        got = F.normalize(x, MEAN, STD, reciprocal=reciprocal)
        scaled = x.float().mul(1.0 / 255) if reciprocal else x.float().div(255)
        ref = (scaled - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
        assert torch.equal(got, ref)


def test_the_chunk_follows_the_cache_size(monkeypatch):
    C.cache_bytes.cache_clear()
    assert C.cache_bytes() >= 1 << 20  # this machine's last-level cache (sysfs), or the 8 MiB default
    monkeypatch.setattr(C, "cache_bytes", lambda: 32 << 20)
    assert C.chunk_samples(3 * 256 * 256 * 5) == 8  # 8 MiB (a quarter of 32 MiB) holds 8 samples of 960 KiB
    assert C.chunk_samples(1 << 30) == 1


def test_an_empty_batch_normalises_to_an_empty_batch():
    out = F.normalize(torch.zeros((0, 3, 8, 8), dtype=torch.uint8), MEAN, STD)
    assert out.shape == (0, 3, 8, 8) and out.dtype == torch.float32
