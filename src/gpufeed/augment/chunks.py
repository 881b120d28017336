"""Crops, flips and Normalize on the CPU near memory speed: whole rows gathered, a chunk of samples at a time.

On a GPU a batch is a handful of kernels (:mod:`gpufeed.augment.geometry`'s one gather, then
Normalize). On a CPU the same kernels slow down once a batch outgrows the cache (measured on 2
cores at 256x256, batch 256: the one gather reads an 8-byte index per output pixel, 134 MB of it,
and Normalize makes four passes over 200 MB of floats). Here:

- A crop or flip moves whole rows: the source rows are copied as rows (``index_select``), then the
  columns are read through one index per sample broadcast over the rows (a flip reverses it).
- The batch is processed a chunk of samples at a time, sized to the last-level cache: each chunk's
  crop lands in the output converted to float32, and Normalize runs on it while it is in the cache.

The arithmetic is unchanged (the same copies; Normalize in torchvision's order: ``/ 255``, ``- mean``,
``/ std`` in float32), so the output equals the unchunked ops bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from . import geometry as G

__all__ = [
    "FLIP_EACH_PIXELS",
    "cache_bytes",
    "chunk_samples",
    "normalize_chunked",
    "normalize_into",
    "remap_chunked",
    "remap_windows",
]


# Reversing the flipped samples' rows: one sample at a time from this many pixels per image, else all at once
# (index_select, flip, index_put). Measured per batch of 256 on 2 cores, uint8: 0.43 against 0.11 ms at 32x32,
# 0.41 against 0.32 at 64x64, 0.86 against 1.5 at 128x128, 1.2 against 7.5 at 256x256.
FLIP_EACH_PIXELS = 96 * 96


@functools.cache
def cache_bytes() -> int:
    """The CPU's last-level cache in bytes (Linux sysfs; 8 MiB where it cannot be read)."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind in ("Unified", "Data") and size[:-1].isdigit():
            best = max(best, int(size[:-1]) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0))
    return best or 8 << 20


def chunk_samples(bytes_per_sample: int) -> int:
    """Samples per chunk: a quarter of the last-level cache for a chunk's bytes (uint8 read, float32 written), at
    least one. Measured with a 32 MiB L3, batch 256: Normalize as fast with 6 to 12 MiB a chunk at 128x128 and
    256x256 and 20% slower with 50 MiB; with half the cache a chunk the loader was 10-15% slower there."""
    return max(1, (cache_bytes() // 4) // max(1, bytes_per_sample))


def normalize_into(
    out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reciprocal: bool
) -> torch.Tensor:
    """``out`` (float32) = ``(x / 255 - mean) / std`` for uint8 ``x``, in torchvision's order and precision.
    (``torch.div(x, 255, out=out)`` would fold the conversion into the division, but its mixed-dtype kernel
    is slower on the CPU than the plain converting copy and an in-place division: 23 against 18 ms a batch at
    256x256.)"""
    out.copy_(x)
    out.mul_(1.0 / 255) if reciprocal else out.div_(255)
    return out.sub_(mean).div_(std)


def normalize_chunked(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reciprocal: bool, dtype: torch.dtype
) -> torch.Tensor:
    """Normalize of a uint8 CPU batch, a chunk of samples at a time (see :func:`normalize_into`)."""
    k = chunk_samples(x[:1].numel() * 5)
    return _chunks(x.shape, dtype, k, lambda s, e: x[s:e], (mean, std, reciprocal, dtype))


def remap_chunked(
    x: torch.Tensor,
    m: G.IndexMap,
    fill: torch.Tensor | None,
    normalize: tuple[torch.Tensor, torch.Tensor, bool, torch.dtype] | None = None,
) -> torch.Tensor:
    """:func:`gpufeed.augment.geometry.remap` on a CPU batch (whole-row windows, :func:`remap_windows`), a chunk
    of samples at a time; then, if given, ``normalize = (mean, std, reciprocal, dtype)`` on each chunk while it is
    in the cache (uint8 ``x``: converted to float32 as it is copied into the output, normalised in place)."""
    n, c = x.shape[:2]
    out_h = m.rows.shape[1] if m.rows is not None else x.shape[2]
    out_w = m.cols.shape[1] if m.cols is not None else x.shape[3]
    k = chunk_samples(c * out_h * out_w * (x.element_size() + (4 if normalize is not None else 0)))
    if normalize is None and k >= n:
        return remap_windows(x, m, fill)
    shape = (n, c, out_h, out_w)
    dtype = normalize[3] if normalize is not None else x.dtype
    return _chunks(shape, dtype, k, lambda s, e: remap_windows(x[s:e], _slice(m, s, e), fill), normalize)


def _chunks(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    k: int,
    part: Callable[[int, int], torch.Tensor],
    normalize: tuple[torch.Tensor, torch.Tensor, bool, torch.dtype] | None,
) -> torch.Tensor:
    """The batch of ``shape`` and ``dtype`` made ``k`` samples at a time: ``part(s, e)`` is samples ``s:e`` (uint8 when
    normalised), copied into the output, and normalised there while in the cache. A non-float32 output is
    normalised in a float32 chunk first, then cast, as Normalize computes it."""
    n = shape[0]
    out = torch.empty(shape, dtype=dtype)
    work = None
    if normalize is not None and normalize[3] != torch.float32:
        work = torch.empty((min(k, n), *shape[1:]), dtype=torch.float32)
    for s in range(0, n, k):
        e = min(n, s + k)
        if normalize is None:
            out[s:e] = part(s, e)
            continue
        target = out[s:e] if work is None else work[: e - s]
        normalize_into(target, part(s, e), *normalize[:3])
        if work is not None:
            out[s:e] = target
    return out


def remap_windows(x: torch.Tensor, m: G.IndexMap, fill: torch.Tensor | None) -> torch.Tensor:
    """``geometry.remap(x, m)`` for a map whose columns are, per sample, one run of source columns forward or
    reversed (crops with constant padding, flips; rows may be any map): each output row is one window of the
    flat batch (``unfold``), copied by one ``index_select``, the reversed samples flipped after. Other maps
    (reflected columns) and non-contiguous batches take :func:`geometry.remap` with rows first."""
    n, c, h, w = x.shape
    out_h = m.rows.shape[1] if m.rows is not None else h
    cols, ins = m.cols, m.cols_in
    if cols is None:
        cols = torch.arange(w, device=x.device).expand(n, w)
    out_w = cols.shape[1]
    if not x.is_contiguous() or x.numel() < out_w:
        return G.remap(x, m, fill, rows_first=True)
    k = torch.arange(out_w, device=x.device).view(1, out_w)
    inside = ins if ins is not None else torch.ones_like(cols, dtype=torch.bool)
    first = inside.to(torch.uint8).argmax(1, keepdim=True)
    forward, backward = cols - k, cols + k - (out_w - 1)  # a run's window start, read either way
    f0, b0 = forward.gather(1, first), backward.gather(1, first)
    is_forward = ((forward == f0) | ~inside).all(1)
    if not bool((is_forward | ((backward == b0) | ~inside).all(1)).all()):
        return G.remap(x, m, fill, rows_first=True)
    start_col = torch.where(is_forward, f0.view(-1), b0.view(-1))
    src_rows = torch.arange(n * c, device=x.device).view(n, c, 1) * h
    src_rows = src_rows + (m.rows.view(n, 1, out_h) if m.rows is not None else torch.arange(h, device=x.device))
    start = (src_rows * w + start_col.view(n, 1, 1)).view(-1)
    last = x.numel() - out_w
    clamped = start.clamp(0, last)
    out = x.view(-1).unfold(0, out_w, 1).index_select(0, clamped).view(n, c, out_h, out_w)
    edge = (start != clamped).nonzero().view(-1)  # a window past either end of the batch: at most a few rows
    if edge.numel():
        sample = torch.div(edge, c * out_h, rounding_mode="floor")
        columns = (start_col[sample].view(-1, 1) + k).clamp(0, w - 1)
        rows2d = out.view(-1, out_w)
        rows2d[edge] = x.view(n * c * h, w)[src_rows.view(-1)[edge]].gather(1, columns)
    flipped = (~is_forward).nonzero().view(-1)
    if flipped.numel() and out_h * out_w >= FLIP_EACH_PIXELS:
        for i in flipped.tolist():
            out[i] = out[i].flip(-1)
    elif flipped.numel():
        out[flipped] = out.index_select(0, flipped).flip(-1)
    return G.fill_padding(out, x, m, fill)


def _slice(m: G.IndexMap, s: int, e: int) -> G.IndexMap:
    part = lambda t: t[s:e] if t is not None else None  # noqa: E731
    return G.IndexMap(part(m.rows), part(m.cols), part(m.rows_in), part(m.cols_in), m.fill)
