"""The auto-augment family's op table and kernels: which op an index names, its magnitudes, and each op batched.

torchvision's ``_augmentation_space`` as tables (:data:`OPS`, one row of magnitude bins per op), and
:func:`apply_op`, which runs each sample's drawn op once per batch on the samples that drew it: the geometric
ones (shear, translate, rotate) in one ``grid_sample`` with a matrix per sample (:mod:`.affine`), the colour ones
with a factor per sample. Given the same op and magnitude, each kernel follows torchvision's tensor kernel
(``transforms.functional``) step for step; with ``pil=True`` PIL's (:mod:`gpufeed.augment.pil`). The policies that
draw the ops are in :mod:`.auto`.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
import torch.nn.functional as nnf

from .affine import affine_sample, inverse_affine_v1, inverse_affine_v2
from .color import adjust_brightness, adjust_contrast, adjust_saturation, blend
from .params import fill_tuple

__all__ = [
    "OPS",
    "SIGNED",
    "adjust_sharpness",
    "apply_op",
    "augmix_table",
    "autocontrast",
    "equalize",
    "magnitude_table",
    "matrices",
    "posterize",
    "solarize",
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
# The ops whose magnitude torchvision negates with probability 1/2.
SIGNED = (*_GEOMETRIC, "Brightness", "Color", "Contrast", "Sharpness")


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


@functools.lru_cache(maxsize=64)
def magnitude_table(
    kind: str,
    bins: int,
    height: int,
    width: int,
    ops: tuple[str, ...],
    v2_thresholds: bool = False,
    device: torch.device | None = None,
) -> torch.Tensor:
    """``(len(ops), bins)`` float64 magnitudes (0 for the ops without one), on ``device`` (None: the CPU); made once
    per shape and device (rebuilt every batch, its 25 small operations were a tenth of TrivialAugmentWide's kernel
    launches on a GPU): read it, never write to it. ``v2_thresholds``: solarize's as torchvision v2 takes them,
    ``255 * linspace(1, 0)`` (v1: ``linspace(255, 0)``; a few differ in the last bit)."""
    if device is not None:
        return magnitude_table(kind, bins, height, width, ops, v2_thresholds).to(device)
    space = _space(kind, bins, height, width)
    if v2_thresholds:
        space["Solarize"] = torch.tensor(
            [255.0 * v for v in torch.linspace(1.0, 0.0, bins).tolist()], dtype=torch.float64
        )
    rows = [space[name].double() if name in space else torch.zeros(bins, dtype=torch.float64) for name in ops]
    return torch.stack(rows)


def matrices(op: torch.Tensor, mag: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The matrices torchvision's ``_apply_op`` builds for each sample's geometric op (the identity for the others),
    ``(N, 6)`` float64 on ``op``'s device: computed on the host in Python's float arithmetic, as torchvision does
    (:func:`~gpufeed.augment.affine.inverse_affine_v1`), from one read of the ops and magnitudes."""
    rows = []
    for index, m in zip(*torch.stack([op.double(), mag.double()]).tolist(), strict=True):
        name = OPS[int(index)]
        # ShearX/Y: shear = degrees(atan(m)) about [0, 0] (the top-left corner); Rotate: F.rotate's angle -m;
        # Translate: int(m), its zero keeping m's sign as torch.trunc keeps it
        shear = math.degrees(math.atan(m))
        corner = name in ("ShearX", "ShearY")
        rows.append(
            inverse_affine_v1(
                -m if name == "Rotate" else 0.0,
                math.copysign(float(math.trunc(m)), m) if name == "TranslateX" else 0.0,
                math.copysign(float(math.trunc(m)), m) if name == "TranslateY" else 0.0,
                1.0,
                shear if name == "ShearX" else 0.0,
                shear if name == "ShearY" else 0.0,
                0.0 - width * 0.5 if corner else 0.0,
                0.0 - height * 0.5 if corner else 0.0,
            )
        )
    return torch.tensor(rows, dtype=torch.float64, device=op.device).view(-1, 6)


def adjust_sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's tensor ``adjust_sharpness`` with a factor per sample (images of 2 pixels or less stay)."""
    if x.shape[-1] <= 2 or x.shape[-2] <= 2:
        return x
    if x.dtype == torch.uint8:  # torchvision's rounded float blur is Pillow's SMOOTH exactly: integers, 6x faster
        from . import pil

        return blend(x, pil.smooth(x), factor)
    work = x.dtype
    kernel = torch.ones((3, 3), dtype=work, device=x.device)
    kernel[1, 1] = 5.0
    kernel /= kernel.sum()
    kernel = kernel.expand(x.shape[1], 1, 3, 3)
    blurred = nnf.conv2d(x.to(work), kernel, groups=x.shape[1])
    degenerate = x.clone()
    degenerate[..., 1:-1, 1:-1] = blurred.to(x.dtype)
    return blend(x, degenerate, factor)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The top ``bits[i]`` bits of each uint8 level of sample ``i``, as torchvision's tensor ``posterize``."""
    mask = (-(2 ** (8 - bits.long()))).to(torch.int64) & 0xFF  # torchvision: img & -int(2 ** (8 - bits))
    return x & mask.to(torch.uint8).view(-1, 1, 1, 1)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """torchvision's tensor ``solarize``: levels at or above each sample's threshold inverted."""
    bound = 255 if x.dtype == torch.uint8 else 1.0
    return torch.where(x >= threshold.to(torch.float32).view(-1, 1, 1, 1), bound - x, x)


def autocontrast(x: torch.Tensor, widen: bool = False) -> torch.Tensor:
    """torchvision's tensor ``autocontrast``: each image's channels stretched to the full range. ``widen``: find
    the lowest and highest levels of uint8 as int16, the same values (Inductor's C++ in torch 2.14 compiles a uint8
    ``amin`` to 0: the compiled copy in .auto_fused widens first)."""
    bound = 255.0 if x.dtype == torch.uint8 else 1.0
    work = x.dtype if x.dtype.is_floating_point else torch.float32
    levels = x.to(torch.int16) if widen and x.dtype == torch.uint8 else x
    low = levels.amin(dim=(-2, -1), keepdim=True).to(work)
    high = levels.amax(dim=(-2, -1), keepdim=True).to(work)
    scale = bound / (high - low)
    flat = ~torch.isfinite(scale)
    low, scale = low.masked_fill(flat, 0), scale.masked_fill(flat, 1)
    return ((x - low) * scale).clamp(0, bound).to(x.dtype)


def equalize(x: torch.Tensor) -> torch.Tensor:
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
    fill = fill_tuple(fill)
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
        m = matrices(op.index_select(0, order)[part], ms[part], x.shape[2], x.shape[3])
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
    matrix = inverse_affine_v2 if v2 else inverse_affine_v1
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
        return adjust_sharpness(x, 1.0 + mag)
    if name == "Posterize":
        return posterize(x, mag)
    if name == "Solarize":
        return solarize(x, mag)
    if name == "AutoContrast":
        return autocontrast(x)
    if name == "Equalize":
        return equalize(x)
    if name == "Invert":
        return (255 if x.dtype == torch.uint8 else 1.0) - x
    return x  # Identity


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


@functools.lru_cache(maxsize=64)
def augmix_table(
    height: int, width: int, all_ops: bool, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """AugMix's ops (as indices into :data:`OPS`) and their magnitudes over its 10 bins, as torchvision has them, on
    ``device`` (None: the CPU); made once (read them, never write to them)."""
    if device is not None:
        ops, table = augmix_table(height, width, all_ops)
        return ops.to(device), table.to(device)
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
