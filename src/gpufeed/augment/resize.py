"""RandomResizedCrop, batched: a per-sample box resized to one output size by two matrix products.

Resizing a box of its own size for every sample cannot use one ``interpolate`` call. But bilinear
resampling is separable and linear: for each sample, ``out = Wy @ crop @ Wx.T`` with ``Wy``
(``out_h x H``) and ``Wx`` (``out_w x W``) holding the triangle-filter weights restricted to the
box. With the filter widened by the scale factor when shrinking (``antialias=True``) these are
exactly the weights of ``F.interpolate(..., mode="bilinear", antialias=True)``; with
``antialias=False``, those of plain bilinear. Two batched matmuls do the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .transforms import BatchTransform, Params, _pair

__all__ = ["RandomResizedCrop", "resized_crop"]


def _weights(start: torch.Tensor, length: torch.Tensor, in_len: int, out_len: int, antialias: bool) -> torch.Tensor:
    """``(N, out_len, in_len)`` resampling weights of the boxes ``[start, start + length)``."""
    scale = length.to(torch.float64).view(-1, 1, 1) / out_len
    support = scale.clamp(min=1.0) if antialias else torch.ones_like(scale)
    centre = (torch.arange(out_len, dtype=torch.float64, device=start.device).view(1, -1, 1) + 0.5) * scale
    k = torch.arange(in_len, dtype=torch.float64, device=start.device).view(1, 1, -1) - start.view(-1, 1, 1)
    w = (1 - ((k + 0.5 - centre) / support).abs()).clamp(min=0)
    w = w * ((k >= 0) & (k < length.view(-1, 1, 1)))
    return (w / w.sum(dim=2, keepdim=True)).to(torch.float32)


def resized_crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool = True,
) -> torch.Tensor:
    """Crop each sample's box and resize it to ``size`` with bilinear interpolation.

    Equals ``F.resized_crop(img, top, left, height, width, size, antialias=antialias)`` sample by
    sample: to float rounding for float input; uint8 input is rounded back to uint8 (torchvision's
    own uint8 kernel uses fixed point, so the two can differ by one level).
    """
    n, c, h, w = x.shape
    wy = _weights(top, height, h, size[0], antialias)
    wx = _weights(left, width, w, size[1], antialias)
    work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    out = torch.matmul(wy.to(work.dtype).unsqueeze(1), work)  # (N, C, out_h, W)
    out = torch.matmul(out, wx.to(work.dtype).transpose(1, 2).unsqueeze(1))  # (N, C, out_h, out_w)
    if x.dtype == torch.uint8:
        return out.round_().clamp_(0, 255).to(torch.uint8)
    return out.to(x.dtype)


@dataclass(frozen=True)
class RandomResizedCrop(BatchTransform):
    """torchvision's ``RandomResizedCrop`` (bilinear), with a box drawn per sample.

    Per sample, up to 10 (area, log aspect ratio) draws; the first box that fits is used, else the
    central crop of torchvision's fallback -- the same distribution as torchvision's loop.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    antialias: bool = True
    attempts: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        if not (0 < self.scale[0] <= self.scale[1]):
            raise ConfigError(f"scale={self.scale!r} must satisfy 0 < min <= max")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigError(f"ratio={self.ratio!r} must satisfy 0 < min <= max")

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        n, _, height, width = x.shape
        u = torch.rand((4, n, self.attempts), generator=generator, device=x.device, dtype=torch.float64)
        area = height * width * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[0])
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lo + (hi - lo) * u[1])
        w = torch.round(torch.sqrt(area * aspect)).long()
        h = torch.round(torch.sqrt(area / aspect)).long()
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)
        h, w = h.gather(1, first).squeeze(1), w.gather(1, first).squeeze(1)
        top = (u[2, :, 0] * (height - h + 1)).floor().long()
        left = (u[3, :, 0] * (width - w + 1)).floor().long()
        # torchvision's fallback when no draw fits: the central crop at the nearest allowed ratio.
        fh, fw = _central_box(height, width, self.ratio)
        any_fit = fits.any(dim=1)
        return {
            "top": torch.where(any_fit, top, (height - fh) // 2),
            "left": torch.where(any_fit, left, (width - fw) // 2),
            "height": torch.where(any_fit, h, fh),
            "width": torch.where(any_fit, w, fw),
        }

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        return self.size  # type: ignore[return-value]

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        p = params
        return resized_crop(x, p["top"], p["left"], p["height"], p["width"], self.size, self.antialias)  # type: ignore[arg-type]


def _central_box(height: int, width: int, ratio: Sequence[float]) -> tuple[int, int]:
    in_ratio = width / height
    if in_ratio < min(ratio):
        return int(round(width / min(ratio))), width
    if in_ratio > max(ratio):
        return height, int(round(height * max(ratio)))
    return height, width
