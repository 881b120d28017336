"""PIL's own kernels on uint8 batches, step for step, for pipelines that run on PIL images.

torchvision's tensor kernels compute other numbers than PIL for some ops (a blend rounds in another
order, a bilinear affine blends the border with the fill where PIL clamps to the edge, PIL's bicubic
is another cubic). A recipe written for PIL images (timm's auto-augment runs only on PIL images)
trains on what PIL computes, so these follow Pillow's C code (libImaging ``Geometry.c``,
``Blend.c``, ``Convert.c``, and ``ImageOps``/``ImageEnhance``) in the same arithmetic: the same
float32 or float64 operations in the same order, the same truncations. Outputs equal Pillow's on
x86-64 (tests/augment/test_pil.py); where Pillow is built to fuse multiply-adds (some ARM builds)
a coordinate can differ in its last bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import ConfigError

__all__ = [
    "affine",
    "autocontrast",
    "blend",
    "contrast_degenerate",
    "enhance",
    "gray",
    "parse_fill",
    "rotate",
    "rotate_matrix",
    "smooth",
    "solarize",
]

Matrix = Sequence[float]  # PIL's affine data (a, b, c, d, e, f): output (x, y) reads input (ax+by+c, dx+ey+f)


def rotate_matrix(degrees: float, width: int, height: int, center: Sequence[float] | None = None) -> tuple[float, ...]:
    """The affine data ``Image.rotate(degrees, center=center)`` passes to ``Image.transform`` (about the image
    centre when ``center`` is None)."""
    angle = -math.radians(degrees % 360.0)
    m = [
        round(math.cos(angle), 15),
        round(math.sin(angle), 15),
        0.0,
        round(-math.sin(angle), 15),
        round(math.cos(angle), 15),
        0.0,
    ]
    cx, cy = (width / 2.0, height / 2.0) if center is None else center
    m[2], m[5] = m[0] * -cx + m[1] * -cy + m[2], m[3] * -cx + m[4] * -cy + m[5]
    m[2] += cx
    m[5] += cy
    return tuple(m)


def parse_fill(fill: float | Sequence[float] | None, channels: int) -> list[int]:
    """``fillcolor`` as torchvision's ``_parse_fill`` makes it for a PIL image: integers, one per channel
    (None: 0; one value: repeated; another count: the ValueError torchvision raises), clipped to 0-255 as
    Pillow stores a colour."""
    values = [0.0] if fill is None else [float(fill)] if isinstance(fill, (int, float)) else list(fill)
    if len(values) not in (1, channels):
        raise ConfigError(
            f"fill={fill!r} has {len(values)} values for images of {channels} channels; torchvision raises "
            "ValueError on it: give one value or one per channel"
        )
    return [min(255, max(0, int(v))) for v in (values * channels if len(values) == 1 else values)]


def _gather(
    x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``x[i, :, rows[i], cols[i]]`` for ``(K, H, W)`` index maps, ``(K, C, H, W)`` as ``dtype``."""
    k, c, h, w = x.shape
    flat = (rows * w + cols).view(k, 1, -1).expand(k, c, -1)
    return x.reshape(k, c, h * w).gather(2, flat).view(k, c, *rows.shape[1:]).to(dtype)


def _nearest_maps(matrices: Sequence[Matrix], h: int, w: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Input row and column (``-1`` or past the edge: outside) for each output pixel, ``(K, H, W)`` (broadcast
    views where a map is separable), as Pillow's nearest paths find them: a pure translation/scale accumulates
    float64 offsets pixel after pixel (``ImagingScaleAffine``: a CPU ``cumsum`` over ``(K, W)`` and ``(K, H)``
    adds in the same order), anything else runs in 16.16 fixed point (``affine_fixed``: per-sample integers
    made on the CPU, the maps on ``dev``)."""
    a = torch.tensor(matrices, dtype=torch.float64).view(-1, 6)
    k = a.shape[0]
    scale = (a[:, 1] == 0) & (a[:, 3] == 0)
    if bool(scale.all()):
        xs = torch.cumsum(torch.cat([(a[:, 2] + a[:, 0] * 0.5).view(-1, 1), a[:, :1].expand(-1, w - 1)], 1), 1)
        ys = torch.cumsum(torch.cat([(a[:, 5] + a[:, 4] * 0.5).view(-1, 1), a[:, 4:5].expand(-1, h - 1)], 1), 1)
        coord = lambda v: torch.where(v < 0, -1, torch.trunc(v)).to(torch.int64).to(dev)  # noqa: E731  COORD
        return coord(ys).view(k, h, 1).expand(k, h, w), coord(xs).view(k, 1, w).expand(k, h, w)
    fix = lambda v: torch.floor(v * 65536.0 + 0.5).to(torch.int64).view(-1, 1, 1)  # noqa: E731  FIX()
    table = torch.cat(
        [
            fix(a[:, 2] + a[:, 0] * 0.5 + a[:, 1] * 0.5),
            fix(a[:, 5] + a[:, 3] * 0.5 + a[:, 4] * 0.5),
            *(fix(a[:, i]) for i in (0, 1, 3, 4)),
        ],
        1,
    ).to(dev)  # (K, 6, 1): x0, y0, a0, a1, a3, a4 in 16.16
    x0, y0, a0, a1, a3, a4 = table.unbind(1)
    xi, yi = torch.arange(w, device=dev).view(1, 1, w), torch.arange(h, device=dev).view(1, h, 1)
    cols = (x0.view(k, 1, 1) + yi * a1.view(k, 1, 1) + xi * a0.view(k, 1, 1)) >> 16
    rows = (y0.view(k, 1, 1) + yi * a4.view(k, 1, 1) + xi * a3.view(k, 1, 1)) >> 16
    if bool(scale.any()):  # a batch mixing both kinds: the scale-only samples as their own path finds them
        idx = scale.nonzero().view(-1)
        r, c = _nearest_maps([matrices[i] for i in idx.tolist()], h, w, dev)
        rows[idx.to(dev)], cols[idx.to(dev)] = r, c
    return rows, cols


def affine(x: torch.Tensor, matrices: Sequence[Matrix], mode: str, fill: Sequence[float]) -> torch.Tensor:
    """``Image.transform(size, AFFINE, matrices[i], resample=mode, fillcolor=fill)`` on each uint8 image ``x[i]``
    (``mode``: ``"nearest"``, ``"bilinear"`` or ``"bicubic"``). Pixels that read from outside the image take
    ``fill`` (one value per channel; missing channels 0, as Pillow pads a short colour); inside, bilinear and
    bicubic clamp their taps to the edge."""
    k, c, h, w = x.shape
    dev = x.device
    padded = list(fill)[:c] + [0] * (c - len(fill))  # Image.new(mode, size, (v,)) on RGB: (v, 0, 0)
    values = torch.tensor(padded, dtype=torch.float64, device=dev).view(1, c, 1, 1)
    if k == 0:
        return x.clone()
    if mode == "nearest":
        rows, cols = _nearest_maps(matrices, h, w, dev)
        inside = ((rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)).unsqueeze(1)
        got = _gather(x, rows.clamp(0, h - 1), cols.clamp(0, w - 1), torch.uint8)
        return torch.where(inside, got, values.to(torch.uint8))
    a = torch.tensor(matrices, dtype=torch.float64, device=dev).view(k, 6, 1, 1).unbind(1)
    xin = torch.arange(w, dtype=torch.float64, device=dev).view(1, 1, w) + 0.5
    yin = torch.arange(h, dtype=torch.float64, device=dev).view(1, h, 1) + 0.5
    xo = a[0] * xin + a[1] * yin + a[2]  # affine_transform(): a0 * xin + a1 * yin + a2
    yo = a[3] * xin + a[4] * yin + a[5]
    inside = ((xo >= 0) & (xo < w) & (yo >= 0) & (yo < h)).unsqueeze(1)
    xo, yo = xo - 0.5, yo - 0.5
    fx, fy = torch.floor(xo), torch.floor(yo)
    dx, dy = (xo - fx).unsqueeze(1), (yo - fy).unsqueeze(1)
    ix, iy = fx.long(), fy.long()
    if mode == "bilinear":
        c0, c1 = ix.clamp(0, w - 1), (ix + 1).clamp(0, w - 1)
        r0, r1 = iy.clamp(0, h - 1), (iy + 1).clamp(0, h - 1)
        lerp = lambda p, q, d: p + (q - p) * d  # noqa: E731  BILINEAR(v, a, b, d)
        top = lerp(_gather(x, r0, c0), _gather(x, r0, c1), dx)
        bottom = lerp(_gather(x, r1, c0), _gather(x, r1, c1), dx)
        out = torch.trunc(lerp(top, bottom, dy))
    elif mode == "bicubic":
        cs = [(ix - 1 + j).clamp(0, w - 1) for j in range(4)]
        lines = [_cubic([_gather(x, (iy - 1 + i).clamp(0, h - 1), col) for col in cs], dx) for i in range(4)]
        out = torch.trunc(_cubic(lines, dy).clamp(0, 255))
    else:
        raise ValueError(f"mode={mode!r} must be 'nearest', 'bilinear' or 'bicubic'")
    return torch.where(inside, out, values).to(torch.uint8)


def rotate(
    x: torch.Tensor, degrees: list[float], mode: str, fill: Sequence[float], center: Sequence[float] | None = None
) -> torch.Tensor:
    """``Image.rotate(degrees[i], resample=mode, center=center, fillcolor=fill)`` on each image: without a centre,
    a copy at 0 degrees, a flip at 180 and a transpose at 90 or 270 on square images (as Pillow shortcuts
    them), else :func:`affine`."""
    h, w = x.shape[2:]
    quarter = {0.0: 0, 90.0: 1, 180.0: 2, 270.0: 3}
    turns = [
        quarter.get(d % 360.0) if center is None and ((d % 360.0) in (0.0, 180.0) or h == w) else None for d in degrees
    ]
    out = torch.empty_like(x)
    rest = [i for i, t in enumerate(turns) if t is None]
    if rest:
        index = torch.tensor(rest, device=x.device)
        matrices = [rotate_matrix(degrees[i], w, h, center) for i in rest]
        out[index] = affine(x[index], matrices, mode, fill)
    for i, t in enumerate(turns):
        if t is not None:
            out[i] = torch.rot90(x[i], t, dims=(1, 2))
    return out


def _cubic(taps: Sequence[torch.Tensor], d: torch.Tensor) -> torch.Tensor:
    """Pillow's ``BICUBIC`` macro over four taps, in its order of operations."""
    v1, v2, v3, v4 = taps
    p1 = v2
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return p1 + d * (p2 + d * (p3 + d * p4))


def blend(degenerate: torch.Tensor | None, image: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``Image.blend(degenerate, image, alpha[i])`` per image (``ImageEnhance``'s ``enhance``): float32
    ``in1 + alpha * (in2 - in1)``, clipped and truncated. ``degenerate`` broadcasts against ``image`` (a grey
    ``(K, 1, H, W)``, a flat ``(K, 1, 1, 1)``) and is never expanded; None is black (Brightness)."""
    a = alpha.to(torch.float32).view(-1, 1, 1, 1)
    out = image.to(torch.float32)
    if degenerate is None:  # Brightness: 0 + a * (x - 0) is a * x exactly
        return out.mul_(a).clamp_(0, 255).trunc_().to(torch.uint8)
    d = degenerate.to(torch.float32)
    # (in2 - in1) is exact in float32 (levels), then the same two roundings as Pillow's a * diff + in1
    return out.sub_(d).mul_(a).add_(d).clamp_(0, 255).trunc_().to(torch.uint8)


def enhance(kind: str, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.<kind>(img).enhance(factor[i])`` per image, ``kind`` one of Brightness (black), Color (the
    L conversion), Contrast (the flat mean) and Sharpness (SMOOTH)."""
    if kind not in ("Brightness", "Color", "Contrast", "Sharpness"):
        raise ValueError(f"kind={kind!r} is not one of ImageEnhance's Brightness, Color, Contrast, Sharpness")
    degenerate = {"Color": gray, "Contrast": contrast_degenerate, "Sharpness": smooth}.get(kind)
    return blend(degenerate(x) if degenerate is not None else None, x, factor)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """``ImageOps.solarize(img, threshold[i])``: levels at or above the (float64) threshold inverted."""
    return torch.where(x.to(torch.float64) >= threshold.view(-1, 1, 1, 1), 255 - x, x)


def gray(x: torch.Tensor) -> torch.Tensor:
    """``convert("L")`` of RGB images, ``(K, 1, H, W)`` uint8: Pillow's fixed-point ``L24`` weights."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.to(torch.int32).unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).to(torch.uint8).unsqueeze(1)


def contrast_degenerate(x: torch.Tensor) -> torch.Tensor:
    """``ImageEnhance.Contrast``'s flat image: ``int(mean of convert("L") + 0.5)`` per image, ``(K, 1, 1, 1)``."""
    lum = gray(x)
    total = lum.to(torch.int64).sum(dim=(1, 2, 3)).to(torch.float64)
    count = torch.full_like(total, lum.shape[2] * lum.shape[3])  # a tensor divisor: CUDA multiplies by 1/scalar
    return torch.floor(total / count + 0.5).view(-1, 1, 1, 1)


def smooth(x: torch.Tensor) -> torch.Tensor:
    """``filter(ImageFilter.SMOOTH)`` (the 1-1-1/1-5-1/1-1-1 kernel over 13, rounded; the border kept), which
    ``ImageEnhance.Sharpness`` blends with: the weighted sum in integers (a 3x3 box sum from shifted slices,
    plus 4 times the centre), rounded as ``(2 * sum + 13) // 26`` (a sum over 13 is never k + 0.5)."""
    h, w = x.shape[-2:]
    if h <= 2 or w <= 2:
        return x
    v = x.to(torch.int16)
    rows = v[..., :-2, :] + v[..., 1:-1, :] + v[..., 2:, :]
    total = rows[..., :-2] + rows[..., 1:-1] + rows[..., 2:] + 4 * v[..., 1:-1, 1:-1]
    out = x.clone()
    out[..., 1:-1, 1:-1] = torch.div(2 * total + 13, 26, rounding_mode="floor").to(torch.uint8)
    return out


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """``ImageOps.autocontrast`` (no cutoff) per image and channel: a look-up table from the channel's lowest
    and highest level, ``int(ix * scale + offset)`` in float64 as ``ImageOps`` computes it."""
    k, c, h, w = x.shape
    flat = x.reshape(k * c, h * w)
    lo = flat.amin(1, keepdim=True).to(torch.float64)
    hi = flat.amax(1, keepdim=True).to(torch.float64)
    scale = torch.full_like(lo, 255.0) / (hi - lo).clamp(min=1)  # a true division (255.0 / t multiplies by 1/t)
    offset = -lo * scale
    ix = torch.arange(256, dtype=torch.float64, device=x.device).view(1, 256)
    lut = torch.trunc(ix * scale + offset).clamp_(0, 255)
    lut = torch.where(hi <= lo, ix, lut).to(torch.uint8)
    return lut.gather(1, flat.long()).view(k, c, h, w)
