"""The auto-augment family's colour ops in one compiled function, on the device's path.

On the host's path :func:`~gpufeed.augment.auto_ops.apply_op` sorts the batch by op and runs each op on its slice
(the least arithmetic, a CPU's best). On a GPU that is each op's dozen kernels, one host read, the sort and the
scatter back: about a hundred kernel launches a round. Here every colour op runs on every sample of the batch in
one compiled function (:mod:`.fusion`: a few loops), and each sample keeps its own op's pixels; the geometric ops run
as one ``grid_sample`` beside it. The arithmetic is the eager kernels' own, traced (integer steps, and the same float32
products and sums), but for contrast's mean: a float32 sum of integer grays, the same in any order below 2**24 and
equal to ``torch.mean`` there (as in .jitter); larger images run the eager path. Bit for bit with the host's path:
tests/augment/test_fusion.py.
"""

from __future__ import annotations

import torch

from . import auto_ops
from .affine import affine_sample
from .auto_ops import OPS, autocontrast, equalize, posterize, solarize
from .color import adjust_brightness, adjust_saturation, blend, gray
from .fusion import NotCompiled, compiling, fused
from .params import fill_tuple
from .paths import host_path
from .pil import smooth

__all__ = ["apply_op", "colour_ops", "fused_colour_ops"]

_GEOMETRIC = (OPS.index("ShearX"), OPS.index("Rotate"))  # the geometric ops' indices, first and last (auto_ops)


def apply_op(
    x: torch.Tensor,
    op: torch.Tensor,
    magnitude: torch.Tensor,
    fill: float | tuple[float, ...] | None = None,
    interpolation: str = "nearest",
    pil: bool = False,
    v2: bool = False,
) -> torch.Tensor:
    """:func:`gpufeed.augment.auto_ops.apply_op`; on the device's path with the tensor kernels, the colour ops
    compiled into one function for the whole batch and the geometric ones in one ``grid_sample`` for it, each
    sample keeping its own op's pixels (no sort, no per-op slices)."""
    if not pil and not host_path(x):
        try:
            colour = fused_colour_ops(x, op, magnitude)
        except NotCompiled:
            pass
        else:
            h, w = x.shape[2:]
            moved = affine_sample(x, auto_ops.matrices(op, magnitude, h, w), fill_tuple(fill), interpolation)
            geometric = (op >= _GEOMETRIC[0]) & (op <= _GEOMETRIC[1])
            return torch.where(geometric.view(-1, 1, 1, 1), moved, colour)
    return auto_ops.apply_op(x, op, magnitude, fill, interpolation, pil, v2)


_EXACT_SUM_PIXELS = (1 << 24) // 255  # below this, a float32 sum of gray levels is exact in any order


def colour_ops(x: torch.Tensor, op: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Each sample of the uint8 batch through its colour op ``OPS[op[i]]`` at ``magnitude[i]`` (Identity, and the
    geometric ops, leave it as it is), every op computed for every sample."""
    picks = lambda name: (op == OPS.index(name)).view(-1, 1, 1, 1)  # noqa: E731
    factor = 1.0 + magnitude  # as apply_op hands the enhancements their factor
    out = torch.where(picks("Brightness"), adjust_brightness(x, factor), x)
    out = torch.where(picks("Color"), adjust_saturation(x, factor), out)
    levels = gray(x).to(torch.float32)  # contrast blends with the mean gray, summed exactly (see the module's text)
    mean = levels.sum(dim=(1, 2, 3), keepdim=True) / (x.shape[2] * x.shape[3])
    out = torch.where(picks("Contrast"), blend(x, mean, factor), out)
    if x.shape[2] > 2 and x.shape[3] > 2:  # as adjust_sharpness: images of 2 pixels or less stay
        out = torch.where(picks("Sharpness"), blend(x, smooth(x), factor), out)
    bits = torch.where(picks("Posterize").view(-1), magnitude, 8.0)  # another op's magnitude is no bit count
    out = torch.where(picks("Posterize"), posterize(x, bits), out)
    out = torch.where(picks("Solarize"), solarize(x, magnitude), out)
    out = torch.where(picks("AutoContrast"), autocontrast(x, widen=True), out)
    out = torch.where(picks("Equalize"), equalize(x), out)
    return torch.where(picks("Invert"), 255 - x, out)


_fused = fused(
    "auto-augment colour ops", "the same pixels, about a hundred more kernel launches a round", static={0: (1,)}
)(colour_ops)


def fused_colour_ops(x: torch.Tensor, op: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """:func:`colour_ops` compiled, or :class:`NotCompiled` (before any work) where it does not run so: no
    compiler, a dimension under 2, not uint8 RGB, an image too large for contrast's exact sum."""
    if not compiling(x.device) or min(x.shape) < 2 or x.dtype != torch.uint8 or x.shape[1] != 3:
        raise NotCompiled
    if x.shape[2] * x.shape[3] > _EXACT_SUM_PIXELS:
        raise NotCompiled
    return _fused(x, op, magnitude)
