"""MixUp and CutMix on whole batches, as torchvision v2 applies them: one lambda per batch.

Each batch is mixed with itself rolled by one sample; the labels become soft targets
``(N, num_classes)`` mixed by the same lambda (CutMix: by the box's share of the image). The loader
applies them after the per-sample ops, to each batch it yields, drawing lambda (and CutMix's box)
from a stream derived from its seed, epoch, rank and batch number, so that a resumed epoch mixes
exactly as the uninterrupted one. ``lambda ~ Beta(alpha, alpha)`` (torchvision's Dirichlet of two).

They stay batch-level under keyed draws too (:class:`~gpufeed.augment.keyed.KeyedDraws`): a mix pairs each sample
with its neighbour in the batch and shares one lambda among all of them, so what a sample becomes depends on its
companions by definition and cannot be keyed per sample; a run resumed at another world size mixes differently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf

from ..errors import ConfigError

__all__ = ["CutMix", "MixChoice", "MixUp", "as_mix"]


def _soft(labels: torch.Tensor, num_classes: int | None, lam: float) -> torch.Tensor:
    """torchvision's ``_mixup_label``: one-hot (float), then ``rolled * (1 - lam) + labels * lam``."""
    if labels.ndim == 1:
        if num_classes is None:
            raise ConfigError("num_classes is needed to mix index labels (torchvision's MixUp/CutMix need it too)")
        labels = nnf.one_hot(labels, num_classes=num_classes)
    if not labels.dtype.is_floating_point:
        labels = labels.float()
    return labels.roll(1, 0).mul_(1.0 - lam).add_(labels.mul(lam))


@dataclass(frozen=True)
class _BatchMix:
    """What MixUp and CutMix share: ``alpha`` of the Beta draw, ``num_classes`` of the soft labels, and a call
    that draws the batch's parameters, then applies them."""

    alpha: float = 1.0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 0 < self.alpha < float("inf"):  # NaN too
            raise ConfigError(f"{name}: alpha={self.alpha} must be a finite number > 0 (the Beta draw's concentration)")
        if self.num_classes is not None and self.num_classes < 1:
            raise ConfigError(f"{name}: num_classes={self.num_classes} must be >= 1")

    def sample(self, x: torch.Tensor, rng: np.random.Generator) -> dict[str, Any]:
        raise NotImplementedError

    def apply(self, x: torch.Tensor, y: torch.Tensor, params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.apply(x, y, self.sample(x, rng))


@dataclass(frozen=True)
class MixUp(_BatchMix):
    """torchvision v2's ``MixUp``: ``x * lam + roll(x, 1) * (1 - lam)``, labels alike."""

    def sample(self, x: torch.Tensor, rng: np.random.Generator) -> dict[str, Any]:
        return {"lam": float(rng.beta(self.alpha, self.alpha))}

    def apply(self, x: torch.Tensor, y: torch.Tensor, params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        lam = params["lam"]
        return x.roll(1, 0).mul_(1.0 - lam).add_(x.mul(lam)), _soft(y, self.num_classes, lam)


@dataclass(frozen=True)
class CutMix(_BatchMix):
    """torchvision v2's ``CutMix``: a box of ``roll(x, 1)`` pasted into every image, labels mixed by its area."""

    def sample(self, x: torch.Tensor, rng: np.random.Generator) -> dict[str, Any]:
        lam = float(rng.beta(self.alpha, self.alpha))
        h, w = x.shape[-2], x.shape[-1]
        r_x, r_y = int(rng.integers(w)), int(rng.integers(h))
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * w), int(r * h)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, w), min(r_y + r_h_half, h)
        return {"box": (x1, y1, x2, y2), "lam_adjusted": float(1.0 - (x2 - x1) * (y2 - y1) / (w * h))}

    def apply(self, x: torch.Tensor, y: torch.Tensor, params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        x1, y1, x2, y2 = params["box"]
        out = x.clone()
        out[..., y1:y2, x1:x2] = x.roll(1, 0)[..., y1:y2, x1:x2]
        return out, _soft(y, self.num_classes, params["lam_adjusted"])


@dataclass(frozen=True)
class MixChoice:
    """One of ``mixes`` per batch (torchvision's ``RandomChoice([MixUp(...), CutMix(...)])``), weighted by ``p``."""

    mixes: tuple[MixUp | CutMix, ...]
    p: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not self.mixes or (self.p is not None and (len(self.p) != len(self.mixes) or min(self.p) < 0)):
            raise ConfigError(f"MixChoice: {len(self.mixes)} mixes and p={self.p!r}: one weight >= 0 per mix")

    def __call__(self, x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        p = np.asarray(self.p or [1.0] * len(self.mixes), dtype=np.float64)
        return self.mixes[int(rng.choice(len(self.mixes), p=p / p.sum()))](x, y, rng)


def as_mix(mix: Any, num_classes: int | None) -> MixUp | CutMix | MixChoice | None:
    """gpufeed's mix for ``mix``: gpufeed's own, or torchvision v2's ``MixUp``, ``CutMix`` or a
    ``RandomChoice`` of them (its ``num_classes``, else ``num_classes`` from the dataset)."""
    if mix is None:
        return None
    if isinstance(mix, (MixUp, CutMix)):
        return replace(mix, num_classes=num_classes) if mix.num_classes is None and num_classes else mix
    if isinstance(mix, MixChoice):
        return replace(mix, mixes=tuple(as_mix(m, num_classes) for m in mix.mixes))  # type: ignore[misc]
    import torchvision.transforms.v2 as v2

    def one(op: Any) -> MixUp | CutMix:
        if type(op) not in (v2.MixUp, v2.CutMix):
            raise ConfigError(f"mix={op!r}: gpufeed mixes batches with MixUp or CutMix (gpufeed's or torchvision v2's)")
        alpha = float(op.alpha)
        classes = op.num_classes if op.num_classes is not None else num_classes
        return (MixUp if type(op) is v2.MixUp else CutMix)(alpha, classes)

    if isinstance(mix, v2.RandomChoice):
        weights: Sequence[float] | None = mix.p
        return MixChoice(tuple(one(op) for op in mix.transforms), tuple(weights) if weights is not None else None)
    return one(mix)
