"""AutoAugment, RandAugment, TrivialAugmentWide and AugMix, batched: ops drawn per sample, each run once per batch.

torchvision draws, per image, which op to apply and at which magnitude and sign, then runs that
op's tensor kernel on the one image. Here every sample draws the same way (same op table, same
magnitude bins, same signs; from the loader's generator), then the batch is split by op and each
op runs once on its subset: the geometric ones (shear, translate, rotate) in one ``grid_sample``
with a matrix per sample (nearest or bilinear), the colour ones with a factor per sample. AugMix
mixes chains of such rounds with Dirichlet weights. Given the same op and
magnitude, each kernel follows torchvision's tensor kernel (``transforms.functional``) step for
step -- the same inverse affine matrix and sampling grid, the same blend, blur, histogram and
look-up table -- so uint8 outputs are equal (tests/augment/test_auto.py). On PIL images torchvision runs
PIL's kernels instead; with ``pil=True`` each op computes those (:mod:`gpufeed.augment.pil`), equal too.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as nnf

from ..errors import ConfigError
from .color import _blend, adjust_brightness, adjust_contrast, adjust_saturation
from .transforms import BatchTransform, Params

__all__ = [
    "OPS",
    "AugMix",
    "AutoAugment",
    "RandAugment",
    "TrivialAugmentWide",
    "affine_sample",
    "apply_op",
    "dirichlet",
    "inverse_affine",
    "inverse_affine_v2",
    "policies",
    "sample_grid",
]

# torchvision's op order (its _augmentation_space keys); AutoAugment's policies add Invert.
OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
)
_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
_SIGNED = (*_GEOMETRIC, "Brightness", "Color", "Contrast", "Sharpness")


def _space(kind: str, bins: int, height: int, width: int) -> dict[str, torch.Tensor]:
    """Each op's magnitudes by bin, as torchvision's ``_augmentation_space`` builds them (float32 values)."""
    wide = kind == "wide"  # TrivialAugmentWide's wider ranges; RandAugment and AutoAugment share theirs
    lin = lambda hi: torch.linspace(0.0, hi, bins)  # noqa: E731
    space = {
        "ShearX": lin(0.99 if wide else 0.3),
        "ShearY": lin(0.99 if wide else 0.3),
        "TranslateX": lin(32.0 if wide else 150.0 / 331.0 * width),
        "TranslateY": lin(32.0 if wide else 150.0 / 331.0 * height),
        "Rotate": lin(135.0 if wide else 30.0),
        "Brightness": lin(0.99 if wide else 0.9),
        "Color": lin(0.99 if wide else 0.9),
        "Contrast": lin(0.99 if wide else 0.9),
        "Sharpness": lin(0.99 if wide else 0.9),
        "Posterize": (8 - (torch.arange(bins) / ((bins - 1) / (6 if wide else 4))).round().int()).float(),
        "Solarize": torch.linspace(255.0, 0.0, bins),
    }
    return space


def _table(
    kind: str, bins: int, height: int, width: int, ops: tuple[str, ...], v2_thresholds: bool = False
) -> torch.Tensor:
    """``(len(ops), bins)`` float64 magnitudes (0 for the ops without one). ``v2_thresholds``: solarize's as
    torchvision v2 takes them, ``255 * linspace(1, 0)`` (v1: ``linspace(255, 0)``; a few differ in the last bit)."""
    space = _space(kind, bins, height, width)
    if v2_thresholds:
        space["Solarize"] = torch.tensor(
            [255.0 * v for v in torch.linspace(1.0, 0.0, bins).tolist()], dtype=torch.float64
        )
    rows = [space[name].double() if name in space else torch.zeros(bins, dtype=torch.float64) for name in ops]
    return torch.stack(rows)


def inverse_affine(
    angle: torch.Tensor,
    tx: torch.Tensor,
    ty: torch.Tensor,
    scale: torch.Tensor,
    shear_x: torch.Tensor,
    shear_y: torch.Tensor,
    cx: torch.Tensor,
    cy: torch.Tensor,
) -> torch.Tensor:
    """``(N, 6)`` float64: torchvision's ``_get_inverse_affine_matrix`` per sample (degrees; the centre relative
    to the image centre), in Python's float arithmetic as torchvision computes it (cast, as it casts, to the
    image's float dtype, float32 for uint8, by :func:`affine_sample`): torch's own trigonometry
    differs from ``math``'s in the last bit, which moves a bilinear sample by a level now and then. Six
    numbers per sample, read to the host once per batch."""
    columns = [t.double().tolist() for t in (angle, tx, ty, scale, shear_x, shear_y, cx, cy)]
    rows = [_inverse_affine(*sample) for sample in zip(*columns, strict=True)]
    return torch.tensor(rows, dtype=torch.float64, device=angle.device).view(-1, 6)


def _inverse_affine(
    angle: float, tx: float, ty: float, scale: float, shear_x: float, shear_y: float, cx: float, cy: float
) -> list[float]:
    rot, sx, sy = math.radians(angle), math.radians(shear_x), math.radians(shear_y)
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [v / scale for v in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def inverse_affine_v2(
    angle: float, tx: float, ty: float, scale: float, shear_x: float, shear_y: float, cx: float, cy: float
) -> list[float]:
    """torchvision v2's ``_get_inverse_affine_matrix`` (the same matrix as v1's, its arithmetic in another order:
    on PIL images, where the matrix is used in float64, the last bits move a bilinear sample now and then)."""
    rot, sx, sy = math.radians(angle), math.radians(shear_x), math.radians(shear_y)
    cos_sy, tan_sx, rot_minus_sy = math.cos(sy), math.tan(sx), rot - sy
    cx_plus_tx, cy_plus_ty = cx + tx, cy + ty
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty
    return m


def _matrices(op: torch.Tensor, mag: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The matrices torchvision's ``_apply_op`` builds for each sample's geometric op."""
    zeros, ones = torch.zeros_like(mag), torch.ones_like(mag)
    is_ = lambda name: op == OPS.index(name)  # noqa: E731
    # ShearX/Y: shear = degrees(atan(m)) about [0, 0] (the top-left corner); Rotate: F.rotate's angle -m.
    shear = torch.tensor([math.degrees(math.atan(v)) for v in mag.double().tolist()], dtype=torch.float64)
    shear = shear.to(mag.device)
    corner = is_("ShearX") | is_("ShearY")
    return inverse_affine(
        torch.where(is_("Rotate"), -mag, zeros),
        torch.where(is_("TranslateX"), torch.trunc(mag), zeros),  # int(magnitude)
        torch.where(is_("TranslateY"), torch.trunc(mag), zeros),
        ones,
        torch.where(is_("ShearX"), shear, zeros),
        torch.where(is_("ShearY"), shear, zeros),
        torch.where(corner, zeros - width * 0.5, zeros),
        torch.where(corner, zeros - height * 0.5, zeros),
    )


def affine_nearest(x: torch.Tensor, matrices: torch.Tensor, fill: tuple[float, ...] | None) -> torch.Tensor:
    """Each image resampled through its inverse affine matrix (nearest), as torchvision's tensor ``affine``."""
    return affine_sample(x, matrices, fill, "nearest")


def affine_sample(x: torch.Tensor, matrices: torch.Tensor, fill: tuple[float, ...] | None, mode: str) -> torch.Tensor:
    """Each image resampled through its inverse affine matrix (``"nearest"`` or ``"bilinear"``), as torchvision's
    tensor ``affine`` / ``rotate``: its sampling grid, its fill mask (a ones channel sampled alongside)."""
    n, c, h, w = x.shape
    dev = x.device
    work = x.dtype if x.dtype.is_floating_point else torch.float32  # torchvision's grid dtype
    theta = matrices.view(n, 2, 3).to(work)
    base = torch.empty(1, h, w, 3, dtype=work, device=dev)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w, device=dev))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h, device=dev).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=work, device=dev)
    grid = base.view(1, h * w, 3).expand(n, h * w, 3).bmm(rescaled).view(n, h, w, 2)
    return sample_grid(x, grid, fill, mode)


def sample_grid(x: torch.Tensor, grid: torch.Tensor, fill: tuple[float, ...] | None, mode: str) -> torch.Tensor:
    """torchvision's ``_apply_grid_transform`` for a grid per sample: ``grid_sample`` with a ones channel
    sampled alongside, whose value says where the fill goes."""
    n, c, h, w = x.shape
    dev = x.device
    img = x.to(torch.float32) if not x.dtype.is_floating_point else x
    if fill is not None:
        img = torch.cat((img, torch.ones((n, 1, h, w), dtype=img.dtype, device=dev)), dim=1)
    out = nnf.grid_sample(img, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if fill is not None:
        mask = out[:, -1:].expand(n, c, h, w)
        out = out[:, :-1]
        values = torch.tensor(fill if len(fill) > 1 else fill * c, dtype=out.dtype, device=dev).view(1, c, 1, 1)
        if mode == "nearest":
            out = torch.where(mask < 0.5, values.expand_as(out), out)
        else:
            out = out * mask + (1.0 - mask) * values
    if x.dtype.is_floating_point:
        return out
    return out.round_().to(x.dtype)


def _sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] <= 2 or x.shape[-2] <= 2:
        return x
    if x.dtype == torch.uint8:  # torchvision's rounded float blur is Pillow's SMOOTH exactly: integers, 6x faster
        from . import pil

        return _blend(x, pil.smooth(x), factor)
    work = x.dtype
    kernel = torch.ones((3, 3), dtype=work, device=x.device)
    kernel[1, 1] = 5.0
    kernel /= kernel.sum()
    kernel = kernel.expand(x.shape[1], 1, 3, 3)
    blurred = nnf.conv2d(x.to(work), kernel, groups=x.shape[1])
    degenerate = x.clone()
    degenerate[..., 1:-1, 1:-1] = blurred.to(x.dtype)
    return _blend(x, degenerate, factor)


def _posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    mask = (-(2 ** (8 - bits.long()))).to(torch.int64) & 0xFF  # torchvision: img & -int(2 ** (8 - bits))
    return x & mask.to(torch.uint8).view(-1, 1, 1, 1)


def _solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    bound = 255 if x.dtype == torch.uint8 else 1.0
    return torch.where(x >= threshold.to(torch.float32).view(-1, 1, 1, 1), bound - x, x)


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    bound = 255.0 if x.dtype == torch.uint8 else 1.0
    work = x.dtype if x.dtype.is_floating_point else torch.float32
    low = x.amin(dim=(-2, -1), keepdim=True).to(work)
    high = x.amax(dim=(-2, -1), keepdim=True).to(work)
    scale = bound / (high - low)
    flat = ~torch.isfinite(scale)
    low, scale = low.masked_fill(flat, 0), scale.masked_fill(flat, 1)
    return ((x - low) * scale).clamp(0, bound).to(x.dtype)


def _equalize(x: torch.Tensor) -> torch.Tensor:
    """torchvision's per-channel equalisation (``_scale_channel``) for every image and channel at once."""
    n, c, h, w = x.shape
    flat = x.reshape(n * c, h * w).long()
    hist = torch.zeros(n * c, 256, dtype=torch.int64, device=x.device).scatter_add_(1, flat, torch.ones_like(flat))
    top = hist.gather(1, flat.amax(1, keepdim=True))  # the last non-zero bin's count
    step = torch.div(h * w - top, 255, rounding_mode="floor")  # sum of the non-zero bins but the last, // 255
    safe = step.clamp(min=1)
    lut = torch.div(torch.cumsum(hist, 1) + torch.div(safe, 2, rounding_mode="floor"), safe, rounding_mode="floor")
    lut = nnf.pad(lut, [1, 0])[:, :-1].clamp(0, 255)
    out = torch.where(step == 0, flat, lut.gather(1, flat))
    return out.to(torch.uint8).view(n, c, h, w)


def apply_op(
    x: torch.Tensor,
    op: torch.Tensor,
    magnitude: torch.Tensor,
    fill: float | tuple[float, ...] | None = None,
    interpolation: str = "nearest",
    pil: bool = False,
    v2: bool = False,
) -> torch.Tensor:
    """``x`` with op ``OPS[op[i]]`` at ``magnitude[i]`` (signed, as torchvision passes it) on each sample ``i``;
    each op runs once, on the samples that drew it. ``fill``: the geometric ops' outside (None: zeros);
    ``interpolation``: theirs, ``"nearest"`` or ``"bilinear"``. ``pil``: compute what torchvision computes on a
    PIL image (its ``_apply_op`` calls PIL: ``Image.transform``/``rotate``, ``ImageEnhance``, ``ImageOps``),
    with :mod:`gpufeed.augment.pil`'s kernels, instead of its tensor kernels (``v2``: as v2 computes them).

    The batch is sorted by op once, so that each op reads and writes a contiguous slice (the geometric
    ops, neighbours in :data:`OPS`, one slice and one ``grid_sample``), and put back in order once."""
    fill = _fill(fill)
    if op.numel() == 0:
        return x.clone()
    order = torch.argsort(op, stable=True)
    counts = torch.bincount(op, minlength=len(OPS)).tolist()  # one host read per round
    xs, ms = x.index_select(0, order), magnitude.index_select(0, order)
    res = torch.empty_like(xs)
    ends = dict(zip(OPS, itertools.accumulate(counts), strict=True))
    starts = {name: ends[name] - counts[k] for k, name in enumerate(OPS)}
    first, last = starts[_GEOMETRIC[0]], ends[_GEOMETRIC[-1]]
    if last > first and pil:
        part = slice(first, last)
        res[part] = _pil_geometric(xs[part], op.index_select(0, order)[part], ms[part], fill, interpolation, v2)
    elif last > first:
        part = slice(first, last)
        m = _matrices(op.index_select(0, order)[part], ms[part], x.shape[2], x.shape[3])
        res[part] = affine_sample(xs[part], m, fill, interpolation)
    for name in OPS:
        if name in _GEOMETRIC or starts[name] == ends[name]:
            continue
        part = slice(starts[name], ends[name])
        res[part] = _pil_colour(name, xs[part], ms[part]) if pil else _colour(name, xs[part], ms[part])
    return torch.empty_like(x).index_copy_(0, order, res)


def _pil_geometric(
    x: torch.Tensor,
    op: torch.Tensor,
    magnitude: torch.Tensor,
    fill: tuple[float, ...] | None,
    interpolation: str,
    v2: bool = False,
) -> torch.Tensor:
    """torchvision's geometric ``_apply_op`` on PIL images: ``F.affine`` hands PIL the inverse matrix about the
    absolute centre it is given ([0, 0] for a shear, the image centre for a translation), ``F.rotate`` calls
    ``Image.rotate``; the fill as ``_parse_fill`` makes it (integers, one per channel, 0 when None)."""
    from . import pil

    c, h, w = x.shape[1:]
    colour = pil.parse_fill(fill, c)
    host = torch.stack([op.double(), magnitude.double()]).tolist()  # one host read
    names, mags = [OPS[int(i)] for i in host[0]], host[1]
    matrix = inverse_affine_v2 if v2 else _inverse_affine
    out = torch.empty_like(x)
    rotate = [i for i, name in enumerate(names) if name == "Rotate"]
    moves = [i for i, name in enumerate(names) if name != "Rotate"]
    if rotate:
        index = torch.tensor(rotate, device=x.device)
        out[index] = pil.rotate(x[index], [mags[i] for i in rotate], interpolation, colour)
    if moves:
        matrices = []
        for i in moves:
            name, m = names[i], mags[i]
            shear = math.degrees(math.atan(m))
            if name in ("ShearX", "ShearY"):
                sx, sy = (shear, 0.0) if name == "ShearX" else (0.0, shear)
                matrices.append(matrix(0.0, 0.0, 0.0, 1.0, sx, sy, 0.0, 0.0))
            else:
                t = float(int(m))
                tx, ty = (t, 0.0) if name == "TranslateX" else (0.0, t)
                matrices.append(matrix(0.0, tx, ty, 1.0, 0.0, 0.0, w * 0.5, h * 0.5))
        index = torch.tensor(moves, device=x.device)
        out[index] = pil.affine(x[index], matrices, interpolation, colour)
    return out


def _pil_colour(name: str, x: torch.Tensor, mag: torch.Tensor) -> torch.Tensor:
    """torchvision's colour ``_apply_op`` on PIL images: ``ImageEnhance`` and ``ImageOps``; posterize, equalize
    and invert compute the same on PIL as the tensor kernels."""
    from . import pil

    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        return pil.enhance(name, x, 1.0 + mag)
    if name == "Solarize":  # ImageOps compares each level with the Python float threshold
        return pil.solarize(x, mag)
    if name == "AutoContrast":
        return pil.autocontrast(x)
    return _colour(name, x, mag)


def _colour(name: str, x: torch.Tensor, mag: torch.Tensor) -> torch.Tensor:
    if name == "Brightness":
        return adjust_brightness(x, 1.0 + mag)
    if name == "Color":
        return adjust_saturation(x, 1.0 + mag)
    if name == "Contrast":
        return adjust_contrast(x, 1.0 + mag)
    if name == "Sharpness":
        return _sharpness(x, 1.0 + mag)
    if name == "Posterize":
        return _posterize(x, mag)
    if name == "Solarize":
        return _solarize(x, mag)
    if name == "AutoContrast":
        return _autocontrast(x)
    if name == "Equalize":
        return _equalize(x)
    if name == "Invert":
        return (255 if x.dtype == torch.uint8 else 1.0) - x
    return x  # Identity


def _check_uint8(x: torch.Tensor, op: str) -> None:
    if x.dtype != torch.uint8:
        raise ConfigError(
            f"{op} runs on uint8 images, as torchvision's tensor kernels require (posterize and equalize are "
            f"defined on 0-255 levels); this batch is {x.dtype}: put it before ToTensor/ToDtype"
        )


def _check_mode(interpolation: str) -> None:
    if interpolation not in ("nearest", "bilinear"):
        raise ConfigError(f"interpolation={interpolation!r}: gpufeed batches 'nearest' and 'bilinear'")


def _fill(fill: Any) -> tuple[float, ...] | None:
    if fill is None:
        return None
    return (float(fill),) if isinstance(fill, (int, float)) else tuple(float(v) for v in fill)


def _signs(n: int, ops: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """-1 or +1 per sample (a fair coin, drawn for every sample), +1 for the ops without a sign."""
    coin = torch.randint(2, (n,), generator=generator, device=ops.device)
    signed = torch.isin(ops, torch.tensor([OPS.index(s) for s in _SIGNED], device=ops.device))
    return torch.where(signed & (coin == 1), -1.0, 1.0).to(torch.float64)


@dataclass(frozen=True)
class TrivialAugmentWide(BatchTransform):
    """torchvision's ``TrivialAugmentWide``: per sample one of 14 ops, a uniform magnitude bin and sign."""

    num_magnitude_bins: int = 31
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    v2_thresholds: bool = False  # torchvision v2's: solarize thresholds (see _table), on PIL its affine matrices
    pil: bool = False  # torchvision's PIL kernels (see apply_op)

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        if self.num_magnitude_bins < 2:
            raise ConfigError(f"num_magnitude_bins={self.num_magnitude_bins} must be >= 2")
        object.__setattr__(self, "fill", _fill(self.fill))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        _check_uint8(x, "TrivialAugmentWide")
        n, dev = x.shape[0], x.device
        op = torch.randint(14, (n,), generator=generator, device=dev)
        bins = torch.randint(self.num_magnitude_bins, (n,), generator=generator, device=dev)
        table = _table("wide", self.num_magnitude_bins, x.shape[2], x.shape[3], OPS[:14], self.v2_thresholds).to(dev)
        return {"op": op, "magnitude": table[op, bins] * _signs(n, op, generator)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return apply_op(
            x, params["op"], params["magnitude"], self.fill, self.interpolation, self.pil, self.v2_thresholds
        )


@dataclass(frozen=True)
class RandAugment(BatchTransform):
    """torchvision's ``RandAugment``: ``num_ops`` rounds, each a uniform op of 14 per sample at bin
    ``magnitude`` of ``num_magnitude_bins``, with a random sign."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    v2_thresholds: bool = False
    pil: bool = False

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        if self.num_ops < 0 or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ConfigError(
                f"num_ops={self.num_ops} must be >= 0 and magnitude={self.magnitude} a bin in "
                f"[0, num_magnitude_bins={self.num_magnitude_bins})"
            )
        object.__setattr__(self, "fill", _fill(self.fill))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        _check_uint8(x, "RandAugment")
        n, dev = x.shape[0], x.device
        table = _table("rand", self.num_magnitude_bins, x.shape[2], x.shape[3], OPS[:14], self.v2_thresholds).to(dev)
        rounds = []
        for _ in range(self.num_ops):
            op = torch.randint(14, (n,), generator=generator, device=dev)
            rounds.append((op, table[op, self.magnitude] * _signs(n, op, generator)))
        return {"rounds": rounds}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for op, magnitude in params["rounds"]:
            x = apply_op(x, op, magnitude, self.fill, self.interpolation, self.pil, self.v2_thresholds)
        return x


def policies(policy: str) -> tuple[tuple[tuple[str, float, int | None], ...], ...]:
    """AutoAugment's learned sub-policies for ``policy`` ("imagenet", "cifar10", "svhn"), read from torchvision
    (``((op, probability, magnitude bin), (op, probability, magnitude bin)), ...``)."""
    from torchvision.transforms import AutoAugment as TVAutoAugment
    from torchvision.transforms import AutoAugmentPolicy

    names = [p.value for p in AutoAugmentPolicy]
    if policy not in names:
        raise ConfigError(f"policy={policy!r} must be one of {names}")
    return tuple(tuple(tuple(step) for step in sub) for sub in TVAutoAugment(AutoAugmentPolicy(policy)).policies)


@dataclass(frozen=True)
class AutoAugment(BatchTransform):
    """torchvision's ``AutoAugment``: per sample one of the policy's sub-policies (uniform), each of its two
    ops applied with its probability, at its magnitude bin of 10, with a random sign."""

    policy: str = "imagenet"
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    v2_thresholds: bool = False
    pil: bool = False
    _rows: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        pol = policies(self.policy)
        object.__setattr__(self, "fill", _fill(self.fill))
        ops = torch.tensor([[OPS.index(step[0]) for step in sub] for sub in pol])  # (P, 2)
        probs = torch.tensor([[step[1] for step in sub] for sub in pol], dtype=torch.float64)
        bins = torch.tensor([[step[2] if step[2] is not None else 0 for step in sub] for sub in pol])
        object.__setattr__(self, "_rows", (ops, probs, bins))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        _check_uint8(x, "AutoAugment")
        n, dev = x.shape[0], x.device
        ops, probs, bins = (t.to(dev) for t in self._rows)
        table = _table("auto", 10, x.shape[2], x.shape[3], OPS, self.v2_thresholds).to(dev)
        which = torch.randint(len(ops), (n,), generator=generator, device=dev)
        chance = torch.rand((n, 2), generator=generator, device=dev, dtype=torch.float64)
        rounds = []
        for j in range(2):
            op = ops[which, j]
            magnitude = table[op, bins[which, j]] * _signs(n, op, generator)
            apply = chance[:, j] <= probs[which, j]  # torchvision: if probs[i] <= p
            rounds.append((torch.where(apply, op, 0), torch.where(apply, magnitude, 0.0)))
        return {"rounds": rounds}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for op, magnitude in params["rounds"]:
            x = apply_op(x, op, magnitude, self.fill, self.interpolation, self.pil, self.v2_thresholds)
        return x


_AUGMIX_OPS = (
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
_AUGMIX_ALL = ("Brightness", "Color", "Contrast", "Sharpness")


def _augmix_table(height: int, width: int, all_ops: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """AugMix's ops (as indices into :data:`OPS`) and their magnitudes over its 10 bins, as torchvision has them."""
    lin = lambda hi: torch.linspace(0.0, hi, 10)  # noqa: E731
    space = {
        "ShearX": lin(0.3),
        "ShearY": lin(0.3),
        "TranslateX": lin(width / 3.0),
        "TranslateY": lin(height / 3.0),
        "Rotate": lin(30.0),
        "Posterize": (4 - (torch.arange(10) / (9 / 4)).round().int()).float(),
        "Solarize": torch.linspace(255.0, 0.0, 10),
        "AutoContrast": torch.zeros(10),
        "Equalize": torch.zeros(10),
        **{name: lin(0.9) for name in _AUGMIX_ALL},
    }
    names = (*_AUGMIX_OPS, *(_AUGMIX_ALL if all_ops else ()))
    return torch.tensor([OPS.index(n) for n in names]), torch.stack([space[n].double() for n in names])


def dirichlet(concentration: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``(n, k)`` Dirichlet draws from ``generator``: normalised Gamma(alpha_j) draws (Marsaglia and Tsang's
    method, boosted below 1), since torch's own Dirichlet sampler takes no generator."""
    alpha = concentration.to(torch.float64).expand(n, -1)
    boost = alpha < 1
    a = torch.where(boost, alpha + 1, alpha)
    d = a - 1.0 / 3
    c = 1.0 / torch.sqrt(9 * d)
    gamma = torch.zeros_like(a)
    todo = torch.ones_like(a, dtype=torch.bool)
    while bool(todo.any()):
        z = torch.randn(a.shape, generator=generator, device=a.device, dtype=torch.float64)
        u = torch.rand(a.shape, generator=generator, device=a.device, dtype=torch.float64)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp(min=1e-300)))
        take = todo & ok
        gamma = torch.where(take, d * v, gamma)
        todo = todo & ~ok
    u = torch.rand(a.shape, generator=generator, device=a.device, dtype=torch.float64)
    gamma = torch.where(boost, gamma * u ** (1.0 / alpha), gamma)
    return (gamma / gamma.sum(1, keepdim=True)).to(torch.float32)


@dataclass(frozen=True)
class AugMix(BatchTransform):
    """torchvision's ``AugMix``: per sample, ``mixture_width`` chains of 1-3 (or ``chain_depth``) ops at a bin below
    ``severity``, mixed with Dirichlet weights, then with the original by a Beta weight; the sum truncated back
    to uint8 as torchvision's ``.to(dtype)`` does."""

    severity: int = 3
    mixture_width: int = 3
    chain_depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "bilinear"  # torchvision's AugMix default (the others': nearest)

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        if not 1 <= self.severity <= 10 or self.mixture_width < 1 or self.alpha <= 0:
            raise ConfigError(
                f"severity={self.severity} must be in [1, 10], mixture_width={self.mixture_width} >= 1, "
                f"alpha={self.alpha} > 0"
            )
        object.__setattr__(self, "fill", _fill(self.fill))

    def sample(self, x: torch.Tensor, generator: torch.Generator) -> Params:
        _check_uint8(x, "AugMix")
        n, dev = x.shape[0], x.device
        ops, table = (t.to(dev) for t in _augmix_table(x.shape[2], x.shape[3], self.all_ops))
        m = dirichlet(torch.tensor([self.alpha, self.alpha], device=dev), n, generator)
        weights = dirichlet(torch.tensor([self.alpha] * self.mixture_width, device=dev), n, generator) * m[:, 1:2]
        chains = []
        for _ in range(self.mixture_width):
            if self.chain_depth > 0:
                depth = torch.full((n,), self.chain_depth, device=dev)
            else:
                depth = torch.randint(1, 4, (n,), generator=generator, device=dev)
            steps = []
            for step in range(int(self.chain_depth) if self.chain_depth > 0 else 3):
                pick = torch.randint(len(ops), (n,), generator=generator, device=dev)
                bins = torch.randint(self.severity, (n,), generator=generator, device=dev)
                op = torch.where(step < depth, ops[pick], 0)  # Identity past the sample's depth
                magnitude = torch.where(step < depth, table[pick, bins] * _signs(n, ops[pick], generator), 0.0)
                steps.append((op, magnitude))
            chains.append(steps)
        return {"original": m[:, 0], "weights": weights, "chains": chains}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        shape = (-1, 1, 1, 1)
        mix = params["original"].view(shape) * x
        for i, steps in enumerate(params["chains"]):
            aug = x
            for op, magnitude in steps:
                aug = apply_op(aug, op, magnitude, self.fill, self.interpolation)
            mix.add_(params["weights"][:, i].view(shape) * aug)
        return mix.to(x.dtype)
