"""AutoAugment, RandAugment, TrivialAugmentWide and AugMix, batched: ops drawn per sample, each run once per batch.

torchvision draws, per image, which op to apply and at which magnitude and sign, then runs that
op's tensor kernel on the one image. Here every sample draws the same way (same op table, same
magnitude bins, same signs; from the loader's generator), then the batch is split by op and each
op runs once on its subset (:func:`gpufeed.augment.auto_ops.apply_op`, which holds the op tables and
kernels). AugMix mixes chains of such rounds with Dirichlet weights. Given the same op and
magnitude, each kernel follows torchvision's tensor kernel (``transforms.functional``) step for
step -- the same inverse affine matrix and sampling grid, the same blend, blur, histogram and
look-up table -- so uint8 outputs are equal (tests/augment/test_auto.py). On PIL images torchvision runs
PIL's kernels instead; with ``pil=True`` each op computes those (:mod:`gpufeed.augment.pil`), equal too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ConfigError
from .auto_fused import apply_op
from .auto_ops import OPS, SIGNED, augmix_table, magnitude_table
from .channels import refusal_words
from .params import Draws, fill_tuple, rand, randint, randn, spawn
from .transforms import BatchTransform, Params

__all__ = [
    "AugMix",
    "AutoAugment",
    "RandAugment",
    "TrivialAugmentWide",
    "dirichlet",
    "policies",
]


def _check_uint8(x: torch.Tensor, op: str) -> None:
    if x.dtype != torch.uint8:
        raise ConfigError(
            f"{op} runs on uint8 images, as torchvision's tensor kernels require (posterize and equalize are "
            f"defined on 0-255 levels); this batch is {x.dtype}: put it before ToTensor/ToDtype"
        )


def _check_channels(x: torch.Tensor, op: str, pil: bool = False, v2: bool = False) -> None:
    """Every policy's colour ops take 1 or 3 channels wherever torchvision runs them (a PIL image, a v1 or v2
    tensor: :func:`gpufeed.augment.channels.refusal_words`), and raise on every sample that draws one: refused
    for the whole batch, before any draw, so that no batch runs only because its draws missed them."""
    c = x.shape[1]
    if c in (1, 3):
        return
    said = (refusal_words(op, None, c, pil, v2) if pil or v2 else None) or (
        f"TypeError: 'Input image tensor permitted channel values are [1, 3], but found {c}' on every sample that "
        "draws Brightness, Color, Contrast, Sharpness, Posterize, Solarize, AutoContrast, Equalize or Invert"
    )
    keep = "x[:, :3]" if c > 3 else "x[:, :1]"
    raise ConfigError(
        f"{op} on {c}-channel images: torchvision refuses it ({said}); it takes images of 1 or 3 channels: drop the "
        f"extra channels ({keep}; an alpha channel is not a colour) or convert the images to RGB or L "
        "(image.convert('RGB')) before they are stored"
    )


def _check_mode(interpolation: str) -> None:
    if interpolation not in ("nearest", "bilinear"):
        raise ConfigError(f"interpolation={interpolation!r}: gpufeed batches 'nearest' and 'bilinear'")


def _signs(n: int, ops: torch.Tensor, generator: Draws) -> torch.Tensor:
    """-1 or +1 per sample (a fair coin, drawn for every sample), +1 for the ops without a sign."""
    coin = randint(generator, 0, 2, (n,), ops.device)
    signed = torch.isin(ops, torch.tensor([OPS.index(s) for s in SIGNED], device=ops.device))
    return torch.where(signed & (coin == 1), -1.0, 1.0).to(torch.float64)


@dataclass(frozen=True)
class TrivialAugmentWide(BatchTransform):
    """torchvision's ``TrivialAugmentWide``: per sample one of 14 ops, a uniform magnitude bin and sign."""

    num_magnitude_bins: int = 31
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    v2_thresholds: bool = False  # v2's: solarize thresholds (see magnitude_table), on PIL its affine matrices
    pil: bool = False  # torchvision's PIL kernels (see apply_op)

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        if self.num_magnitude_bins < 2:
            raise ConfigError(f"num_magnitude_bins={self.num_magnitude_bins} must be >= 2")
        object.__setattr__(self, "fill", fill_tuple(self.fill))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        _check_channels(x, "TrivialAugmentWide", self.pil, self.v2_thresholds)
        _check_uint8(x, "TrivialAugmentWide")
        n, dev = x.shape[0], x.device
        op = randint(generator, 0, 14, (n,), dev)
        bins = randint(generator, 0, self.num_magnitude_bins, (n,), dev)
        table = magnitude_table(
            "wide", self.num_magnitude_bins, x.shape[2], x.shape[3], OPS[:14], self.v2_thresholds, dev
        )
        return {"op": op, "magnitude": table[op, bins] * _signs(n, op, generator)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return apply_op(
            x, params["op"], params["magnitude"], self.fill, self.interpolation, self.pil, self.v2_thresholds
        )


@dataclass(frozen=True)
class RandAugment(BatchTransform):
    """torchvision's ``RandAugment``: ``num_ops`` rounds, each a uniform op of 14 per sample at bin
    ``magnitude`` of ``num_magnitude_bins``, with a random sign."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    v2_thresholds: bool = False
    pil: bool = False

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        if self.num_ops < 0 or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ConfigError(
                f"num_ops={self.num_ops} must be >= 0 and magnitude={self.magnitude} a bin in "
                f"[0, num_magnitude_bins={self.num_magnitude_bins})"
            )
        object.__setattr__(self, "fill", fill_tuple(self.fill))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        _check_channels(x, "RandAugment", self.pil, self.v2_thresholds)
        _check_uint8(x, "RandAugment")
        n, dev = x.shape[0], x.device
        table = magnitude_table(
            "rand", self.num_magnitude_bins, x.shape[2], x.shape[3], OPS[:14], self.v2_thresholds, dev
        )
        rounds = []
        for _ in range(self.num_ops):
            op = randint(generator, 0, 14, (n,), dev)
            rounds.append((op, table[op, self.magnitude] * _signs(n, op, generator)))
        return {"rounds": rounds}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for op, magnitude in params["rounds"]:
            x = apply_op(x, op, magnitude, self.fill, self.interpolation, self.pil, self.v2_thresholds)
        return x


def policies(policy: str) -> tuple[tuple[tuple[str, float, int | None], ...], ...]:
    """AutoAugment's learned sub-policies for ``policy`` ("imagenet", "cifar10", "svhn"), read from torchvision
    (``((op, probability, magnitude bin), (op, probability, magnitude bin)), ...``)."""
    from torchvision.transforms import AutoAugment as TVAutoAugment
    from torchvision.transforms import AutoAugmentPolicy

    names = [p.value for p in AutoAugmentPolicy]
    if policy not in names:
        raise ConfigError(f"policy={policy!r} must be one of {names}")
    return tuple(tuple(tuple(step) for step in sub) for sub in TVAutoAugment(AutoAugmentPolicy(policy)).policies)


@dataclass(frozen=True)
class AutoAugment(BatchTransform):
    """torchvision's ``AutoAugment``: per sample one of the policy's sub-policies (uniform), each of its two
    ops applied with its probability, at its magnitude bin of 10, with a random sign."""

    policy: str = "imagenet"
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    v2_thresholds: bool = False
    pil: bool = False
    _rows: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        pol = policies(self.policy)
        object.__setattr__(self, "fill", fill_tuple(self.fill))
        ops = torch.tensor([[OPS.index(step[0]) for step in sub] for sub in pol])  # (P, 2)
        probs = torch.tensor([[step[1] for step in sub] for sub in pol], dtype=torch.float64)
        bins = torch.tensor([[step[2] if step[2] is not None else 0 for step in sub] for sub in pol])
        object.__setattr__(self, "_rows", (ops, probs, bins))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        _check_channels(x, "AutoAugment", self.pil, self.v2_thresholds)
        _check_uint8(x, "AutoAugment")
        n, dev = x.shape[0], x.device
        ops, probs, bins = (t.to(dev) for t in self._rows)
        table = magnitude_table("auto", 10, x.shape[2], x.shape[3], OPS, self.v2_thresholds, dev)
        which = randint(generator, 0, len(ops), (n,), dev)
        chance = rand(generator, (n, 2), dev, torch.float64)
        rounds = []
        for j in range(2):
            op = ops[which, j]
            magnitude = table[op, bins[which, j]] * _signs(n, op, generator)
            apply = chance[:, j] <= probs[which, j]  # torchvision: if probs[i] <= p
            rounds.append((torch.where(apply, op, 0), torch.where(apply, magnitude, 0.0)))
        return {"rounds": rounds}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for op, magnitude in params["rounds"]:
            x = apply_op(x, op, magnitude, self.fill, self.interpolation, self.pil, self.v2_thresholds)
        return x


def dirichlet(concentration: torch.Tensor, n: int, generator: Draws) -> torch.Tensor:
    """``(n, k)`` Dirichlet draws from ``generator``: normalised Gamma(alpha_j) draws (Marsaglia and Tsang's
    method, boosted below 1), since torch's own Dirichlet sampler takes no generator. Keyed, the rejection loop
    (as many rounds as the batch's slowest sample needs) draws from a stream of its own and the boost from
    another, so that neither depends on the other samples."""
    alpha = concentration.to(torch.float64).expand(n, -1)
    boost = alpha < 1
    a = torch.where(boost, alpha + 1, alpha)
    d = a - 1.0 / 3
    c = 1.0 / torch.sqrt(9 * d)
    gamma = torch.zeros_like(a)
    todo = torch.ones_like(a, dtype=torch.bool)
    rounds, last = spawn(generator), spawn(generator)
    while bool(todo.any()):
        z = randn(rounds, a.shape, a.device, torch.float64)
        u = rand(rounds, a.shape, a.device, torch.float64)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp(min=1e-300)))
        take = todo & ok
        gamma = torch.where(take, d * v, gamma)
        todo = todo & ~ok
    u = rand(last, a.shape, a.device, torch.float64)
    gamma = torch.where(boost, gamma * u ** (1.0 / alpha), gamma)
    return (gamma / gamma.sum(1, keepdim=True)).to(torch.float32)


@dataclass(frozen=True)
class AugMix(BatchTransform):
    """torchvision's ``AugMix``: per sample, ``mixture_width`` chains of 1-3 (or ``chain_depth``) ops at a bin below
    ``severity``, mixed with Dirichlet weights, then with the original by a Beta weight; the sum truncated back
    to uint8 as torchvision's ``.to(dtype)`` does."""

    severity: int = 3
    mixture_width: int = 3
    chain_depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True
    fill: float | tuple[float, ...] | None = None
    interpolation: str = "bilinear"  # torchvision's AugMix default (the others': nearest)

    def __post_init__(self) -> None:
        _check_mode(self.interpolation)
        if not 1 <= self.severity <= 10 or self.mixture_width < 1 or self.alpha <= 0:
            raise ConfigError(
                f"severity={self.severity} must be in [1, 10], mixture_width={self.mixture_width} >= 1, "
                f"alpha={self.alpha} > 0"
            )
        object.__setattr__(self, "fill", fill_tuple(self.fill))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        _check_channels(x, "AugMix")
        _check_uint8(x, "AugMix")
        n, dev = x.shape[0], x.device
        ops, table = augmix_table(x.shape[2], x.shape[3], self.all_ops, dev)
        m = dirichlet(torch.tensor([self.alpha, self.alpha], device=dev), n, generator)
        weights = dirichlet(torch.tensor([self.alpha] * self.mixture_width, device=dev), n, generator) * m[:, 1:2]
        chains = []
        for _ in range(self.mixture_width):
            if self.chain_depth > 0:
                depth = torch.full((n,), self.chain_depth, device=dev)
            else:
                depth = randint(generator, 1, 4, (n,), dev)
            steps = []
            for step in range(int(self.chain_depth) if self.chain_depth > 0 else 3):
                pick = randint(generator, 0, len(ops), (n,), dev)
                bins = randint(generator, 0, self.severity, (n,), dev)
                op = torch.where(step < depth, ops[pick], 0)  # Identity past the sample's depth
                magnitude = torch.where(step < depth, table[pick, bins] * _signs(n, ops[pick], generator), 0.0)
                steps.append((op, magnitude))
            chains.append(steps)
        return {"original": m[:, 0], "weights": weights, "chains": chains}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        shape = (-1, 1, 1, 1)
        mix = params["original"].view(shape) * x
        for i, steps in enumerate(params["chains"]):
            aug = x
            for op, magnitude in steps:
                aug = apply_op(aug, op, magnitude, self.fill, self.interpolation)
            mix.add_(params["weights"][:, i].view(shape) * aug)
        return mix.to(x.dtype)
