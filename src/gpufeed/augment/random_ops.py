"""torchvision's per-image random ops, batched: a coin (or a draw) per sample, the op once on the samples it picks.

``RandomSolarize``, ``RandomPosterize``, ``RandomAutocontrast``, ``RandomEqualize``,
``RandomAdjustSharpness``, ``RandomInvert``, ``RandomGrayscale`` and ``Grayscale``, ``GaussianBlur``
(a sigma per sample), ``RandomRotation`` and ``RandomAffine`` (a matrix per sample, nearest or
bilinear), and the containers ``RandomApply``, ``RandomChoice`` and ``RandomOrder``, decided per
sample as torchvision decides per call. Given the same draws, each equals torchvision's tensor kernel
(``transforms.functional``); the containers' inner ops draw from a seed recorded in the parameters,
so ``apply`` stays a pure function of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as nnf

from ..errors import ConfigError, DataError
from .auto import (
    _autocontrast,
    _equalize,
    _fill,
    _inverse_affine,
    _posterize,
    _sharpness,
    affine_sample,
    inverse_affine,
    inverse_affine_v2,
    sample_grid,
)
from .color import _gray
from .transforms import BatchTransform, Params

__all__ = [
    "GaussianBlur",
    "Grayscale",
    "Identity",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomEqualize",
    "RandomGrayscale",
    "RandomInvert",
    "RandomOrder",
    "RandomPerspective",
    "RandomPosterize",
    "RandomRotation",
    "RandomSolarize",
]


def _coin(x: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Per sample, whether the op applies: torchvision's ``torch.rand(1) < p``."""
    return torch.rand(x.shape[0], generator=generator, device=x.device) < p


def _on(x: torch.Tensor, mask: torch.Tensor, op: Any) -> torch.Tensor:
    """``op`` applied to the samples ``mask`` picks, the others as they are."""
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        return x
    out = x.clone()
    out[idx] = op(x[idx], idx)
    return out


def _check_p(p: float, name: str) -> float:
    if not 0.0 <= float(p) <= 1.0:
        raise ConfigError(f"{name}: p={p} must be in [0, 1]")
    return float(p)


@dataclass(frozen=True)
class _Sometimes(BatchTransform):
    """An op with fixed arguments applied with probability ``p`` per sample; subclasses declare their
    arguments in torchvision's order (the op's own first, then ``p``: a field here would come first)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", _check_p(getattr(self, "p"), type(self).__name__))  # noqa: B009

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        return {"apply": _coin(x, getattr(self, "p"), generator)}  # noqa: B009

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return _on(x, params["apply"], lambda part, idx: self.op(part))

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
        return _posterize(x, torch.full((x.shape[0],), self.bits, device=x.device))


@dataclass(frozen=True)
class RandomAutocontrast(_Sometimes):
    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        return _autocontrast(x)


@dataclass(frozen=True)
class RandomEqualize(_Sometimes):
    """Per-channel histogram equalisation of uint8 levels; a float image as v2 equalizes it: to uint8 by
    ``to_dtype`` (``x * 255.999`` in the image's dtype, cast), equalized, back by ``* (1/255)``."""

    p: float = 0.5

    def op(self, x: torch.Tensor) -> torch.Tensor:
        if not x.dtype.is_floating_point:
            _uint8_only(x, "RandomEqualize")
            return _equalize(x)
        # The cast of a value outside 0-255 (an image after Normalize) is what the CPU does, where torchvision runs:
        # truncate to an integer, keep the low 8 bits; through int32 the same holds on every device.
        levels = x.mul(255.0 + 1.0 - 1e-3).to(torch.int32).to(torch.uint8)
        return _equalize(levels).to(x.dtype).mul_(1.0 / 255)


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
        return _sharpness(x, factor)


def grayscale(x: torch.Tensor, channels: int) -> torch.Tensor:
    """torchvision's tensor ``rgb_to_grayscale``: the weighted sum, truncated to the dtype; with 3 output channels
    it takes the input's channel count (a 1-channel image stays 1 channel, as torchvision's ``expand``)."""
    gray = _gray(x) if x.shape[1] == 3 else x.clone()
    return gray.expand(-1, x.shape[1], -1, -1).contiguous() if channels == 3 else gray


@dataclass(frozen=True)
class RandomGrayscale(_Sometimes):
    p: float = 0.1

    def op(self, x: torch.Tensor) -> torch.Tensor:
        return grayscale(x, x.shape[1])


@dataclass(frozen=True)
class Grayscale(BatchTransform):
    num_output_channels: int = 1
    random = False

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return grayscale(x, self.num_output_channels)


def _pair(value: Any, name: str, positive: bool = True) -> tuple[float, float]:
    pair = (float(value), float(value)) if isinstance(value, (int, float)) else tuple(float(v) for v in value)
    if len(pair) != 2 or pair[0] > pair[1] or (positive and pair[0] <= 0):
        raise ConfigError(f"{name}={value!r} must be a positive number or a (min, max) pair")
    return pair


def _uniform(n: int, low: float, high: float, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``torch.empty(1).uniform_(low, high)`` per sample: float32 draws, as torchvision's."""
    return torch.empty(n, device=x.device).uniform_(low, high, generator=generator)


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

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        lo, hi = self.sigma  # type: ignore[misc]
        return {"sigma": _uniform(x.shape[0], lo, hi, x, generator)}

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


def _mode(interpolation: str) -> str:
    if interpolation not in ("nearest", "bilinear"):
        raise ConfigError(f"interpolation={interpolation!r}: gpufeed batches 'nearest' and 'bilinear'")
    return interpolation


def _centre(center: Sequence[float] | None, x: torch.Tensor) -> tuple[float, float]:
    """torchvision's ``center_f``: the centre relative to the image centre ((0, 0) when not given)."""
    if center is None:
        return 0.0, 0.0
    return 1.0 * (center[0] - x.shape[3] * 0.5), 1.0 * (center[1] - x.shape[2] * 0.5)


@dataclass(frozen=True)
class RandomRotation(BatchTransform):
    """torchvision's ``RandomRotation`` (``expand=False``): an angle per sample, uniform in ``degrees``."""

    degrees: float | tuple[float, float] = 0.0
    interpolation: str = "nearest"
    center: tuple[float, float] | None = None
    fill: float | tuple[float, ...] | None = 0.0
    pil: bool = False  # what torchvision computes on PIL images (Pillow's kernels, gpufeed.augment.pil)

    def __post_init__(self) -> None:
        d = self.degrees
        pair = (-float(d), float(d)) if isinstance(d, (int, float)) else tuple(float(v) for v in d)
        if len(pair) != 2 or pair[0] > pair[1]:
            raise ConfigError(f"degrees={d!r} must be a number >= 0 or a (min, max) pair")
        object.__setattr__(self, "degrees", pair)
        object.__setattr__(self, "interpolation", _mode(self.interpolation))
        object.__setattr__(self, "fill", _fill(self.fill))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        lo, hi = self.degrees  # type: ignore[misc]
        return {"angle": _uniform(x.shape[0], lo, hi, x, generator)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        if self.pil:  # F.rotate on a PIL image: Image.rotate about the given centre
            from . import pil

            return pil.rotate(
                x,
                params["angle"].double().tolist(),
                self.interpolation,
                pil.parse_fill(self.fill, x.shape[1]),
                self.center,
            )
        angle = params["angle"].double()
        zeros, ones = torch.zeros_like(angle), torch.ones_like(angle)
        cx, cy = _centre(self.center, x)
        m = inverse_affine(-angle, zeros, zeros, ones, zeros, zeros, zeros + cx, zeros + cy)  # F.rotate: -angle
        return affine_sample(x, m, self.fill, self.interpolation)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RandomAffine(BatchTransform):
    """torchvision's ``RandomAffine``: angle, translation (rounded to whole pixels), scale and shear per sample."""

    degrees: float | tuple[float, float] = 0.0
    translate: tuple[float, float] | None = None
    scale: tuple[float, float] | None = None
    shear: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    fill: float | tuple[float, ...] | None = 0.0
    center: tuple[float, float] | None = None
    pil: bool = False  # what torchvision computes on PIL images (Pillow's kernels, gpufeed.augment.pil)
    v2: bool = False  # on PIL images, v2's order of the matrix arithmetic

    def __post_init__(self) -> None:
        d = self.degrees
        object.__setattr__(
            self, "degrees", (-float(d), float(d)) if isinstance(d, (int, float)) else tuple(float(v) for v in d)
        )
        s = self.shear
        if s is not None:
            s = (-float(s), float(s)) if isinstance(s, (int, float)) else tuple(float(v) for v in s)
            if len(s) not in (2, 4):
                raise ConfigError(f"shear={self.shear!r} must be a number or 2 or 4 values")
        object.__setattr__(self, "shear", s)
        object.__setattr__(self, "interpolation", _mode(self.interpolation))
        object.__setattr__(self, "fill", _fill(self.fill))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        n, (h, w) = x.shape[0], x.shape[2:]
        lo, hi = self.degrees  # type: ignore[misc]
        angle = _uniform(n, lo, hi, x, generator)
        zero = torch.zeros(n, device=x.device)
        tx = ty = zero
        if self.translate is not None:
            max_dx, max_dy = float(self.translate[0] * w), float(self.translate[1] * h)
            tx = torch.round(_uniform(n, -max_dx, max_dx, x, generator))  # int(round(...)): half to even
            ty = torch.round(_uniform(n, -max_dy, max_dy, x, generator))
        scale = _uniform(n, self.scale[0], self.scale[1], x, generator) if self.scale is not None else zero + 1.0
        sx = sy = zero
        shear = self.shear
        if shear is not None:
            sx = _uniform(n, shear[0], shear[1], x, generator)  # type: ignore[index]
            if len(shear) == 4:  # type: ignore[arg-type]
                sy = _uniform(n, shear[2], shear[3], x, generator)  # type: ignore[index]
        return {"angle": angle, "tx": tx, "ty": ty, "scale": scale, "sx": sx, "sy": sy}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        if self.pil:  # F.affine on a PIL image: the inverse matrix about the absolute centre, to Image.transform
            from . import pil

            h, w = x.shape[2:]
            cx, cy = self.center if self.center is not None else (w * 0.5, h * 0.5)
            keys = ("angle", "tx", "ty", "scale", "sx", "sy")
            host = torch.stack([params[k].double() for k in keys]).tolist()  # one host read
            matrix = inverse_affine_v2 if self.v2 else _inverse_affine
            matrices = [matrix(a, dx, dy, z, hx, hy, cx, cy) for a, dx, dy, z, hx, hy in zip(*host, strict=True)]
            return pil.affine(x, matrices, self.interpolation, pil.parse_fill(self.fill, x.shape[1]))
        p = {k: v.double() for k, v in params.items()}
        cx, cy = _centre(self.center, x)
        zeros = torch.zeros_like(p["angle"])
        m = inverse_affine(p["angle"], p["tx"], p["ty"], p["scale"], p["sx"], p["sy"], zeros + cx, zeros + cy)
        return affine_sample(x, m, self.fill, self.interpolation)  # type: ignore[arg-type]


def _seed(generator: torch.Generator, x: torch.Tensor) -> int:
    """A seed for the inner ops, drawn from the loader's generator (one host read per batch)."""
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=x.device).item())


def _run(op: BatchTransform, x: torch.Tensor, seed: int, salt: int) -> torch.Tensor:
    g = torch.Generator(device=x.device).manual_seed(seed + salt)
    return op(x, generator=g)


def _same_size(ops: Sequence[BatchTransform], name: str) -> tuple[BatchTransform, ...]:
    """The ops; what they do to a size is checked where the size is known (the planner, and each run)."""
    return tuple(ops)


def _kept_size(out: torch.Tensor, part: torch.Tensor, name: str) -> torch.Tensor:
    if out.shape[1:] != part.shape[1:]:
        raise DataError(
            f"{name}: its ops turn {tuple(part.shape[1:])} images into {tuple(out.shape[1:])}, so the samples it "
            "picks and the others would differ in size"
        )
    return out


class Identity(BatchTransform):
    """Nothing: stands for an op that changes nothing on the device (a conversion the state already has)."""

    random = False

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return x

    def __repr__(self) -> str:
        return "Identity()"


@dataclass(frozen=True)
class RandomApply(BatchTransform):
    """torchvision's ``RandomApply``: per sample, with probability ``p``, all of ``transforms`` in order."""

    transforms: tuple[BatchTransform, ...] = ()
    p: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _same_size(self.transforms, "RandomApply"))
        object.__setattr__(self, "p", _check_p(self.p, "RandomApply"))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        return {"apply": _coin(x, self.p, generator), "seed": _seed(generator, x)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        def chain(part: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            out = part
            for k, op in enumerate(self.transforms):
                out = _run(op, out, params["seed"], k)
            return _kept_size(out, part, "RandomApply")

        return _on(x, params["apply"], chain)


@dataclass(frozen=True)
class RandomChoice(BatchTransform):
    """torchvision's ``RandomChoice``: per sample one of ``transforms`` (weighted by ``p``, uniform if None)."""

    transforms: tuple[BatchTransform, ...] = ()
    p: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _same_size(self.transforms, "RandomChoice"))
        if not self.transforms:
            raise ConfigError("RandomChoice needs at least one transform")
        if self.p is not None and (len(self.p) != len(self.transforms) or min(self.p) < 0 or sum(self.p) <= 0):
            raise ConfigError(f"RandomChoice: p={self.p!r} needs one weight >= 0 per transform")

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        weights = torch.tensor(self.p or [1.0] * len(self.transforms), dtype=torch.float64, device=x.device)
        if x.shape[0] == 0:
            return {"which": torch.zeros(0, dtype=torch.long, device=x.device), "seed": 0}
        which = torch.multinomial(weights, x.shape[0], replacement=True, generator=generator)
        return {"which": which, "seed": _seed(generator, x)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for k, op in enumerate(self.transforms):
            x = _on(
                x,
                params["which"] == k,
                lambda part, idx, op=op, k=k: _kept_size(_run(op, part, params["seed"], k), part, "RandomChoice"),
            )
        return x


@dataclass(frozen=True)
class RandomOrder(BatchTransform):
    """torchvision's ``RandomOrder``: all of ``transforms``, in an order drawn per sample."""

    transforms: tuple[BatchTransform, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _same_size(self.transforms, "RandomOrder"))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        k = len(self.transforms)
        order = torch.rand((x.shape[0], k), generator=generator, device=x.device).argsort(1)  # uniform permutations
        return {"order": order, "seed": _seed(generator, x)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        order = params["order"]
        for slot in range(order.shape[1]):
            for k, op in enumerate(self.transforms):
                salt = slot * len(self.transforms) + k
                x = _on(
                    x,
                    order[:, slot] == k,
                    lambda part, idx, op=op, s=salt: _kept_size(_run(op, part, params["seed"], s), part, "RandomOrder"),
                )
        return x


@dataclass(frozen=True)
class RandomPerspective(BatchTransform):
    """torchvision's ``RandomPerspective``: with probability ``p`` per sample, the corners moved inwards by up
    to ``distortion_scale`` of half the image (whole pixels, drawn as torchvision draws them)."""

    distortion_scale: float = 0.5
    p: float = 0.5
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] | None = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.distortion_scale <= 1.0:
            raise ConfigError(f"distortion_scale={self.distortion_scale} must be in [0, 1]")
        object.__setattr__(self, "p", _check_p(self.p, "RandomPerspective"))
        object.__setattr__(self, "interpolation", _mode(self.interpolation))
        object.__setattr__(self, "fill", _fill(self.fill))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        n, (h, w) = x.shape[0], x.shape[2:]
        bw, bh = int(self.distortion_scale * (w // 2)) + 1, int(self.distortion_scale * (h // 2)) + 1

        def draw(low: int, high: int) -> torch.Tensor:
            return torch.randint(low, high, (n,), generator=generator, device=x.device)

        # corners: top-left, top-right, bottom-right, bottom-left, each (x, y)
        ends = torch.stack(
            [
                torch.stack([draw(0, bw), draw(0, bh)], 1),
                torch.stack([draw(w - bw, w), draw(0, bh)], 1),
                torch.stack([draw(w - bw, w), draw(h - bh, h)], 1),
                torch.stack([draw(0, bw), draw(h - bh, h)], 1),
            ],
            1,
        )
        return {"apply": _coin(x, self.p, generator), "ends": ends}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        def warp(part: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            coeffs = _perspective_coeffs(params["ends"][idx], part.shape[3], part.shape[2])
            return _perspective(part, coeffs, self.fill, self.interpolation)  # type: ignore[arg-type]

        return _on(x, params["apply"], warp)


def _perspective_coeffs(ends: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """``(N, 8)`` float32: torchvision's ``_get_perspective_coeffs`` (a float64 least-squares solve) per sample."""
    n = ends.shape[0]
    start = torch.tensor([[0, 0], [width - 1, 0], [width - 1, height - 1], [0, height - 1]], dtype=torch.float64)
    start = start.to(ends.device)
    e = ends.to(torch.float64)
    a = torch.zeros(n, 8, 8, dtype=torch.float64, device=ends.device)
    for i in range(4):
        (ex, ey), (sx, sy) = e[:, i].unbind(1), start[i]
        a[:, 2 * i, 0], a[:, 2 * i, 1], a[:, 2 * i, 2] = ex, ey, 1
        a[:, 2 * i, 6], a[:, 2 * i, 7] = -sx * ex, -sx * ey
        a[:, 2 * i + 1, 3], a[:, 2 * i + 1, 4], a[:, 2 * i + 1, 5] = ex, ey, 1
        a[:, 2 * i + 1, 6], a[:, 2 * i + 1, 7] = -sy * ex, -sy * ey
    b = start.reshape(1, 8, 1).expand(n, 8, 1)
    return (
        torch.linalg.lstsq(a.cpu(), b.cpu().contiguous(), driver="gels")
        .solution[..., 0]
        .to(torch.float32)
        .to(ends.device)
    )


def _perspective(x: torch.Tensor, coeffs: torch.Tensor, fill: tuple[float, ...] | None, mode: str) -> torch.Tensor:
    """torchvision's tensor ``perspective``: its grid from the eight coefficients, then its fill mask."""
    n, c, h, w = x.shape
    dev = x.device
    work = x.dtype if x.dtype.is_floating_point else torch.float32  # torchvision's grid dtype
    coeffs = coeffs.to(work)
    one = torch.ones(n, device=dev, dtype=work)
    theta1 = torch.stack([coeffs[:, 0:3], coeffs[:, 3:6]], 1)  # (N, 2, 3)
    theta2 = torch.stack([torch.stack([coeffs[:, 6], coeffs[:, 7], one], 1)] * 2, 1)
    base = torch.empty(1, h, w, 3, dtype=work, device=dev)
    base[..., 0].copy_(torch.linspace(0.5, w * 1.0 + 0.5 - 1.0, steps=w, device=dev))
    base[..., 1].copy_(torch.linspace(0.5, h * 1.0 + 0.5 - 1.0, steps=h, device=dev).unsqueeze_(-1))
    base[..., 2].fill_(1)
    flat = base.view(1, h * w, 3).expand(n, h * w, 3)
    grid1 = flat.bmm(theta1.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=work, device=dev))
    grid2 = flat.bmm(theta2.transpose(1, 2))
    grid = (grid1 / grid2 - 1.0).view(n, h, w, 2)
    return sample_grid(x, grid, fill, mode)
