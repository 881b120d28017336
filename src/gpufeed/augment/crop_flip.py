"""The crops and flips: geometric ops that only move pixels, which :class:`~gpufeed.augment.transforms.Compose`
fuses into one gather (``RandomCrop``, ``RandomHorizontalFlip``, ``RandomVerticalFlip``), with torchvision's
semantics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import ConfigError
from . import functional as F
from . import geometry as G
from .params import Draws, check_probability, rand, randint, size_pair
from .transforms import GeometricTransform, Params

__all__ = ["RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip"]


@dataclass(frozen=True)
class RandomCrop(GeometricTransform):
    """Pad, then crop ``size`` at an offset drawn uniformly per sample (torchvision semantics).

    Offsets are uniform over ``[0, H + pad_top + pad_bottom - h]`` inclusive on each axis,
    independently per sample. ``fill`` is in the input's value space (0 pads black on uint8).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> RandomCrop(32, padding=4)(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), generator=g).shape
        torch.Size([8, 3, 32, 32])
    """

    size: int | tuple[int, int]
    padding: int | Sequence[int] | None = None
    pad_if_needed: bool = False
    fill: float | Sequence[float] = 0
    padding_mode: Literal["constant", "edge", "reflect", "symmetric"] = "constant"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair(self.size, "size"))
        pad = self.padding
        if pad is None:
            pad = (0, 0, 0, 0)
        elif isinstance(pad, int):
            pad = (pad,) * 4
        else:
            pad = tuple(pad)
            if len(pad) == 1:  # torchvision accepts [p] for p on every side
                pad = pad * 4
            elif len(pad) == 2:  # torchvision: (left/right, top/bottom)
                pad = (pad[0], pad[1], pad[0], pad[1])
        if len(pad) != 4 or not all(isinstance(p, int) for p in pad):
            raise ConfigError(f"padding={self.padding!r} must be an int or 2 or 4 ints (left, top, right, bottom)")
        if min(pad) < 0:
            raise ConfigError(f"padding={self.padding!r} must be >= 0")
        object.__setattr__(self, "padding", pad)
        if self.padding_mode not in F.PADDING_MODES:
            raise ConfigError(f"padding_mode={self.padding_mode!r} must be one of {F.PADDING_MODES}")

    def resolved_padding(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """Padding stages (left, top, right, bottom) for an input of this size, in torchvision's order.

        With ``pad_if_needed`` torchvision pads a second time (width, then height) when the padded
        image is still smaller than ``size``; for reflect modes the stages do not merge into one.
        """
        stages = [self.padding]
        left, top, right, bottom = self.padding  # type: ignore[misc]
        h, w = self.size  # type: ignore[misc]
        if self.pad_if_needed and width + left + right < w:
            extra = w - (width + left + right)
            stages.append((extra, 0, extra, 0))
        if self.pad_if_needed and height + top + bottom < h:
            extra = h - (height + top + bottom)
            stages.append((0, extra, 0, extra))
        return stages  # type: ignore[return-value]

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        return self.size  # type: ignore[return-value]

    def draw(self, n: int, height: int, width: int, device: torch.device, generator: Draws) -> Params:
        stages = self.resolved_padding(height, width)
        h, w = self.size  # type: ignore[misc]
        ph = height + sum(p[1] + p[3] for p in stages)
        pw = width + sum(p[0] + p[2] for p in stages)
        if ph < h or pw < w:
            raise ConfigError(
                f"size={self.size} is larger than the padded image ({ph}, {pw}); increase padding or set pad_if_needed"
            )
        return {
            "top": randint(generator, 0, ph - h + 1, (n,), device),
            "left": randint(generator, 0, pw - w + 1, (n,), device),
        }

    def index_map(self, params: Params, height: int, width: int) -> G.IndexMap:
        stages = self.resolved_padding(height, width)
        size: tuple[int, int] = self.size  # type: ignore[assignment]  # a pair since __post_init__
        return G.crop_map(params["top"], params["left"], size, (height, width), stages, self.padding_mode, self.fill)


@dataclass(frozen=True)
class RandomHorizontalFlip(GeometricTransform):
    """Mirror the width axis of each sample with probability ``p``, independently."""

    p: float = 0.5
    flips = "cols"  # the axis it mirrors: a resize before it can read its taps in reverse instead (.taps)

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_probability(self.p))

    def draw(self, n: int, height: int, width: int, device: torch.device, generator: Draws) -> Params:
        return {"mask": rand(generator, (n,), device) < self.p}

    def index_map(self, params: Params, height: int, width: int) -> G.IndexMap:
        return G.flip_map(params["mask"], width, "cols")


@dataclass(frozen=True)
class RandomVerticalFlip(RandomHorizontalFlip):
    """Mirror the height axis of each sample with probability ``p``, independently."""

    flips = "rows"

    def index_map(self, params: Params, height: int, width: int) -> G.IndexMap:
        return G.flip_map(params["mask"], height, "rows")
