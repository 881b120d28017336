"""What the batched ops share to read their arguments and draw per-sample parameters.

The argument checks (a probability, an output size, a fill) and the per-sample draws (the coin that decides
whether an op applies to a sample, a uniform value per sample), with :func:`apply_on`, which runs an op on the
samples a coin picks. The draws follow torchvision's per-call draws (``torch.rand(1) < p``,
``torch.empty(1).uniform_(low, high)``), one per sample, from the ``generator`` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["apply_on", "check_p", "check_probability", "coin", "fill_tuple", "size_pair", "uniform"]


def check_p(p: float, name: str) -> float:
    """``p`` as a float, or ConfigError naming the op ``name`` when it is outside ``[0, 1]``."""
    if not 0.0 <= float(p) <= 1.0:
        raise ConfigError(f"{name}: p={p} must be in [0, 1]")
    return float(p)


def check_probability(p: float) -> float:
    """``p`` as a float, or ConfigError (``p=...``, no op name: the flips, crops and erasing) outside ``[0, 1]``."""
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"{p=} must be in [0, 1]")
    return float(p)


def size_pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """An output size as ``(height, width)`` positive ints (an int is square), or ConfigError naming ``name``."""
    pair: tuple[int, ...] = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 1 for v in pair):
        raise ConfigError(f"{name}={value!r} must be a positive int or a (height, width) pair")
    return pair


def fill_tuple(fill: Any) -> tuple[float, ...] | None:
    """A fill as a tuple of floats (one number, or one per channel); None stays None."""
    if fill is None:
        return None
    return (float(fill),) if isinstance(fill, (int, float)) else tuple(float(v) for v in fill)


def coin(x: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Per sample, whether the op applies: torchvision's ``torch.rand(1) < p``."""
    return torch.rand(x.shape[0], generator=generator, device=x.device) < p


def apply_on(x: torch.Tensor, mask: torch.Tensor, op: Any) -> torch.Tensor:
    """``op`` applied to the samples ``mask`` picks, the others as they are."""
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        return x
    out = x.clone()
    out[idx] = op(x[idx], idx)
    return out


def uniform(n: int, low: float, high: float, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``torch.empty(1).uniform_(low, high)`` per sample: float32 draws, as torchvision's."""
    return torch.empty(n, device=x.device).uniform_(low, high, generator=generator)
