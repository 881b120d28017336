"""torchvision's per-image random ops, batched: a coin (or a draw) per sample, the op once on the samples it picks.

This module holds the coin (``_Sometimes``) and the per-pixel ops: ``RandomSolarize``, ``RandomPosterize``,
``RandomAutocontrast``, ``RandomEqualize``, ``RandomAdjustSharpness``, ``RandomInvert``, ``RandomGrayscale`` and
``Grayscale``, and ``GaussianBlur`` (a sigma per sample). The geometric ones (``RandomRotation``,
``RandomAffine``, ``RandomPerspective``) are in :mod:`.random_geometry`, the containers (``RandomApply``,
``RandomChoice``, ``RandomOrder``) in :mod:`.containers`. Given the same draws, each equals torchvision's tensor
kernel (``transforms.functional``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as nnf

from ..errors import ConfigError
from .auto_ops import adjust_sharpness, autocontrast, equalize, posterize
from .channels import ALPHA_CHANNELS, join_alpha, split_alpha
from .color import gray
from .params import Draws, apply_on, check_finite, check_p, coin, uniform
from .transforms import BatchTransform, Params

__all__ = [
    "GaussianBlur",
    "Grayscale",
    "RandomAdjustSharpness",
    "RandomAutocontrast",
    "RandomEqualize",
    "RandomGrayscale",
    "RandomInvert",
    "RandomPosterize",
    "RandomSolarize",
    "gaussian_blur",
    "grayscale",
]


@dataclass(frozen=True)
class _Sometimes(BatchTransform):
    """An op with fixed arguments applied with probability ``p`` per sample; subclasses declare their
    arguments in torchvision's order (the op's own first, then ``p``: a field here would come first)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_p(getattr(self, "p"), type(self).__name__))  # noqa: B009
        for name in ("threshold", "sharpness_factor"):
            if hasattr(self, name):
                why = (
                    "torchvision computes no image from it (a NaN threshold never inverts a tensor's levels but "
                    "inverts every level of a PIL image; a NaN or infinite factor blends to NaN, cast to 0)"
                )
                check_finite(getattr(self, name), name, type(self).__name__, why)

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        return {"apply": coin(x, getattr(self, "p"), generator)}  # noqa: B009

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return apply_on(x, params["apply"], lambda part, idx: self.op(part))

    def op(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _uint8_only(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.uint8:
        raise ConfigError(f"{name} is defined on uint8 levels (as torchvision's); this batch is {x.dtype}")


@dataclass(frozen=True)
class RandomSolarize(_Sometimes):
    """torchvision's ``torch.where(img >= threshold, invert(img), img)``, compared as PyTorch compares a tensor with
    a Python number: in the image's dtype (an int threshold wraps on uint8: -1 is 255; half precision rounds it),
    a float one on uint8 in float32. ``pil``: Pillow's LUT, which compares the levels in Python (-1 inverts all)."""

    threshold: float
    p: float = 0.5
    pil: bool = False

    def op(self, x: torch.Tensor) -> torch.Tensor:
        if self.pil:
            from . import pil

            return pil.solarize(x, torch.full((x.shape[0],), float(self.threshold), dtype=torch.float64))
        return torch.where(x >= self.threshold, (255 if x.dtype == torch.uint8 else 1.0) - x, x)


@dataclass(frozen=True)
class RandomPosterize(_Sometimes):
    """uint8: the top ``bits`` of each level; a float image as v2 posterizes it (the image's dtype throughout):
    ``floor(x * 2**bits)`` clamped to ``[0, 2**bits - 1]``, divided by ``2**bits``."""

    bits: int
    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype.is_floating_point:
            levels = 1 << self.bits
            return x.mul(levels).floor_().clamp_(0, levels - 1).mul_(1.0 / levels)
        _uint8_only(x, "RandomPosterize")
        return posterize(x, torch.full((x.shape[0],), self.bits, device=x.device))


@dataclass(frozen=True)
class RandomAutocontrast(_Sometimes):
    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        return autocontrast(x)


@dataclass(frozen=True)
class RandomEqualize(_Sometimes):
    """Per-channel histogram equalisation of uint8 levels; a float image as v2 equalizes it: to uint8 by
    ``to_dtype`` (``x * 255.999`` in the image's dtype, cast), equalized, back by ``* (1/255)``."""

    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        if not x.dtype.is_floating_point:
            _uint8_only(x, "RandomEqualize")
            return equalize(x)
        # The cast of a value outside 0-255 (an image after Normalize) is what the CPU does, where torchvision runs:
        # truncate to an integer, keep the low 8 bits; through int32 the same holds on every device.
        levels = x.mul(255.0 + 1.0 - 1e-3).to(torch.int32).to(torch.uint8)
        return equalize(levels).to(x.dtype).mul_(1.0 / 255)


@dataclass(frozen=True)
class RandomInvert(_Sometimes):
    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        return (255 if x.dtype == torch.uint8 else 1.0) - x


@dataclass(frozen=True)
class RandomAdjustSharpness(_Sometimes):
    sharpness_factor: float
    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        factor = torch.full((x.shape[0],), float(self.sharpness_factor), dtype=torch.float64, device=x.device)
        colour, alpha = split_alpha(x, "RandomAdjustSharpness")  # LA, RGBA: as ImageEnhance, alpha kept
        return join_alpha(adjust_sharpness(colour, factor), alpha)


def grayscale(x: torch.Tensor, channels: int) -> torch.Tensor:
    """torchvision's tensor ``rgb_to_grayscale``: the weighted sum, truncated to the dtype; with 3 output channels
    it takes the input's channel count (a 1-channel image stays 1 channel, as torchvision's ``expand``). LA and
    RGBA (2, 4 channels), which only PIL's ``convert`` takes: the gray of the colour channels, alpha dropped."""
    colour, alpha = split_alpha(x, "Grayscale")
    out = gray(colour) if colour.shape[1] == 3 else colour.clone()
    wide = channels if alpha is not None else x.shape[1]  # PIL: "L" or "RGB", whatever came in
    return out.expand(-1, wide, -1, -1).contiguous() if channels == 3 else out


@dataclass(frozen=True)
class RandomGrayscale(_Sometimes):
    """As many output channels as the image has, as torchvision's; which refuses 2 and 4 (LA, RGBA), as here."""

    p: float = 0.1

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        if x.shape[1] in ALPHA_CHANNELS:  # before the coin: never only on an unlucky draw
            raise ConfigError(
                f"RandomGrayscale on {x.shape[1]}-channel images: torchvision refuses it ('num_output_channels "
                "should be either 1 or 3'); convert the images to RGB or L first (image.convert('RGB'))"
            )
        return super().apply(x, params)

    def op(self, x: torch.Tensor) -> torch.Tensor:
        return grayscale(x, x.shape[1])


@dataclass(frozen=True)
class Grayscale(BatchTransform):
    num_output_channels: int = 1
    random = False

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return grayscale(x, self.num_output_channels)


def _pair(value: Any, name: str, positive: bool = True) -> tuple[float, float]:
    check_finite(value, name, "GaussianBlur")
    pair = (float(value), float(value)) if isinstance(value, (int, float)) else tuple(float(v) for v in value)
    if len(pair) != 2 or pair[0] > pair[1] or (positive and pair[0] <= 0):
        raise ConfigError(f"{name}={value!r} must be a positive number or a (min, max) pair")
    return pair


@dataclass(frozen=True)
class GaussianBlur(BatchTransform):
    """torchvision's ``GaussianBlur``: a sigma per sample, uniform in ``sigma``; reflect padding."""

    kernel_size: int | tuple[int, int] = 3
    sigma: float | tuple[float, float] = (0.1, 2.0)

    def __post_init__(self) -> None:
        ks = (self.kernel_size, self.kernel_size) if isinstance(self.kernel_size, int) else tuple(self.kernel_size)
        if len(ks) != 2 or any(k <= 0 or k % 2 == 0 for k in ks):
            raise ConfigError(f"kernel_size={self.kernel_size!r} must be odd and positive")
        object.__setattr__(self, "kernel_size", ks)
        object.__setattr__(self, "sigma", _pair(self.sigma, "sigma"))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        lo, hi = self.sigma  # type: ignore[misc]
        return {"sigma": uniform(x.shape[0], lo, hi, x, generator)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return gaussian_blur(x, self.kernel_size, params["sigma"])  # type: ignore[arg-type]


def _kernel1d(size: int, sigma: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    half = (size - 1) * 0.5
    grid = torch.linspace(-half, half, steps=size, dtype=dtype, device=sigma.device)
    sigma = sigma.to(dtype)
    pdf = torch.exp(-0.5 * (grid.view(1, -1) / sigma.view(-1, 1)).pow(2))
    return pdf / pdf.sum(1, keepdim=True)


def gaussian_blur(x: torch.Tensor, kernel_size: tuple[int, int], sigma: torch.Tensor) -> torch.Tensor:
    """Each image blurred with its own sigma (float32), as torchvision's tensor ``gaussian_blur``."""
    n, c, h, w = x.shape
    if n == 0:
        return x.clone()
    work = x.dtype if x.dtype.is_floating_point else torch.float32  # torchvision's: the image's float dtype
    kx, ky = _kernel1d(kernel_size[0], sigma, work), _kernel1d(kernel_size[1], sigma, work)
    kernel = torch.bmm(ky.unsqueeze(2), kx.unsqueeze(1))  # (N, ky, kx): torch.mm(k_y[:, None], k_x[None, :])
    weight = kernel.repeat_interleave(c, 0).unsqueeze(1)  # (N*C, 1, ky, kx)
    img = x.to(work)
    pad = [kernel_size[0] // 2, kernel_size[0] // 2, kernel_size[1] // 2, kernel_size[1] // 2]
    img = nnf.pad(img, pad, mode="reflect")
    out = nnf.conv2d(img.reshape(1, n * c, *img.shape[2:]), weight, groups=n * c).view(n, c, h, w)
    return out if x.dtype.is_floating_point else out.round_().to(x.dtype)
