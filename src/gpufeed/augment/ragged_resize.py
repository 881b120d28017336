"""Resized crops of ragged batches (images of different sizes in one flat buffer) to one output size.

On the CPU each box goes through the user's own kernel, exact; on a GPU the batch is resampled together, a
horizontal pass gathering each crop row's taps from the flat buffer, then a vertical one (:func:`batched_ragged`),
in float or in the integers of torchvision v2's uint8 kernel or Pillow's (:mod:`.fixed_point`).
"""

from __future__ import annotations

import torch

from ..store.ragged import Ragged
from .fixed_point import by_pass_order, fixed_taps, shift_clamp, vertical_first
from .paths import host_path
from .resample import boxes, resize_on_cpu
from .taps import resample_taps

__all__ = ["batched_ragged", "ragged_resized_crop"]


def ragged_resized_crop(
    x: Ragged,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool = True,
    mode: str = "bilinear",
    kernel: str = "float",
) -> torch.Tensor:
    """Each image's box resized to ``size``, stacked: ``(N, C, *size)``, as torchvision computes it.

    On the CPU each box goes through the user's own kernel (:func:`resize_on_cpu`), exact. On a GPU one kernel
    per image would be launch-bound, so the batch is resampled together (:func:`batched_ragged`).
    """
    if host_path(x):
        crops = boxes(x, top, left, height, width)
        return resize_on_cpu(crops, int(x.shapes[0, 0]), x.dtype, size, antialias, mode, kernel)
    return batched_ragged(x, top, left, height, width, size, antialias, mode, kernel)


def batched_ragged(
    x: Ragged,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str = "bilinear",
    kernel: str = "float",
) -> torch.Tensor:
    """The whole ragged batch in a few kernels: a horizontal pass gathering each crop row's taps from the
    flat buffer into an ``(N, C, Hmax, out_w)`` tensor, then a vertical pass gathering rows of that.
    Equals torchvision's float kernel to float rounding; uint8 is rounded back (within one level of
    v1), or with ``kernel`` "torch" or "pil" computed in their integers, each pass rounded and clamped."""
    if x.dtype == torch.uint8 and kernel != "float" and mode != "nearest":
        return _fixed_ragged(x, top, left, height, width, size, antialias, mode, kernel)
    dev, n = x.device, len(x)
    c = int(x.shapes[0, 0])
    out_h, out_w = size
    top, left, height, width = (t.to(dev) for t in (top, left, height, width))
    starts, img_h, img_w = x.starts.to(dev), x.shapes[:, 1].to(dev), x.shapes[:, 2].to(dev)
    # Element strides of channel, row and column in each image's packing (channels-last or -first).
    ch_step = torch.ones_like(img_w) if x.hwc else img_h * img_w
    row_step = img_w * c if x.hwc else img_w
    col_step = c if x.hwc else 1
    ck, cw = resample_taps(left, width, out_w, antialias, mode)  # (N, out_w, Kc), box-relative
    rk, rw = resample_taps(top, height, out_h, antialias, mode)  # (N, out_h, Kr)
    rows_max = int(height.max())  # one host read per batch: the intermediate's size
    r = torch.arange(rows_max, device=dev).view(1, rows_max, 1)
    rows = top.view(n, 1, 1) + torch.minimum(r, height.view(n, 1, 1) - 1)  # (N, Hmax, 1) absolute rows
    row_base = starts.view(n, 1, 1) + rows * row_step.view(n, 1, 1) + left.view(n, 1, 1) * col_step
    work = torch.float32
    tmp = torch.zeros(n, c, rows_max, out_w, device=dev, dtype=work)
    for ch in range(c):
        base = row_base + ch * ch_step.view(n, 1, 1)
        for k in range(ck.shape[-1]):
            idx = base + ck[:, :, k].view(n, 1, out_w) * col_step
            tmp[:, ch] += cw[:, :, k].view(n, 1, out_w) * x.data[idx].to(work)
    out = torch.zeros(n, c, out_h, out_w, device=dev, dtype=work)
    for k in range(rk.shape[-1]):
        idx = rk[:, :, k].view(n, 1, out_h, 1).expand(n, c, out_h, out_w)
        out += rw[:, :, k].view(n, 1, out_h, 1) * tmp.gather(2, idx)
    if x.dtype == torch.uint8:
        return out.round_().clamp_(0, 255).to(torch.uint8)
    return out.to(x.dtype)


def _fixed_ragged(
    x: Ragged,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    kernel: str,
) -> torch.Tensor:
    """:func:`batched_ragged` in the integers of torchvision v2's uint8 kernel or Pillow's (:mod:`.fixed_point`):
    the first pass rounded and clamped to 0-255 before the second, as theirs are; the samples Pillow resamples
    vertically first run transposed (``fixed_point.vertical_first``)."""

    def run(idx: torch.Tensor | None, transposed: bool) -> torch.Tensor:
        if idx is None:
            return _fixed_ragged_passes(x, top, left, height, width, size, antialias, mode, kernel, False)
        y0, x0, h, w = (b.index_select(0, idx.to(b.device)) for b in (top, left, height, width))
        return _fixed_ragged_passes(x.select(idx.cpu()), y0, x0, h, w, size, antialias, mode, kernel, transposed)

    vertical = vertical_first(height, width, size, kernel)
    return by_pass_order(vertical, (len(x), int(x.shapes[0, 0]), *size), x.device, run)


def _fixed_ragged_passes(
    x: Ragged,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    kernel: str,
    transposed: bool,
) -> torch.Tensor:
    """The horizontal pass, then the vertical one; ``transposed``: each image read as its transpose (rows and
    columns swapped by their strides), so the vertical pass comes first."""
    dev, n = x.device, len(x)
    c = int(x.shapes[0, 0])
    top, left, height, width = (t.to(dev) for t in (top, left, height, width))
    starts, img_h, img_w = x.starts.to(dev), x.shapes[:, 1].to(dev), x.shapes[:, 2].to(dev)
    ch_step = torch.ones_like(img_w) if x.hwc else img_h * img_w
    row_step = img_w * c if x.hwc else img_w
    col_step = torch.full_like(img_w, c if x.hwc else 1)
    out_h, out_w = size
    if transposed:
        row_step, col_step, top, left, height, width = col_step, row_step, left, top, width, height
        out_h, out_w = out_w, out_h
    ck, cw, cbits = fixed_taps(left, width, out_w, antialias, mode, kernel)
    rk, rw, rbits = fixed_taps(top, height, out_h, antialias, mode, kernel)
    rows_max = int(height.max())  # one host read per batch: the intermediate's size
    r = torch.arange(rows_max, device=dev).view(1, rows_max, 1)
    rows = top.view(n, 1, 1) + torch.minimum(r, height.view(n, 1, 1) - 1)
    row_base = starts.view(n, 1, 1) + rows * row_step.view(n, 1, 1) + left.view(n, 1, 1) * col_step.view(n, 1, 1)
    tmp = torch.zeros(n, c, rows_max, out_w, device=dev, dtype=torch.int32)
    for ch in range(c):
        base = row_base + ch * ch_step.view(n, 1, 1)
        for k in range(ck.shape[-1]):
            idx = base + ck[:, :, k].view(n, 1, out_w) * col_step.view(n, 1, 1)
            tmp[:, ch] += cw[:, :, k].view(n, 1, out_w) * x.data[idx].to(torch.int32)
    tmp = shift_clamp(tmp, cbits)
    out = torch.zeros(n, c, out_h, out_w, device=dev, dtype=torch.int32)
    for k in range(rk.shape[-1]):
        idx = rk[:, :, k].view(n, 1, out_h, 1).expand(n, c, out_h, out_w)
        out += rw[:, :, k].view(n, 1, out_h, 1) * tmp.gather(2, idx)
    out8 = shift_clamp(out, rbits).to(torch.uint8)
    return out8.transpose(2, 3).contiguous() if transposed else out8
