"""RandomResizedCrop, batched: a box drawn per sample, resized to one output size.

The boxes are drawn as torchvision draws them; the resampling is :func:`gpufeed.augment.resample.resized_crop`
for a batch of one size and :func:`gpufeed.augment.ragged_resize.ragged_resized_crop` for images of different
sizes.

uint8 images are resampled by the kernel the user's pipeline runs (``kernel``): torchvision v1 goes
through float32 and rounds once ("float", two matrix products); v2 on the CPU and Pillow run integer
kernels that round and clamp between the two passes ("torch", "pil": :mod:`.fixed_point`), which
differ from the float path by up to 35 levels in bicubic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from ..store.ragged import Ragged
from .fixed_point import KERNELS
from .fusion import NotCompiled
from .params import Draws, check_finite, rand, randint, size_pair
from .paths import host_path
from .pillow_resize import pillow_resized
from .ragged_resize import ragged_resized_crop
from .resample import boxes, resized_crop
from .taps import fused_resized_crop
from .transforms import BatchTransform, Params

__all__ = ["RandomResizedCrop"]


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
    fuses_tail = True  # the flips and Normalize after it run with its resampling (apply_tail)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair(self.size, "size"))
        modes = (self.interpolation,) if isinstance(self.interpolation, str) else tuple(self.interpolation)
        if not modes or any(m not in ("bilinear", "bicubic", "nearest") for m in modes):
            raise ConfigError(
                f"interpolation={self.interpolation!r}: gpufeed batches 'bilinear', 'bicubic' and 'nearest'"
            )
        object.__setattr__(self, "interpolation", modes[0] if len(modes) == 1 else modes)
        if self.kernel not in KERNELS:
            raise ConfigError(f"kernel={self.kernel!r} must be one of {KERNELS}")
        check_finite(self.scale, "scale", "RandomResizedCrop")
        check_finite(self.ratio, "ratio", "RandomResizedCrop")
        if not (0 < self.scale[0] <= self.scale[1]):
            raise ConfigError(f"scale={self.scale!r} must satisfy 0 < min <= max")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ConfigError(f"ratio={self.ratio!r} must satisfy 0 < min <= max")

    def sample(self, x: torch.Tensor | Ragged, generator: Draws) -> Params:
        if isinstance(x, Ragged):  # each image's own size (the sizes live on the CPU); keyed: one id per image
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
            params["mode"] = randint(generator, 0, modes, (heights.shape[0],), device)
        return params

    def draw(self, heights: torch.Tensor, widths: torch.Tensor, generator: Draws, device: torch.device) -> Params:
        """Boxes for images of these (per-sample) sizes, as torchvision's ``get_params`` draws them."""
        n = heights.shape[0]
        height, width = heights.view(-1, 1), widths.view(-1, 1)
        u = rand(generator, (4, n, self.attempts), device, torch.float64, axis=1)
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

    def apply_tail(
        self, x: torch.Tensor | Ragged, params: Params, flips: Sequence[tuple[str, torch.Tensor]], normalize: Any
    ) -> torch.Tensor:
        """The boxes resized, flipped and normalised in one go where that runs (else ``NotCompiled``, before any
        work): on the CPU with the Pillow kernel, by Pillow, image by image on the usable cores; the float kernel
        on a batch of one size, compiled (.taps)."""
        p = params
        box = (p["top"], p["left"], p["height"], p["width"])
        mode = self.interpolation
        if len(box[0]) == 0 or x.dtype != torch.uint8 or not isinstance(mode, str) or mode == "nearest":
            raise NotCompiled
        channels = int(x.shapes[0, 0]) if isinstance(x, Ragged) else x.shape[1]
        if self.kernel == "pil" and host_path(x) and channels in (1, 3):
            return pillow_resized(boxes(x, *box), self.size, mode, flips, normalize)  # type: ignore[arg-type]
        if self.kernel == "float" and isinstance(x, torch.Tensor):
            return fused_resized_crop(x, *box, self.size, self.antialias, mode, flips, normalize)  # type: ignore[arg-type]
        raise NotCompiled

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
            if isinstance(part, Ragged):
                done = ragged_resized_crop(part, t, left, h, w, self.size, self.antialias, mode, self.kernel)  # type: ignore[arg-type]
            else:  # the interpolations compiled as one function (.taps.tables)
                size: tuple[int, int] = self.size  # type: ignore[assignment]  # a pair since __post_init__
                done = resized_crop(part, t, left, h, w, size, self.antialias, mode, self.kernel, self.interpolation)
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
