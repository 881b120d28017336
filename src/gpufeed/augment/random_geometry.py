"""torchvision's per-image random geometric ops, batched: ``RandomRotation`` and ``RandomAffine`` (a matrix per
sample, nearest or bilinear) and ``RandomPerspective`` (eight coefficients per sample).

Given the same draws, each equals torchvision's tensor kernel (``transforms.functional``: the same inverse matrix,
grid and fill mask, :mod:`.affine`); with ``pil=True`` the rotation and the affine map compute what Pillow computes
on PIL images (:mod:`gpufeed.augment.pil`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .affine import affine_sample, inverse_affine, inverse_affine_v1, inverse_affine_v2, sample_grid
from .params import Draws, apply_on, check_finite, check_p, coin, fill_tuple, randint, uniform
from .transforms import BatchTransform, Params

__all__ = ["RandomAffine", "RandomPerspective", "RandomRotation"]


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
        check_finite(d, "degrees", "RandomRotation")
        pair = (-float(d), float(d)) if isinstance(d, (int, float)) else tuple(float(v) for v in d)
        if len(pair) != 2 or pair[0] > pair[1]:
            raise ConfigError(f"degrees={d!r} must be a number >= 0 or a (min, max) pair")
        object.__setattr__(self, "degrees", pair)
        object.__setattr__(self, "interpolation", _mode(self.interpolation))
        object.__setattr__(self, "fill", fill_tuple(self.fill))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        lo, hi = self.degrees  # type: ignore[misc]
        return {"angle": uniform(x.shape[0], lo, hi, x, generator)}

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
        for name in ("degrees", "scale", "shear"):
            if getattr(self, name) is not None:
                check_finite(getattr(self, name), name, "RandomAffine")
        degrees = (-float(d), float(d)) if isinstance(d, (int, float)) else tuple(float(v) for v in d)
        if len(degrees) != 2 or degrees[0] > degrees[1]:
            raise ConfigError(f"RandomAffine: degrees={d!r} must be a number >= 0 or a (min, max) pair")
        object.__setattr__(self, "degrees", degrees)
        # torchvision's own checks (ValueError when the op is made): translate in [0, 1], scale > 0
        if self.translate is not None and (
            len(self.translate) != 2 or not all(0 <= t <= 1 for t in self.translate)
        ):  # NaN
            raise ConfigError(
                f"RandomAffine: translate={self.translate!r} must be a (max_dx, max_dy) pair of fractions of the "
                "width and height in [0, 1], as torchvision requires"
            )
        if self.scale is not None and (len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]):
            raise ConfigError(
                f"RandomAffine: scale={self.scale!r} must be a (min, max) pair with 0 < min <= max, as torchvision "
                "requires"
            )
        s = self.shear
        if s is not None:
            s = (-float(s), float(s)) if isinstance(s, (int, float)) else tuple(float(v) for v in s)
            if len(s) not in (2, 4):
                raise ConfigError(f"shear={self.shear!r} must be a number or 2 or 4 values")
        object.__setattr__(self, "shear", s)
        object.__setattr__(self, "interpolation", _mode(self.interpolation))
        object.__setattr__(self, "fill", fill_tuple(self.fill))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        n, (h, w) = x.shape[0], x.shape[2:]
        lo, hi = self.degrees  # type: ignore[misc]
        angle = uniform(n, lo, hi, x, generator)
        zero = torch.zeros(n, device=x.device)
        tx = ty = zero
        if self.translate is not None:
            max_dx, max_dy = float(self.translate[0] * w), float(self.translate[1] * h)
            tx = torch.round(uniform(n, -max_dx, max_dx, x, generator))  # int(round(...)): half to even
            ty = torch.round(uniform(n, -max_dy, max_dy, x, generator))
        scale = uniform(n, self.scale[0], self.scale[1], x, generator) if self.scale is not None else zero + 1.0
        sx = sy = zero
        shear = self.shear
        if shear is not None:
            sx = uniform(n, shear[0], shear[1], x, generator)  # type: ignore[index]
            if len(shear) == 4:  # type: ignore[arg-type]
                sy = uniform(n, shear[2], shear[3], x, generator)  # type: ignore[index]
        return {"angle": angle, "tx": tx, "ty": ty, "scale": scale, "sx": sx, "sy": sy}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        if self.pil:  # F.affine on a PIL image: the inverse matrix about the absolute centre, to Image.transform
            from . import pil

            h, w = x.shape[2:]
            cx, cy = self.center if self.center is not None else (w * 0.5, h * 0.5)
            keys = ("angle", "tx", "ty", "scale", "sx", "sy")
            host = torch.stack([params[k].double() for k in keys]).tolist()  # one host read
            matrix = inverse_affine_v2 if self.v2 else inverse_affine_v1
            matrices = [matrix(a, dx, dy, z, hx, hy, cx, cy) for a, dx, dy, z, hx, hy in zip(*host, strict=True)]
            return pil.affine(x, matrices, self.interpolation, pil.parse_fill(self.fill, x.shape[1]))
        p = {k: v.double() for k, v in params.items()}
        cx, cy = _centre(self.center, x)
        zeros = torch.zeros_like(p["angle"])
        m = inverse_affine(p["angle"], p["tx"], p["ty"], p["scale"], p["sx"], p["sy"], zeros + cx, zeros + cy)
        return affine_sample(x, m, self.fill, self.interpolation)  # type: ignore[arg-type]


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
        object.__setattr__(self, "p", check_p(self.p, "RandomPerspective"))
        object.__setattr__(self, "interpolation", _mode(self.interpolation))
        object.__setattr__(self, "fill", fill_tuple(self.fill))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        n, (h, w) = x.shape[0], x.shape[2:]
        bw, bh = int(self.distortion_scale * (w // 2)) + 1, int(self.distortion_scale * (h // 2)) + 1

        def draw(low: int, high: int) -> torch.Tensor:
            return randint(generator, low, high, (n,), x.device)

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
        return {"apply": coin(x, self.p, generator), "ends": ends}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        def warp(part: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            coeffs = _perspective_coeffs(params["ends"][idx], part.shape[3], part.shape[2])
            return _perspective(part, coeffs, self.fill, self.interpolation)  # type: ignore[arg-type]

        return apply_on(x, params["apply"], warp)


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
