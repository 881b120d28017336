"""RandomResizedCrop, batched: a per-sample box resized to one output size by two matrix products.

Resizing a box of its own size for every sample cannot use one ``interpolate`` call. But bilinear
resampling is separable and linear: for each sample, ``out = Wy @ crop @ Wx.T`` with ``Wy``
(``out_h x H``) and ``Wx`` (``out_w x W``) holding the triangle-filter weights restricted to the
box. With the filter widened by the scale factor when shrinking (``antialias=True``) these are
exactly the weights of ``F.interpolate(..., mode="bilinear", antialias=True)``; with
``antialias=False``, those of plain bilinear. Two batched matmuls do the whole batch.

uint8 images are resampled by the kernel the user's pipeline runs (``kernel``): torchvision v1 goes
through float32 and rounds once ("float", the matmuls above); v2 on the CPU and Pillow run integer
kernels that round and clamp between the two passes ("torch", "pil": :mod:`.fixed_point`), which
differ from the float path by up to 35 levels in bicubic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy
import torch
from torchvision.transforms import InterpolationMode

from ..errors import ConfigError
from ..store.ragged import Ragged
from .fixed_point import KERNELS, by_pass_order, fixed_resized_crop, fixed_taps, shift_clamp, vertical_first
from .transforms import BatchTransform, Params, _pair

__all__ = ["RandomResizedCrop", "ragged_resized_crop", "resized_crop"]


def _weights(
    start: torch.Tensor, length: torch.Tensor, in_len: int, out_len: int, antialias: bool, mode: str = "bilinear"
) -> torch.Tensor:
    """``(N, out_len, in_len)`` resampling weights of the boxes ``[start, start + length)`` (:func:`_taps`, placed)."""
    k, w = _taps(start, length, out_len, antialias, mode)
    dense = torch.zeros(k.shape[0], out_len, in_len, dtype=torch.float32, device=start.device)
    return dense.scatter_add_(2, k + start.view(-1, 1, 1), w)


def resized_crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    size: tuple[int, int],
    antialias: bool = True,
    mode: str = "bilinear",
    kernel: str = "float",
) -> torch.Tensor:
    """Crop each sample's box and resize it to ``size`` with ``mode`` ("bilinear" or "bicubic") interpolation.

    Equals ``F.resized_crop(img, top, left, height, width, size, antialias=antialias)`` sample by
    sample: to float rounding for float input. uint8 input goes by ``kernel``: "float" is torchvision
    v1's (float32, rounded back: within one level of it), "torch" v2's on the CPU and "pil" Pillow's
    (both exact, :mod:`.fixed_point`; "pil" on the CPU calls Pillow itself).
    """
    if x.dtype == torch.uint8 and kernel != "float" and mode != "nearest":
        if x.device.type == "cpu" and (kernel == "torch" or x.shape[1] in (1, 3)):
            # On the CPU the library's own kernel per image is exact by definition, and faster than the batched
            # integer gathers (v2's uint8 resize: 6x at 256 crops of 32x32, 10x at 64 of 375x500 to 224; measured).
            boxes = torch.stack([top, left, height, width], 1).tolist()
            crops = [x[i, :, y0 : y0 + h, x0 : x0 + w] for i, (y0, x0, h, w) in enumerate(boxes)]
            return _resize_on_cpu(crops, x.shape[1], x.dtype, size, antialias, mode, kernel)
        return fixed_resized_crop(x, top, left, height, width, size, antialias, mode, kernel)
    n, c, h, w = x.shape
    wy = _weights(top, height, h, size[0], antialias, mode)
    wx = _weights(left, width, w, size[1], antialias, mode)
    work = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    out = torch.matmul(wy.to(work.dtype).unsqueeze(1), work)  # (N, C, out_h, W)
    out = torch.matmul(out, wx.to(work.dtype).transpose(1, 2).unsqueeze(1))  # (N, C, out_h, out_w)
    if x.dtype == torch.uint8:
        return out.round_().clamp_(0, 255).to(torch.uint8)
    return out.to(x.dtype)


def _resize_on_cpu(
    crops: Sequence[torch.Tensor],
    channels: int,
    dtype: torch.dtype,
    size: tuple[int, int],
    antialias: bool,
    mode: str,
    kernel: str,
) -> torch.Tensor:
    """Each ``(C, h, w)`` crop resized by the user's own library, stacked: exact by definition. torchvision v2's
    ``resize`` ("torch": its vectorised uint8 kernel, 30-50x faster than a batched gather on the CPU, fed
    channels-last), v1's ("float": through float32), or Pillow ("pil")."""
    from torchvision.transforms.functional import resize as v1_resize
    from torchvision.transforms.v2.functional import resize as v2_resize

    out = torch.empty((len(crops), channels, *size), dtype=dtype)
    uint8 = dtype == torch.uint8 and mode != "nearest"
    for i, crop in enumerate(crops):
        if uint8 and kernel == "pil" and channels in (1, 3):
            out[i] = _pil_resize(crop, size, mode)
            continue
        batch = crop.unsqueeze(0)
        if uint8 and kernel == "float":  # v1: through float32, rounded once
            out[i] = v1_resize(batch, list(size), interpolation=InterpolationMode(mode), antialias=antialias)[0]
            continue
        if dtype == torch.uint8:  # the uint8 kernel's fast path reads contiguous channels-last
            batch = batch.contiguous(memory_format=torch.channels_last)
        out[i] = v2_resize(batch, list(size), interpolation=InterpolationMode(mode), antialias=antialias)[0]
    return out


def _pil_resize(crop: torch.Tensor, size: tuple[int, int], mode: str) -> torch.Tensor:
    """One ``(C, h, w)`` uint8 crop (1 or 3 channels, on the CPU) resized by Pillow itself, as torchvision resizes a
    PIL image (``fixed_point`` computes the same integers where Pillow cannot run: on a GPU)."""
    import PIL.Image

    resample = PIL.Image.Resampling.BICUBIC if mode == "bicubic" else PIL.Image.Resampling.BILINEAR
    pixels = crop.permute(1, 2, 0).contiguous().numpy()
    image = PIL.Image.fromarray(pixels[..., 0] if crop.shape[0] == 1 else pixels)
    out = torch.from_numpy(numpy.array(image.resize((size[1], size[0]), resample)))
    return out.view(size[0], size[1], -1).permute(2, 0, 1)


def _cubic(t: torch.Tensor, a: float) -> torch.Tensor:
    """The cubic convolution kernel (Keys): ``a=-0.5`` in PyTorch's antialiased resize, ``-0.75`` in its plain one."""
    t = t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = (((t - 5) * t + 8) * t - 4) * a
    return torch.where(t < 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


@dataclass(frozen=True)
class RandomResizedCrop(BatchTransform):
    """torchvision's ``RandomResizedCrop`` (bilinear, bicubic or nearest), with a box drawn per sample; uint8 images
    resampled by ``kernel``, the one the user's pipeline runs (see the module docstring).

    Per sample, up to 10 (area, log aspect ratio) draws; the first box that fits is used, else the
    central crop of torchvision's fallback -- the same distribution as torchvision's loop.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    antialias: bool = True
    attempts: int = 10
    interpolation: str | tuple[str, ...] = "bilinear"  # several: one drawn per sample (timm's "random")
    kernel: str = "float"  # how uint8 is resampled: "float" (v1), "torch" (v2 on the CPU), "pil" (Pillow); KERNELS
    ragged_input = True  # images of different sizes: each box drawn from its own image's size
    one_size_output = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "size"))
        modes = (self.interpolation,) if isinstance(self.interpolation, str) else tuple(self.interpolation)
        if not modes or any(m not in ("bilinear", "bicubic", "nearest") for m in modes):
            raise ConfigError(
                f"interpolation={self.interpolation!r}: gpufeed batches 'bilinear', 'bicubic' and 'nearest'"
            )
        object.__setattr__(self, "interpolation", modes[0] if len(modes) == 1 else modes)
        if self.kernel not in KERNELS:
            raise ConfigError(f"kernel={self.kernel!r} must be one of {KERNELS}")
        if not (0 < self.scale[0] <= self.scale[1]):
            raise ConfigError(f"scale={self.scale!r} must satisfy 0 < min <= max")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigError(f"ratio={self.ratio!r} must satisfy 0 < min <= max")

    def sample(self, x: torch.Tensor | Ragged, generator: torch.Generator) -> Params:
        if isinstance(x, Ragged):  # each image's own size (the sizes live on the CPU)
            device = generator.device
            heights, widths = x.shapes[:, 1].to(device), x.shapes[:, 2].to(device)
        else:
            n, _, h, w = x.shape
            heights, widths, device = (
                torch.full((n,), h, device=x.device),
                torch.full((n,), w, device=x.device),
                x.device,
            )
        params = self.draw(heights, widths, generator, device)
        if not isinstance(self.interpolation, str):  # timm's random.choice of interpolation, per sample
            modes = len(self.interpolation)
            params["mode"] = torch.randint(modes, (heights.shape[0],), generator=generator, device=device)
        return params

    def draw(
        self, heights: torch.Tensor, widths: torch.Tensor, generator: torch.Generator, device: torch.device
    ) -> Params:
        """Boxes for images of these (per-sample) sizes, as torchvision's ``get_params`` draws them."""
        n = heights.shape[0]
        height, width = heights.view(-1, 1), widths.view(-1, 1)
        u = torch.rand((4, n, self.attempts), generator=generator, device=device, dtype=torch.float64)
        area = (height * width) * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[0])
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(lo + (hi - lo) * u[1])
        w = torch.round(torch.sqrt(area * aspect)).long()
        h = torch.round(torch.sqrt(area / aspect)).long()
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)
        h, w = h.gather(1, first).squeeze(1), w.gather(1, first).squeeze(1)
        top = (u[2, :, 0] * (heights - h + 1)).floor().long()
        left = (u[3, :, 0] * (widths - w + 1)).floor().long()
        # torchvision's fallback when no draw fits: the central crop at the nearest allowed ratio.
        fh, fw = _central_box(heights, widths, self.ratio)
        any_fit = fits.any(dim=1)
        return {
            "top": torch.where(any_fit, top, (heights - fh) // 2),
            "left": torch.where(any_fit, left, (widths - fw) // 2),
            "height": torch.where(any_fit, h, fh),
            "width": torch.where(any_fit, w, fw),
        }

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        return self.size  # type: ignore[return-value]

    def apply(self, x: torch.Tensor | Ragged, params: Params) -> torch.Tensor:
        p = params
        box = (p["top"], p["left"], p["height"], p["width"])
        if len(box[0]) == 0:  # an empty batch
            ragged = isinstance(x, Ragged)
            channels = (int(x.shapes[0, 0]) if len(x) else 3) if ragged else x.shape[1]  # type: ignore[union-attr]
            return torch.empty((0, channels, *self.size), dtype=x.dtype, device=x.device)  # type: ignore[misc]
        crop = ragged_resized_crop if isinstance(x, Ragged) else resized_crop
        if isinstance(self.interpolation, str):
            return crop(x, *box, self.size, self.antialias, self.interpolation, self.kernel)  # type: ignore[arg-type]
        out: torch.Tensor | None = None
        for k, mode in enumerate(self.interpolation):  # each interpolation on the samples that drew it
            idx = (p["mode"] == k).nonzero().flatten()
            if idx.numel() == 0:
                continue
            part = x.select(idx.cpu()) if isinstance(x, Ragged) else x.index_select(0, idx)
            t, left, h, w = (b.index_select(0, idx) for b in box)
            done = crop(part, t, left, h, w, self.size, self.antialias, mode, self.kernel)  # type: ignore[arg-type]
            if out is None:
                out = torch.empty((len(p["mode"]), *done.shape[1:]), dtype=done.dtype, device=done.device)
            out[idx.to(out.device)] = done
        assert out is not None
        return out


def _central_box(
    heights: torch.Tensor, widths: torch.Tensor, ratio: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's fallback box per sample: the whole image, narrowed to the nearest allowed ratio."""
    in_ratio = widths.double() / heights.double()
    lo, hi = min(ratio), max(ratio)
    narrow, wide = in_ratio < lo, in_ratio > hi
    fh = torch.where(narrow, torch.round(widths.double() / lo).long(), heights)
    fw = torch.where(wide, torch.round(heights.double() * hi).long(), widths)
    return fh, fw


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

    On the CPU each box goes through the user's own kernel (:func:`_resize_on_cpu`), exact. On a GPU one kernel
    per image would be launch-bound, so the batch is resampled together (:func:`_batched_ragged`).
    """
    if x.device.type == "cpu":
        boxes = torch.stack([top, left, height, width], 1).tolist()
        crops = [x.image(i)[:, y0 : y0 + h, x0 : x0 + w] for i, (y0, x0, h, w) in enumerate(boxes)]
        return _resize_on_cpu(crops, int(x.shapes[0, 0]), x.dtype, size, antialias, mode, kernel)
    return _batched_ragged(x, top, left, height, width, size, antialias, mode, kernel)


def _taps(
    start: torch.Tensor, length: torch.Tensor, out_len: int, antialias: bool, mode: str = "bilinear"
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
    taps = int(math.ceil(float(support.max()))) * 2 + 1
    first = torch.floor(centre - support + 0.5).long()
    k = first.unsqueeze(-1) + torch.arange(taps, device=dev).view(1, 1, -1)
    d = (k + 0.5 - centre.unsqueeze(-1)) / stretch.unsqueeze(-1)
    w = _cubic(d, -0.5) if mode == "bicubic" else (1 - d.abs()).clamp(min=0)
    w = w * ((k >= 0) & (k <= last))
    w = w / w.sum(-1, keepdim=True)
    return torch.minimum(k.clamp(min=0), last), w.to(torch.float32)


def _batched_ragged(
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
    ck, cw = _taps(left, width, out_w, antialias, mode)  # (N, out_w, Kc), box-relative
    rk, rw = _taps(top, height, out_h, antialias, mode)  # (N, out_h, Kr)
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
    """:func:`_batched_ragged` in the integers of torchvision v2's uint8 kernel or Pillow's (:mod:`.fixed_point`):
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
