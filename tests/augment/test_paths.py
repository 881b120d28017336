"""The device's code path, run on the CPU (augment.paths.device_path), gives the host path's pixels bit for bit.

On a GPU every op below takes its whole-batch path (masks instead of sample subsets, the batched fixed-point
resampler instead of the library's per-image kernel, one gather instead of chunks): these tests are what checks
that path's pixels on machines without one, over random sizes and parameters."""

from __future__ import annotations

import pytest
import torch

from gpufeed import augment as A
from gpufeed.augment.keyed import mix32
from gpufeed.augment.paths import device_path, host_path
from gpufeed.store.ragged import Ragged

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _both(transform, x, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    host = transform(x, generator=torch.Generator().manual_seed(seed))
    with device_path():
        device = transform(x, generator=torch.Generator().manual_seed(seed))
    return host, device


def _images(seed: int, n: int, h: int, w: int, channels: int = 3) -> torch.Tensor:
    return torch.randint(0, 256, (n, channels, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_the_switch_is_scoped_to_its_block_and_leaves_cuda_batches_alone():
    x = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    assert host_path(x)
    with device_path():
        assert not host_path(x)
        with device_path():
            assert not host_path(x)
        assert not host_path(x)
    assert host_path(x) and not host_path(x.to("meta"))


@pytest.mark.parametrize("seed", range(4))
def test_colour_jitter_by_masks_equals_it_by_sample_subsets(seed):
    g = torch.Generator().manual_seed(100 + seed)
    n, h, w = (int(v) for v in torch.randint(3, 40, (3,), generator=g))
    strength = [float(v) for v in torch.rand(4, generator=g)]
    jitter = A.ColorJitter(strength[0], strength[1], strength[2], strength[3] / 2)
    host, device = _both(jitter, _images(seed, n, h, w), seed)
    assert torch.equal(host, device)
    # with alpha (an RGBA batch: jittered colour, opaque alpha when hue moves)
    host, device = _both(jitter, _images(seed, n, h, w, channels=4), seed)
    assert torch.equal(host, device)


@pytest.mark.parametrize("seed", range(3))
def test_crop_flip_normalise_by_one_gather_equals_it_by_cached_chunks(seed):
    g = torch.Generator().manual_seed(200 + seed)
    size = int(torch.randint(8, 48, (1,), generator=g))
    recipe = A.Compose([A.RandomCrop(size, padding=size // 8), A.RandomHorizontalFlip(), A.Normalize(MEAN, STD)])
    host, device = _both(recipe, _images(seed, 300, size, size), seed)  # 300: more than one chunk at 48 px
    assert host.dtype == device.dtype == torch.float32 and torch.equal(host, device)


@pytest.mark.parametrize("kernel", ["torch", "pil"])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_resized_crops_by_the_batched_fixed_point_kernel_equal_the_librarys_own(kernel, mode):
    x = _images(7, 12, 37, 51)
    crop = A.RandomResizedCrop((24, 20), interpolation=mode, kernel=kernel)
    host, device = _both(crop, x, 3)
    assert torch.equal(host, device)
    ragged = Ragged.stack([x[i, :, : 20 + i, : 30 + 2 * i] for i in range(len(x))])
    host, device = _both(crop, ragged, 4)
    assert torch.equal(host, device)


def test_keyed_mixing_whole_equals_it_piece_by_piece():
    h = torch.randint(0, 2**31 - 1, (3 << 16,), dtype=torch.int64, generator=torch.Generator().manual_seed(5))
    host = mix32(h.clone())
    with device_path():
        device = mix32(h.clone())
    assert torch.equal(host, device)
