"""Resampling by the filter's taps: per output pixel only the source pixels the filter touches.

:func:`resample_taps` gives each box's taps (source indices and weights, PyTorch's antialiased filters); the ragged
resize (:mod:`.ragged_resize`) gathers them, and a float batch's resize (:mod:`.resample`) places them in matrices.
Matrices make every output pixel read its whole row: at 224 px, 34 GFLOP a batch of 256. A uint8 batch of one size
is resampled from its taps (:func:`fused_resized_crop`): a vertical pass over whole rows, then a horizontal one
gathering columns, each a float32 sum over the taps in their order.

The flips and the ``Normalize`` that follow a RandomResizedCrop in a ``Compose`` run in the same passes: a flipped
sample reads its taps in reverse (the flip's pixels exactly), and the rounded levels are normalised before they
are stored, as ``Normalize`` computes them from the uint8 image, so the batch is written once, as float.

One arithmetic, two ways to run it (NOTE [ Compiled ops ] in :mod:`.fusion`): compiled where the compiler has
built it (:func:`taps_resample`: two loops, 3.3-3.7x the matrices at 128 and 224 px on the 2-core CPU), else
eager (:func:`eager_taps`: the same float32 products and sums in the same order, a cache-sized chunk of samples at
a time on the CPU). They agree bit for bit on the CPU (tests/augment/test_same_pixels.py), so a seed's pixels do
not depend on whether a compiler exists, on ``GPUFEED_COMPILE``, or on when the compiled code took over. What
remains different: Triton on a GPU against the CPU (its division and its fused multiply-adds are held to the
eager roundings, ``emulate_precision_casts``; ``benchmarks/gpu_check.py`` counts the values that differ), and the
float matrices of a float batch, which round their sums in another order (within a level of the taps on a pixel
in 10**3 or fewer; both within torchvision's float kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .chunks import chunk_samples
from .functional import Flips, Normalizing, constant
from .fusion import NotCompiled, compiling, fused
from .paths import host_path

__all__ = ["eager_taps", "fused_resized_crop", "normalizing", "resample_taps", "tables", "taps_bound", "taps_resample"]


def taps_resample(
    x: torch.Tensor,
    rows: torch.Tensor,
    wy: torch.Tensor,
    cols: torch.Tensor,
    wx: torch.Tensor,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    reciprocal: bool = False,
) -> torch.Tensor:
    """uint8 ``(N, C, H, W)`` resampled by its taps: absolute source rows ``(N, out_h, Ky)`` with their weights,
    then columns ``(N, out_w, Kx)``; float32 sums over the taps in their order, rounded and clamped once
    (torchvision v1's uint8). With ``mean`` and ``std`` (``(1, C, 1, 1)`` float32), the levels normalised as
    ``Normalize`` does a uint8 image: float32 out. Written for the compiler (eager, each tap gathers through an
    expanded index: 2-7x slower than the matrices at 224 px); :func:`eager_taps` is the same arithmetic for eager
    kernels."""
    n, c, _, w = x.shape
    out_h, ky = rows.shape[1:]
    out_w, kx = cols.shape[1:]
    tmp = None
    for a in range(ky):  # unrolled: Inductor vectorised a reduction over 3 taps along them, 20x slower
        t = x.gather(2, rows[:, :, a].view(n, 1, out_h, 1).expand(n, c, out_h, w)) * wy[:, :, a].view(n, 1, out_h, 1)
        tmp = t if tmp is None else tmp + t
    assert tmp is not None
    out = None
    for b in range(kx):
        t = tmp.gather(3, cols[:, :, b].view(n, 1, 1, out_w).expand(n, c, out_h, out_w))
        t = t * wx[:, :, b].view(n, 1, 1, out_w)
        out = t if out is None else out + t
    assert out is not None
    levels = out.round().clamp(0, 255)
    if mean is None or std is None:
        return levels.to(torch.uint8)
    # Normalize's arithmetic on the uint8 image (functional.normalize): the levels are its integers already
    scaled = levels * (1.0 / 255) if reciprocal else levels / 255
    return (scaled - mean) / std


# the channels a constant of the loader's, the tap counts constants (the loops over them unrolled)
_STATIC = {0: (1,), 1: (2,), 2: (2,), 3: (2,), 4: (2,)}
_fused_taps = fused("RandomResizedCrop's resampling", "the same pixels by eager_taps", static=_STATIC)(taps_resample)


def eager_taps(
    x: torch.Tensor,
    rows: torch.Tensor,
    wy: torch.Tensor,
    cols: torch.Tensor,
    wx: torch.Tensor,
    mean: torch.Tensor | None = None,
    std: torch.Tensor | None = None,
    reciprocal: bool = False,
) -> torch.Tensor:
    """:func:`taps_resample`'s arithmetic for eager kernels, bit for bit: the same float32 product per tap and the
    same sums in the same order, then the same rounding, clamp and Normalize; what changes is only how the values
    are moved. The rows of each tap are copied as whole rows (``index_select``), and the horizontal pass reads the
    vertical one's result transposed, so that its columns are rows too (a gather through an expanded index read an
    8-byte index per value: 1.7-4x slower). On the CPU a chunk of samples whose intermediates fit a quarter of the
    last-level cache at a time (:func:`.chunks.chunk_samples`): measured on one core, the recipe's resize 3-5x faster
    than unchunked at 224 px (64 images of 256 px: 105 against 455-591 ms; the matrices 304-334 ms), and as fast as
    the matrices at 32 px (256 images: 5.5-20 against 7-19 ms)."""
    n, c, _, w = x.shape
    out_h, out_w = rows.shape[1], cols.shape[1]
    dtype = torch.uint8 if mean is None or std is None else torch.float32
    out = torch.empty((n, c, out_h, out_w), dtype=dtype, device=x.device)
    per = chunk_samples(4 * c * out_h * (3 * w + 2 * out_w)) if host_path(x) else max(n, 1)
    for s in range(0, n, per):
        part = slice(s, s + per)
        _taps_into(out[part], x[part], rows[part], wy[part], cols[part], wx[part], mean, std, reciprocal)
    return out


def _taps_into(
    out: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    wy: torch.Tensor,
    cols: torch.Tensor,
    wx: torch.Tensor,
    mean: torch.Tensor | None,
    std: torch.Tensor | None,
    reciprocal: bool,
) -> None:
    """:func:`eager_taps` on one chunk, written into ``out``."""
    n, c, h, w = x.shape
    out_h, ky = rows.shape[1:]
    out_w, kx = cols.shape[1:]
    planes = torch.arange(n * c, device=x.device).view(n, c, 1)  # each (sample, channel) plane's first row
    source = x.reshape(n * c * h, w)
    tmp = buf = None
    for a in range(ky):  # taps_resample's vertical sum: float(level) * weight, added in the taps' order
        picked = source.index_select(0, (planes * h + rows[:, :, a].view(n, 1, out_h)).view(-1))
        weight = wy[:, :, a].view(n, 1, out_h, 1)
        if tmp is None:
            tmp = picked.view(n, c, out_h, w) * weight
            buf = torch.empty_like(tmp)
        else:
            tmp.add_(torch.mul(picked.view(n, c, out_h, w), weight, out=buf))
    assert tmp is not None
    across = tmp.transpose(2, 3).contiguous().view(n * c * w, out_h)  # (N, C, W, out_h): a column is a row
    acc = None
    for b in range(kx):  # the horizontal sum, transposed
        picked = across.index_select(0, (planes * w + cols[:, :, b].view(n, 1, out_w)).view(-1))
        t = picked.view(n, c, out_w, out_h).mul_(wx[:, :, b].view(n, 1, out_w, 1))
        acc = t if acc is None else acc.add_(t)
    assert acc is not None
    levels = acc.round_().clamp_(0, 255).transpose(2, 3)
    if mean is None or std is None:
        out.copy_(levels)  # integers in [0, 255]: exact in uint8
        return
    out.copy_(levels)
    out.mul_(1.0 / 255) if reciprocal else out.div_(255)  # Normalize's arithmetic, as taps_resample's
    out.sub_(mean).div_(std)


def taps_bound(in_len: int, out_len: int, antialias: bool, mode: str) -> int:
    """The taps :func:`resample_taps` needs for any box of at most ``in_len``: fixed by the shapes, so that the
    compiled resampling sees one tap count per loader (a count from each batch's largest box would recompile,
    seconds, whenever it changed)."""
    if mode == "bicubic" and not antialias:
        return 4
    support = (max(in_len / out_len, 1.0) if antialias else 1.0) * (2.0 if mode == "bicubic" else 1.0)
    return int(math.ceil(support)) * 2 + 1


def tables(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    flips: Flips = (),
    modes: Sequence[str] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`taps_resample`'s absolute rows, their weights, columns and theirs for each sample's box of ``x``
    resized to ``size``, as many taps as the shapes allow (:func:`taps_bound`; the most of any of ``modes``, an op's
    interpolations drawn per sample, so that all of them share one compiled function); a sample that ``flips``
    mirror reads its output rows or columns' taps in reverse."""
    h, w = x.shape[2:]
    bound = lambda have, out: max(taps_bound(have, out, antialias, m) for m in (mode, *modes))  # noqa: E731
    ry, wy = resample_taps(top, height, size[0], antialias, mode, bound(h, size[0]))
    cx, wx = resample_taps(left, width, size[1], antialias, mode, bound(w, size[1]))
    rows, cols = ry + top.view(-1, 1, 1), cx + left.view(-1, 1, 1)
    for axis, mask in flips:  # a flipped sample's output row or column i reads the taps of size - 1 - i
        m = mask.view(-1, 1, 1)
        if axis == "cols":
            cols, wx = torch.where(m, cols.flip(1), cols), torch.where(m, wx.flip(1), wx)
        else:
            rows, wy = torch.where(m, rows.flip(1), rows), torch.where(m, wy.flip(1), wy)
    return rows, wy, cols, wx


def fused_resized_crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    flips: Flips = (),
    normalize: Normalizing | None = None,
    modes: Sequence[str] = (),
) -> torch.Tensor:
    """Each uint8 sample's box resized to ``size`` (bilinear or bicubic) by its taps, then ``flips``, then
    ``normalize`` (float32 out), in two passes: :func:`taps_resample` compiled where the compiler has built it (see
    NOTE [ Compiled ops ] in :mod:`.fusion`), else :func:`eager_taps`, the same pixels. A batch of one, or a side
    under 2, runs eager: compiled code specialises on a size of 1 (a recompile, seconds, for a last batch). ``modes``:
    see :func:`tables`."""
    n, c, h, w = x.shape
    if n == 0:
        return torch.empty((0, c, *size), dtype=torch.uint8 if normalize is None else torch.float32, device=x.device)
    taps = tables(x, top, left, height, width, size, antialias, mode, flips, modes)
    norm: tuple = ()
    if normalize is not None:
        mean, std, reciprocal = normalize
        norm = (*normalizing(mean, std, c, size[1], x.device), reciprocal)
    if n >= 2 and min(h, w, *size) >= 2 and compiling(x.device):
        try:
            return _fused_taps(x, *taps, *norm)
        except NotCompiled:
            pass
    return eager_taps(x, *taps, *norm)


def normalizing(
    mean: Sequence[float], std: Sequence[float], channels: int, width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalize's mean and std for :func:`taps_resample`: float32 ``(1, C, 1, width)``, rows of the output's width
    (read as ``(1, C, 1, 1)``, they made Inductor tile its loop over channels and columns, 2.5x slower: 63 against
    25 ms at 128 px, CPU)."""
    like = torch.empty((0, channels), dtype=torch.float32, device=device)  # Normalize's constants, made once
    return tuple(constant(v, like, name).expand(1, channels, 1, width).contiguous()  # type: ignore[return-value]
                 for v, name in ((mean, "mean"), (std, "std")))  # fmt: skip


def _cubic(t: torch.Tensor, a: float) -> torch.Tensor:
    """The cubic convolution kernel (Keys): ``a=-0.5`` in PyTorch's antialiased resize, ``-0.75`` in its plain one."""
    t = t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = (((t - 5) * t + 8) * t - 4) * a
    return torch.where(t < 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


def resample_taps(
    start: torch.Tensor,
    length: torch.Tensor,
    out_len: int,
    antialias: bool,
    mode: str = "bilinear",
    taps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, out_len, K)`` box-relative source indices and weights of each box ``[start, start + length)``: only
    the taps the filter touches, not a dense matrix -- a 375x500 photo cropped to 224 needs about 5 per output
    pixel. Bilinear, and antialiased bicubic (``a=-0.5``), as PyTorch's antialiased kernels: the filter
    widened by the scale when shrinking, cut at the box and renormalised. Plain bicubic as PyTorch's: four
    taps with ``a=-0.75``, indices clamped to the box."""
    dev = start.device
    scale = length.double().view(-1, 1) / out_len
    i = torch.arange(out_len, dtype=torch.float64, device=dev).view(1, -1)
    last = length.view(-1, 1, 1) - 1
    if mode == "nearest":  # PyTorch's "nearest" (torchvision's tensor kernel): floorf(i * scale) in float32
        scale32 = length.to(torch.float32).view(-1, 1) / out_len
        k = torch.floor(i.to(torch.float32) * scale32).long().unsqueeze(-1)
        return torch.minimum(k, last), torch.ones(k.shape, dtype=torch.float32, device=dev)
    if mode == "bicubic" and not antialias:
        src = (i + 0.5) * scale - 0.5
        floor = torch.floor(src)
        offsets = torch.arange(-1, 3, device=dev)
        k = floor.long().unsqueeze(-1) + offsets.view(1, 1, -1)
        w = _cubic((src - floor).unsqueeze(-1) - offsets.view(1, 1, -1).double(), -0.75)
        return torch.minimum(k.clamp(min=0), last), w.to(torch.float32)
    stretch = scale.clamp(min=1.0) if antialias else torch.ones_like(scale)
    support = stretch * (2.0 if mode == "bicubic" else 1.0)
    centre = (i + 0.5) * scale
    if taps is None:
        taps = int(math.ceil(float(support.max()))) * 2 + 1
    first = torch.floor(centre - support + 0.5).long()
    k = first.unsqueeze(-1) + torch.arange(taps, device=dev).view(1, 1, -1)
    d = (k + 0.5 - centre.unsqueeze(-1)) / stretch.unsqueeze(-1)
    w = _cubic(d, -0.5) if mode == "bicubic" else (1 - d.abs()).clamp(min=0)
    w = w * ((k >= 0) & (k <= last))
    w = w / w.sum(-1, keepdim=True)
    return torch.minimum(k.clamp(min=0), last), w.to(torch.float32)
