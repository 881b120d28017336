"""The fixed-point uint8 resampling that torchvision v2 (on the CPU) and Pillow run, batched.

torchvision v1 resizes a uint8 tensor through float32 and rounds once at the end. torchvision v2 on
the CPU hands uint8 straight to PyTorch's own uint8 kernel (always for bicubic; for bilinear on
AVX2/AVX512/ARM CPUs), and Pillow resizes PIL images the same way, from which PyTorch's kernel was
ported: weights quantised to integers, a horizontal pass whose result is rounded *and clamped to
0-255*, then a vertical pass, rounded and clamped again. Bicubic overshoots at edges, so the
intermediate clamp moves pixels a long way: on noise the two kernels differ by up to 35 levels
(measured on 32x32 -> 48x48 and 64x64 -> 224x224 crops; tests/augment/test_fixed_point.py).

This module computes those integer weights exactly as the C code does (in float64, the same order of
operations) and applies the two passes with integer arithmetic, so the result is bit-identical.
The two flavours differ in the weights' precision: PyTorch picks per pass the most bits that keep the
largest weight in int16 (``_bits``); Pillow always uses 22 bits. And in the order of the passes: PyTorch
always resamples horizontally first; Pillow 13 vertically first when the height shrinks by more than
twice what the width shrinks (python-pillow #9549; :func:`vertical_first`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

__all__ = ["KERNELS", "by_pass_order", "fixed_resized_crop", "fixed_taps", "shift_clamp", "vertical_first"]

# How a uint8 image is resampled: "float" (through float32, rounded once: torchvision v1, and v2 off
# the CPU), "torch" (PyTorch's fixed-point uint8 kernel: v2 on the CPU), "pil" (Pillow's: PIL images).
KERNELS = ("float", "torch", "pil")
_PIL_BITS = 22  # Pillow's PRECISION_BITS (32 - 8 - 2)


def _cubic(x: torch.Tensor, a: float, pil: bool) -> torch.Tensor:
    """The cubic convolution filter in the C code's own order of operations (float64 rounding matters: one ulp
    can move an integer weight). PyTorch: ``cubic_convolution1/2``; Pillow: ``bicubic_filter``."""
    x = x.abs()
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a if pil else ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, torch.zeros_like(x)))


def _filter(x: torch.Tensor, mode: str, a: float, pil: bool) -> torch.Tensor:
    if mode == "bicubic":
        return _cubic(x, a, pil)
    x = x.abs()
    return torch.where(x < 1.0, 1.0 - x, torch.zeros_like(x))


def _aa_weights(
    length: torch.Tensor, out_len: int, mode: str, pil: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's ``_compute_indices_min_size_weights_aa`` (and Pillow's ``precompute_coeffs``): per output pixel
    the first source index and normalised float64 weights; and the largest weight per sample."""
    dev = length.device
    size = length.view(-1, 1)
    scale = size.double() / out_len  # (N, 1)
    base = 2.0 if mode == "bicubic" else 1.0
    wide = scale >= 1.0
    support = torch.where(wide, base * scale, torch.full_like(scale, base))
    invscale = torch.where(wide, 1.0 / scale, torch.ones_like(scale))
    span = torch.ceil(support).long() * 2 + 1  # max_interp_size per sample
    taps = int(span.max())  # one host read per batch: the number of taps
    centre = scale * (torch.arange(out_len, dtype=torch.float64, device=dev).view(1, -1) + 0.5)
    xmin = torch.trunc(centre - support + 0.5).long().clamp(min=0)  # C's (int64) cast truncates
    xsize = torch.minimum(torch.trunc(centre + support + 0.5).long(), size) - xmin
    xsize = torch.minimum(xsize.clamp(min=0), span)
    weights = []
    total = torch.zeros_like(centre)
    for j in range(taps):  # summed in the C loop's order
        w = _filter(((xmin + j).double() - centre + 0.5) * invscale, mode, -0.5, pil)
        w = torch.where(j < xsize, w, torch.zeros_like(w))
        weights.append(w)
        total = total + w
    stacked = torch.stack(weights, -1)
    stacked = torch.where((total != 0).unsqueeze(-1), stacked / total.unsqueeze(-1), stacked)
    return xmin, stacked, stacked.amax(dim=(1, 2)).clamp(min=0.0)


def _plain_weights(length: torch.Tensor, out_len: int, mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's ``_compute_indices_min_size_weights`` (antialias=False): 2 or 4 taps, the ones outside the
    image added onto the edge pixel's weight (the running sums count towards the largest weight, as in C)."""
    dev = length.device
    size = length.view(-1, 1)
    interp = 4 if mode == "bicubic" else 2
    half = interp // 2
    scale = size.double() / out_len
    real = scale * (torch.arange(out_len, dtype=torch.float64, device=dev).view(1, -1) + 0.5) - 0.5
    if mode != "bicubic":  # area_pixel_compute_source_index clamps at 0 for linear modes only
        real = real.clamp(min=0.0)
    index = torch.minimum(torch.floor(real.float()).long(), size - 1)  # guard_index_and_lambda: floorf
    lam = (real - index.double()).clamp(0.0, 1.0)
    unbound = index - half + 1
    xmin = unbound.clamp(min=0)
    xsize = (torch.minimum(index + half + 1, size) - xmin).clamp(0, interp)
    slots = torch.zeros(*real.shape, interp, dtype=torch.float64, device=dev)
    slot = torch.zeros_like(index)
    top = torch.zeros(real.shape[0], dtype=torch.float64, device=dev)
    for j in range(interp):
        w = _filter((j + 1 - half) - lam, mode, -0.75, False)
        pos = unbound + j
        slot = torch.where(pos <= 0, torch.zeros_like(slot), torch.where(pos >= size - 1, xsize - 1, slot))
        safe = slot.clamp(0, interp - 1).unsqueeze(-1)
        slots.scatter_add_(-1, safe, w.unsqueeze(-1))
        top = torch.maximum(top, slots.gather(-1, safe).squeeze(-1).amax(1))
        slot = slot + 1
    return xmin, slots, top


def _bits(top: torch.Tensor) -> torch.Tensor:
    """PyTorch's weights precision per sample: the most bits (up to 22) that keep the largest weight, doubled,
    under 2**15 (``_compute_index_ranges_int16_weights``)."""
    fits = [torch.floor(0.5 + top * float(1 << (p + 1))) < (1 << 15) for p in range(22)]
    return torch.stack(fits, -1).long().cumprod(-1).sum(-1)


def fixed_taps(
    start: torch.Tensor, length: torch.Tensor, out_len: int, antialias: bool, mode: str, kernel: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Box-relative source indices ``(N, out_len, K)`` (clamped into the box), integer weights ``(N, out_len, K)``
    (int32) and the bits to shift by ``(N,)`` of each box ``[start, start + length)`` resampled to ``out_len``.

    ``kernel``: "torch" (PyTorch's uint8 kernel, int16 weights) or "pil" (Pillow's, 22 bits; always antialiased).
    """
    pil = kernel == "pil"
    if antialias or pil:
        xmin, weights, top = _aa_weights(length, out_len, mode, pil)
    else:
        xmin, weights, top = _plain_weights(length, out_len, mode)
    bits = torch.full_like(top, _PIL_BITS, dtype=torch.long) if pil else _bits(top)
    scaled = weights * torch.pow(2.0, bits.double()).view(-1, 1, 1)
    # C: (v < 0) ? (int)(-0.5 + v) : (int)(0.5 + v), a cast that truncates
    ints = torch.where(scaled < 0, torch.trunc(scaled - 0.5), torch.trunc(scaled + 0.5)).to(torch.int32)
    k = xmin.unsqueeze(-1) + torch.arange(weights.shape[-1], device=start.device).view(1, 1, -1)
    last = length.view(-1, 1, 1) - 1
    return torch.minimum(k, last), ints, bits


def shift_clamp(acc: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``clamp((acc + 2**(bits-1)) >> bits, 0, 255)`` per sample (``acc``: int32, samples first): the C kernels'
    rounding of one pass back to uint8."""
    b = bits.to(torch.int32).view(-1, *([1] * (acc.dim() - 1)))
    return torch.bitwise_right_shift(acc + torch.bitwise_left_shift(torch.ones_like(b), b - 1), b).clamp_(0, 255)


@functools.cache
def _pillow_major() -> int:
    import PIL

    return int(PIL.__version__.split(".")[0])


def vertical_first(
    height: torch.Tensor, width: torch.Tensor, size: tuple[int, int], kernel: str
) -> torch.Tensor | None:
    """Per sample, whether the kernel resamples the box ``height x width`` to ``size`` vertically first; None when
    no sample does. Pillow 13 does when the height shrinks by more than twice what the width shrinks
    (``in_h - out_h > 2 * (in_w - out_w)``, height shrinking): the rule python-pillow #9549 states, checked
    against Pillow 13 on 1,479 random shapes and 3,689 small ones (tests/augment/test_fixed_point.py)."""
    if kernel != "pil" or _pillow_major() < 13:
        return None
    out_h, out_w = size
    return (height > out_h) & (height - out_h > 2 * (width - out_w))


def fixed_resized_crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    kernel: str,
) -> torch.Tensor:
    """Each uint8 sample's box resized to ``size`` as the ``kernel``'s C code does: a first pass (rounded,
    clamped to uint8), then the other. A pass whose length does not change has the weight 1 on one tap,
    which is the copy the C code makes instead. The samples Pillow resamples vertically first are run
    transposed (one more host read per batch, for PIL images off the CPU only)."""

    def run(idx: torch.Tensor | None, transposed: bool) -> torch.Tensor:
        if idx is None:
            return _two_passes(x, top, left, height, width, size, antialias, mode, kernel)
        part = x.index_select(0, idx)
        y0, x0, h, w = (b.index_select(0, idx) for b in (top, left, height, width))
        if transposed:  # the vertical pass first: the horizontal-first kernel on the transposed images
            done = _two_passes(part.transpose(2, 3), x0, y0, w, h, (size[1], size[0]), antialias, mode, kernel)
            return done.transpose(2, 3)
        return _two_passes(part, y0, x0, h, w, size, antialias, mode, kernel)

    vertical = vertical_first(height, width, size, kernel)
    return by_pass_order(vertical, (x.shape[0], x.shape[1], *size), x.device, run)


def by_pass_order(
    vertical: torch.Tensor | None,
    shape: tuple[int, ...],
    device: torch.device,
    run: Callable[[torch.Tensor | None, bool], torch.Tensor],
) -> torch.Tensor:
    """``run(None, False)`` when no sample is resampled vertically first (:func:`vertical_first`); else
    ``run(idx, transposed)`` on the samples of each pass order, each result put in its samples' places."""
    if vertical is None or not bool(vertical.any()):
        return run(None, False)
    out = torch.empty(shape, dtype=torch.uint8, device=device)
    for transposed, pick in ((False, ~vertical), (True, vertical)):
        idx = pick.nonzero().flatten()
        if idx.numel():
            out[idx.to(device)] = run(idx, transposed)
    return out


def _two_passes(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    kernel: str,
) -> torch.Tensor:
    """The horizontal pass (rounded, clamped), then the vertical one."""
    n, c, h, w = x.shape
    out_h, out_w = size
    ck, cw, cbits = fixed_taps(left, width, out_w, antialias, mode, kernel)
    rk, rw, rbits = fixed_taps(top, height, out_h, antialias, mode, kernel)
    src = x.to(torch.int32)
    cols = (left.view(n, 1, 1) + ck).view(n, 1, 1, out_w, -1)
    acc = torch.zeros(n, c, h, out_w, dtype=torch.int32, device=x.device)
    for k in range(cw.shape[-1]):
        idx = cols[..., k].expand(n, c, h, out_w)
        acc += cw[:, :, k].view(n, 1, 1, out_w) * src.gather(3, idx)
    rows_pass = shift_clamp(acc, cbits)
    rows = (top.view(n, 1, 1) + rk).view(n, 1, out_h, 1, -1)
    out = torch.zeros(n, c, out_h, out_w, dtype=torch.int32, device=x.device)
    for k in range(rw.shape[-1]):
        idx = rows[..., k].expand(n, c, out_h, out_w)
        out += rw[:, :, k].view(n, 1, out_h, 1) * rows_pass.gather(2, idx)
    return shift_clamp(out, rbits).to(torch.uint8)
