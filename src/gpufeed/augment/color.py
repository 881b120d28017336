"""ColorJitter, batched: per-sample brightness, contrast, saturation and hue factors and order.

The pixel arithmetic follows torchvision's tensor kernels (``transforms.functional``) op for op --
the same blend formula, the same truncating grayscale, the same HSV round trip -- with a factor
per sample instead of one per call. torchvision applies the four adjustments in a random order
per image; here, in each of the four slots, each enabled adjustment runs on the samples whose order
puts it there (on the CPU), or on the whole batch with the result kept by mask (on a GPU: no host
sync); no per-sample Python either way. A uint8 RGB batch takes the same arithmetic compiled into two passes
(:mod:`.jitter`) where a compiler runs (NOTE [ Compiled ops ] in :mod:`.fusion`).

A batch of 2 or 4 channels is an LA or RGBA image, taken as torchvision's PIL kernels take it (the only place
torchvision jitters one: its tensor kernels refuse it): the colour channels jittered, alpha kept, or made opaque
when hue is jittered (PIL's HSV round trip has no alpha). See :mod:`.channels`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from ..threads import torch_threads
from . import jitter as fused
from .channels import join_alpha, opaque, split_alpha
from .fusion import NotCompiled
from .hsv import shift_hue, to_hsv, to_rgb
from .params import Draws, check_finite, permutation, rand
from .paths import host_path
from .transforms import BatchTransform, Params

__all__ = ["ColorJitter", "adjust_brightness", "adjust_contrast", "adjust_hue", "adjust_saturation", "blend", "gray"]

Factor = torch.Tensor  # (N,) per-sample factors


def _col(f: Factor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ratio`` and ``1 - ratio`` as torchvision computes them: ``1 - ratio`` in double, then cast."""
    work = torch.float64 if like.dtype == torch.float64 else torch.float32
    ratio = f.view(-1, 1, 1, 1)
    return ratio.to(work), (1.0 - ratio.to(torch.float64)).to(work)


def _times(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``factor * x`` in ``factor``'s dtype, in a new tensor. A uint8 operand in a float product takes TensorIterator's
    casting loop, two to three times slower than converting first and multiplying in place (the same rounding)."""
    return x * factor if x.dtype == factor.dtype else x.to(factor.dtype).mul_(factor)


def blend(img1: torch.Tensor, img2: torch.Tensor, f: Factor) -> torch.Tensor:
    """torchvision's ``_blend`` with a ratio per sample: ``f * img1 + (1 - f) * img2``, clamped, in ``img1``'s dtype."""
    ratio, rest = _col(f, img1)
    bound = 255 if img1.dtype == torch.uint8 else 1.0
    # torchvision's products and sum, each rounded to the working dtype as there, updated in place (see _times)
    out, other = _times(img1, ratio), _times(img2, rest)
    out = out.add_(other) if torch.broadcast_shapes(out.shape, other.shape) == out.shape else out + other
    return out.clamp_(0, bound).to(img1.dtype)


def gray(x: torch.Tensor) -> torch.Tensor:
    """torchvision's tensor ``rgb_to_grayscale`` (one channel, truncated to the dtype); 1 channel stays."""
    if x.shape[1] == 1:
        return x
    if x.shape[1] != 3:  # an alpha channel is the caller's to split off (.channels.split_alpha)
        raise ConfigError(f"grayscale takes images of 1 or 3 channels (as torchvision's); this batch has {x.shape[1]}")
    r, g, b = x.unbind(dim=1)
    return (0.2989 * r + 0.587 * g + 0.114 * b).to(x.dtype).unsqueeze(1)


def adjust_brightness(x: torch.Tensor, f: Factor) -> torch.Tensor:
    # torchvision blends with a black image: ratio * x + (1 - ratio) * 0, which is ratio * x exactly
    ratio, _ = _col(f, x)
    bound = 255 if x.dtype == torch.uint8 else 1.0
    return _times(x, ratio).clamp_(0, bound).to(x.dtype)


def adjust_contrast(x: torch.Tensor, f: Factor) -> torch.Tensor:
    work = x.dtype if x.dtype.is_floating_point else torch.float32
    return blend(x, _mean(gray(x).to(work)), f)


def _mean(g: torch.Tensor) -> torch.Tensor:
    """Each sample's mean over its ``(C, H, W)``, the same bits at any thread count. Torch splits a reduction between
    its threads by outputs (samples) when it has several, but within the sample when it has one, and the float sum's
    order then follows the count: a 400x400 image's mean gray read 226.98492 on one thread and 226.98495 on two, and
    8,582 of its pixels came out a level apart. So one sample's mean runs on one thread: the host path hands an
    adjustment the samples its slot picks, one as often as not, under the count gpufeed's ThreadChoice picks by the
    machine's load (NOTE [ Torch's threads on a busy machine ] in gpufeed.threads)."""
    alone = g.shape[0] == 1 and g.device.type == "cpu"
    with torch_threads(1) if alone else contextlib.nullcontext():
        return torch.mean(g, dim=(-3, -2, -1), keepdim=True)


def adjust_saturation(x: torch.Tensor, f: Factor) -> torch.Tensor:
    return x if x.shape[1] == 1 else blend(x, gray(x), f)


def _rgb2hsv(img: torch.Tensor) -> torch.Tensor:
    return torch.stack(to_hsv(*img.unbind(dim=-3)), dim=-3)


def _hsv2rgb(img: torch.Tensor) -> torch.Tensor:
    return torch.stack(to_rgb(*img.unbind(dim=-3)), dim=-3)


def adjust_hue(x: torch.Tensor, f: Factor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    from .functional import convert_dtype

    hsv = _rgb2hsv(convert_dtype(x, torch.float32) if x.dtype == torch.uint8 else x)
    h, s, v = hsv.unbind(dim=-3)
    h = shift_hue(h, f.view(-1, 1, 1).to(h.dtype))
    return convert_dtype(_hsv2rgb(torch.stack((h, s, v), dim=-3)), x.dtype)


def _range(
    value: float | Sequence[float] | None, name: str, centre: float, low: float, high: float
) -> tuple[float, ...] | None:
    if value is None:
        return None
    check_finite(value, name, "ColorJitter")
    lo_hi: tuple[float, ...]
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")
        lo_hi = (max(low, centre - value), centre + value) if centre else (-value, value)
    else:
        lo_hi = tuple(float(v) for v in value)
    if len(lo_hi) != 2 or not (low <= lo_hi[0] <= lo_hi[1] <= high):
        raise ConfigError(f"{name}={value!r} must give a range within [{low}, {high}]")
    return None if lo_hi[0] == lo_hi[1] == centre else lo_hi


_ADJUST: tuple[Callable[[torch.Tensor, Factor], torch.Tensor], ...] = (
    adjust_brightness,
    adjust_contrast,
    adjust_saturation,
    adjust_hue,
)


@dataclass(frozen=True)
class ColorJitter(BatchTransform):
    """torchvision's ``ColorJitter`` with factors and order drawn per sample.

    Arguments as torchvision: a number ``v`` means ``[max(0, 1 - v), 1 + v]`` (hue: ``[-v, v]``,
    ``v <= 0.5``), or give ``(min, max)``.
    """

    brightness: float | Sequence[float] | None = None
    contrast: float | Sequence[float] | None = None
    saturation: float | Sequence[float] | None = None
    hue: float | Sequence[float] | None = None

    def __post_init__(self) -> None:
        inf = float("inf")
        object.__setattr__(self, "brightness", _range(self.brightness, "brightness", 1.0, 0.0, inf))
        object.__setattr__(self, "contrast", _range(self.contrast, "contrast", 1.0, 0.0, inf))
        object.__setattr__(self, "saturation", _range(self.saturation, "saturation", 1.0, 0.0, inf))
        object.__setattr__(self, "hue", _range(self.hue, "hue", 0.0, -0.5, 0.5))

    def _ranges(self) -> tuple:
        return (self.brightness, self.contrast, self.saturation, self.hue)

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        n = x.shape[0]
        order = permutation(generator, n, 4, x.device)  # a uniform permutation
        factors = []
        for r in self._ranges():
            u = rand(generator, (n,), x.device)
            factors.append(None if r is None else r[0] + (r[1] - r[0]) * u)
        return {"order": order, "factors": factors}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        colour, alpha = split_alpha(x, "ColorJitter")
        out = self._jitter(colour, params["order"], params["factors"])
        if alpha is not None and params["factors"][3] is not None:  # PIL's hue: through HSV, which has no alpha
            alpha = opaque(alpha)
        return join_alpha(out, alpha)

    def _jitter(self, x: torch.Tensor, order: torch.Tensor, factors: list[Any]) -> torch.Tensor:
        if x.dtype == torch.uint8 and x.shape[1] == 3:  # compiled: two passes (.jitter), the pixels below
            try:
                return fused.jitter(x, order, factors)
            except NotCompiled:
                pass
        enabled = [j for j, f in enumerate(factors) if f is not None]
        if len(enabled) == 1:  # the order does not matter
            return _ADJUST[enabled[0]](x, factors[enabled[0]])
        if host_path(x):  # each adjustment on the samples whose order puts it in this slot: 4x less work
            x = x.clone()  # the caller's batch is not written to
            for slot in range(4):
                for j in enabled:
                    idx = (order[:, slot] == j).nonzero().flatten()
                    if idx.numel():
                        x[idx] = _ADJUST[j](x[idx], factors[j][idx])
            return x
        for slot in range(4):  # on a GPU: every adjustment for the whole batch, kept by mask (no host sync)
            which = order[:, slot].view(-1, 1, 1, 1)
            out = x
            for j in enabled:
                out = torch.where(which == j, _ADJUST[j](x, factors[j]), out)
            x = out
        return x
