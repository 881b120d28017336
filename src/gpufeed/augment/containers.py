"""torchvision's random containers, batched: ``RandomApply``, ``RandomChoice`` and ``RandomOrder``, decided per
sample as torchvision decides per call.

The inner ops draw from a seed recorded in the parameters (keyed draws: from the container's ``"inner"`` stream, each
inner op from a child of it selected to the samples it runs on), so ``apply`` stays a pure function of them; an
inner op may not change the image's size (the samples a container picks and the others would differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError, DataError
from .keyed import KeyedDraws
from .params import Draws, apply_on, categorical, check_p, coin, inner_draws, permutation
from .transforms import BatchTransform, Params

__all__ = ["Identity", "RandomApply", "RandomChoice", "RandomOrder"]


def _run(op: BatchTransform, x: torch.Tensor, inner: int | KeyedDraws, salt: int, idx: torch.Tensor) -> torch.Tensor:
    """``op`` on ``x``, the samples at ``idx`` of the container's batch: from a generator seeded with the
    container's seed plus ``salt`` (the op's place), or keyed, from the inner stream's child ``salt``, selected to
    those samples."""
    if isinstance(inner, KeyedDraws):
        return op(x, generator=inner.child(salt).select(idx))
    g = torch.Generator(device=x.device).manual_seed(inner + salt)
    return op(x, generator=g)


def _same_size(ops: Sequence[BatchTransform], name: str) -> tuple[BatchTransform, ...]:
    """The ops; what they do to a size is checked where the size is known (the planner, and each run)."""
    return tuple(ops)


def _kept_size(out: torch.Tensor, part: torch.Tensor, name: str) -> torch.Tensor:
    if out.shape[1:] != part.shape[1:]:
        raise DataError(
            f"{name}: its ops turn {tuple(part.shape[1:])} images into {tuple(out.shape[1:])}, so the samples it "
            "picks and the others would differ in size"
        )
    return out


class Identity(BatchTransform):
    """Nothing: stands for an op that changes nothing on the device (a conversion the state already has)."""

    random = False

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return x

    def __repr__(self) -> str:
        return "Identity()"


@dataclass(frozen=True)
class RandomApply(BatchTransform):
    """torchvision's ``RandomApply``: per sample, with probability ``p``, all of ``transforms`` in order."""

    transforms: tuple[BatchTransform, ...] = ()
    p: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _same_size(self.transforms, "RandomApply"))
        object.__setattr__(self, "p", check_p(self.p, "RandomApply"))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        return {"apply": coin(x, self.p, generator), "seed": inner_draws(generator, x)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        def chain(part: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            out = part
            for k, op in enumerate(self.transforms):
                out = _run(op, out, params["seed"], k, idx)
            return _kept_size(out, part, "RandomApply")

        return apply_on(x, params["apply"], chain)


@dataclass(frozen=True)
class RandomChoice(BatchTransform):
    """torchvision's ``RandomChoice``: per sample one of ``transforms`` (weighted by ``p``, uniform if None)."""

    transforms: tuple[BatchTransform, ...] = ()
    p: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _same_size(self.transforms, "RandomChoice"))
        if not self.transforms:
            raise ConfigError("RandomChoice needs at least one transform")
        if self.p is not None and (len(self.p) != len(self.transforms) or min(self.p) < 0 or sum(self.p) <= 0):
            raise ConfigError(f"RandomChoice: p={self.p!r} needs one weight >= 0 per transform")

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        if x.shape[0] == 0:
            return {"which": torch.zeros(0, dtype=torch.long, device=x.device), "seed": 0}
        which = categorical(generator, self.p or [1.0] * len(self.transforms), x.shape[0], x.device)
        return {"which": which, "seed": inner_draws(generator, x)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for k, op in enumerate(self.transforms):
            x = apply_on(
                x,
                params["which"] == k,
                lambda part, idx, op=op, k=k: _kept_size(_run(op, part, params["seed"], k, idx), part, "RandomChoice"),
            )
        return x


@dataclass(frozen=True)
class RandomOrder(BatchTransform):
    """torchvision's ``RandomOrder``: all of ``transforms``, in an order drawn per sample."""

    transforms: tuple[BatchTransform, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _same_size(self.transforms, "RandomOrder"))

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        k = len(self.transforms)
        order = permutation(generator, x.shape[0], k, x.device)  # uniform permutations
        return {"order": order, "seed": inner_draws(generator, x)}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        order = params["order"]
        for slot in range(order.shape[1]):
            for k, op in enumerate(self.transforms):
                salt = slot * len(self.transforms) + k
                x = apply_on(
                    x,
                    order[:, slot] == k,
                    lambda part, idx, op=op, s=salt: _kept_size(
                        _run(op, part, params["seed"], s, idx), part, "RandomOrder"
                    ),
                )
        return x
