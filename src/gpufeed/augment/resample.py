"""Resized crops of one-size batches: each sample's box resampled to one output size by two matrix products.

Resizing a box of its own size for every sample cannot use one ``interpolate`` call. But bilinear
resampling is separable and linear: for each sample, ``out = Wy @ crop @ Wx.T`` with ``Wy``
(``out_h x H``) and ``Wx`` (``out_w x W``) holding the triangle-filter weights restricted to the
box. With the filter widened by the scale factor when shrinking (``antialias=True``) these are
exactly the weights of ``F.interpolate(..., mode="bilinear", antialias=True)``; with
``antialias=False``, those of plain bilinear. Two batched matmuls do the whole batch. The filter taps
(:func:`resample_taps`) and the per-image CPU path (:func:`resize_on_cpu`) serve the ragged batches too
(:mod:`.ragged_resize`).

Dense matrices make every output pixel read the whole row: at 224 px, 34 GFLOP a batch of 256. They resize float
batches; a uint8 batch is resampled from its taps (:mod:`.taps`: compiled where the compiler has built it, else the
same arithmetic eager).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..store.ragged import Ragged
from .fixed_point import fixed_resized_crop
from .paths import host_path
from .pillow_resize import pillow_resized
from .taps import fused_resized_crop, resample_taps

__all__ = ["boxes", "resample_taps", "resize_on_cpu", "resized_crop"]


def _weights(
    start: torch.Tensor, length: torch.Tensor, in_len: int, out_len: int, antialias: bool, mode: str = "bilinear"
) -> torch.Tensor:
    """``(N, out_len, in_len)`` resampling weights of the boxes ``[start, start + length)``
    (:func:`resample_taps`, placed)."""
    k, w = resample_taps(start, length, out_len, antialias, mode)
    dense = torch.zeros(k.shape[0], out_len, in_len, dtype=torch.float32, device=start.device)
    return dense.scatter_add_(2, k + start.view(-1, 1, 1), w)


def resized_crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool = True,
    mode: str = "bilinear",
    kernel: str = "float",
    modes: Sequence[str] = (),
) -> torch.Tensor:
    """Crop each sample's box and resize it to ``size`` with ``mode`` ("bilinear" or "bicubic") interpolation
    (``modes``: the op's others, drawn for other samples; see ``taps.tables``).

    Equals ``F.resized_crop(img, top, left, height, width, size, antialias=antialias)`` sample by
    sample: to float rounding for float input. uint8 input goes by ``kernel``: "float" is torchvision
    v1's (float32, rounded back: within one level of it), "torch" v2's on the CPU and "pil" Pillow's
    (both exact, :mod:`.fixed_point`; "pil" on the CPU calls Pillow itself).
    """
    if x.dtype == torch.uint8 and kernel != "float" and mode != "nearest":
        if host_path(x) and (kernel == "torch" or x.shape[1] in (1, 3)):
            # On the CPU the library's own kernel per image is exact by definition, and faster than the batched
            # integer gathers (v2's uint8 resize: 6x at 256 crops of 32x32, 10x at 64 of 375x500 to 224; measured).
            crops = boxes(x, top, left, height, width)
            return resize_on_cpu(crops, x.shape[1], x.dtype, size, antialias, mode, kernel)
        return fixed_resized_crop(x, top, left, height, width, size, antialias, mode, kernel)
    if x.dtype == torch.uint8 and mode != "nearest":  # by its taps, compiled or not: one arithmetic (.taps)
        return fused_resized_crop(x, top, left, height, width, size, antialias, mode, modes=modes)
    n, c, h, w = x.shape
    wy = _weights(top, height, h, size[0], antialias, mode)
    wx = _weights(left, width, w, size[1], antialias, mode)
    work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    out = torch.matmul(wy.to(work.dtype).unsqueeze(1), work)  # (N, C, out_h, W)
    out = torch.matmul(out, wx.to(work.dtype).transpose(1, 2).unsqueeze(1))  # (N, C, out_h, out_w)
    if x.dtype == torch.uint8:
        return out.round_().clamp_(0, 255).to(torch.uint8)
    return out.to(x.dtype)


def boxes(
    x: torch.Tensor | Ragged, top: torch.Tensor, left: torch.Tensor, height: torch.Tensor, width: torch.Tensor
) -> list[torch.Tensor]:
    """Each sample's box as a ``(C, h, w)`` view of ``x`` (a batch or a Ragged batch of images, on the CPU)."""
    image = x.image if isinstance(x, Ragged) else x.__getitem__
    spans = torch.stack([top, left, height, width], 1).tolist()
    return [image(i)[:, y0 : y0 + h, x0 : x0 + w] for i, (y0, x0, h, w) in enumerate(spans)]


def resize_on_cpu(
    crops: Sequence[torch.Tensor],
    channels: int,
    dtype: torch.dtype,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    kernel: str,
) -> torch.Tensor:
    """Each ``(C, h, w)`` crop resized by the user's own library, stacked: exact by definition. torchvision v2's
    ``resize`` ("torch": its vectorised uint8 kernel, 30-50x faster than a batched gather on the CPU, fed
    channels-last), v1's ("float": through float32), or Pillow ("pil")."""
    # torchvision here, not at the top: importing it imports torch._dynamo (torchvision.ops), 3-4 s of every
    # `import gpufeed` that most processes never pay back
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import resize as v1_resize
    from torchvision.transforms.v2.functional import resize as v2_resize

    uint8 = dtype == torch.uint8 and mode != "nearest"
    if uint8 and kernel == "pil" and channels in (1, 3):
        return pillow_resized(crops, size, mode)
    out = torch.empty((len(crops), channels, *size), dtype=dtype)
    for i, crop in enumerate(crops):
        batch = crop.unsqueeze(0)
        if uint8 and kernel == "float":  # v1: through float32, rounded once
            out[i] = v1_resize(batch, list(size), interpolation=InterpolationMode(mode), antialias=antialias)[0]
            continue
        if dtype == torch.uint8:  # the uint8 kernel's fast path reads contiguous channels-last
            batch = batch.contiguous(memory_format=torch.channels_last)
        out[i] = v2_resize(batch, list(size), interpolation=InterpolationMode(mode), antialias=antialias)[0]
    return out
