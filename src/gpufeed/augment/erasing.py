"""Erasing ops: one box per sample filled with a value (torchvision's ``RandomErasing``, and ``Cutout``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from . import functional as F
from .params import Draws, check_finite, check_probability, rand, randint, randn
from .transforms import BatchTransform, Params

__all__ = ["Cutout", "RandomErasing"]


def _erase_value(value: float | Sequence[float] | str, x: torch.Tensor, generator: Draws) -> torch.Tensor:
    if isinstance(value, str):  # "random": independent N(0, 1) per erased pixel, as torchvision
        if x.dtype == torch.uint8:
            raise ConfigError("value='random' draws N(0, 1) values and needs float input; erase after Normalize")
        return randn(generator, x.shape, x.device, x.dtype)
    return F.constant(value, x, "value")


@dataclass(frozen=True)
class RandomErasing(BatchTransform):
    """Erase one random box per sample with probability ``p`` (torchvision's ``RandomErasing``).

    Per sample, up to 10 (area, aspect ratio) draws; the first whose box fits is used, and if
    none fits the sample is left unchanged, exactly the distribution of torchvision's loop.
    ``value`` is in the input's value space: a number, one per channel, or ``"random"``.
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | Sequence[float] | str = 0
    attempts: int = field(default=10, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_probability(self.p))
        check_finite(self.scale, "scale", "RandomErasing")
        check_finite(self.ratio, "ratio", "RandomErasing")
        if not (0 < self.scale[0] <= self.scale[1]):
            raise ConfigError(f"scale={self.scale!r} must satisfy 0 < min <= max")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigError(f"ratio={self.ratio!r} must satisfy 0 < min <= max")
        if isinstance(self.value, str) and self.value != "random":
            raise ConfigError(f"value={self.value!r} must be a number, a sequence of numbers or 'random'")

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        n, _, img_h, img_w = x.shape
        dev, k = x.device, self.attempts
        # float64 like torchvision's Python floats, so round() sees the same values.
        u = rand(generator, (4, n, k), dev, torch.float64, axis=1)
        area = img_h * img_w * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[0])
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lo + (hi - lo) * u[1])
        h = torch.round(torch.sqrt(area * aspect)).long()
        w = torch.round(torch.sqrt(area / aspect)).long()
        fits = (h < img_h) & (w < img_w)
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # first attempt that fits
        h, w = h.gather(1, first).squeeze(1), w.gather(1, first).squeeze(1)
        top = (u[2, :, 0] * (img_h - h + 1)).floor().long()
        left = (u[3, :, 0] * (img_w - w + 1)).floor().long()
        coin = rand(generator, (n,), dev) < self.p
        value = _erase_value(self.value, x, generator)
        return {"mask": coin & fits.any(dim=1), "top": top, "left": left, "height": h, "width": w, "value": value}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        p = params
        return F.erase(x, p["mask"], p["top"], p["left"], p["height"], p["width"], p["value"])


@dataclass(frozen=True)
class Cutout(BatchTransform):
    """Fill a ``size`` x ``size`` square centred uniformly in the image, clipped at the border.

    The centre is uniform over all pixels (DeVries & Taylor, 2017), so boxes near the edge are
    partly outside; ``p`` is the per-sample probability of applying it.
    """

    size: int
    fill: float | Sequence[float] = 0
    p: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ConfigError(f"size={self.size!r} must be an int >= 1")
        if isinstance(self.fill, str):
            raise ConfigError(f"fill={self.fill!r} must be a number or one number per channel")
        object.__setattr__(self, "p", check_probability(self.p))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        n, _, h, w = x.shape
        cy = randint(generator, 0, h, (n,), x.device)
        cx = randint(generator, 0, w, (n,), x.device)
        coin = rand(generator, (n,), x.device) < self.p
        return {"mask": coin, "top": cy - self.size // 2, "left": cx - self.size // 2}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        side = torch.full_like(params["top"], self.size)
        value = F.constant(self.fill, x, "fill")
        return F.erase(x, params["mask"], params["top"], params["left"], side, side, value)
