"""What the batched ops share to read their arguments and draw per-sample parameters.

The argument checks (a probability, an output size, a fill), :func:`apply_on`, which runs an op on the samples a
coin picks, and every random draw of :mod:`gpufeed.augment`: the draw functions below take the op's ``generator``,
either a ``torch.Generator`` or a :class:`~gpufeed.augment.keyed.KeyedDraws`.

- With a ``torch.Generator`` each calls exactly the torch function the ops have always called, with the same
  shape and dtype (torchvision's per-call draws, ``torch.rand(1) < p``, ``torch.empty(1).uniform_(low, high)``,
  one per sample), so a generator's stream, and every output drawn from it, is unchanged.
- With ``KeyedDraws`` each draws per sample from the sample's own key (``axis`` names the samples' axis of
  ``shape``), so a sample draws the same in any batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError
from .keyed import KeyedDraws

__all__ = [
    "Draws",
    "apply_on",
    "categorical",
    "check_finite",
    "check_p",
    "check_probability",
    "coin",
    "fill_tuple",
    "inner_draws",
    "permutation",
    "rand",
    "randint",
    "randn",
    "size_pair",
    "spawn",
    "uniform",
    "without_replacement",
]

Draws = torch.Generator | KeyedDraws  # where an op's randomness comes from: one stream per batch, or per sample


# torchvision draws a range's value with ``torch.empty(1).uniform_(low, high)``, which raises on every call for a
# bound that is NaN or infinite ("from is out of bounds for float"): such a range is refused when the op is made.
_UNBOUNDED = "torchvision refuses it on every call (RuntimeError: 'from/to is out of bounds for float')"


def check_finite(value: Any, name: str, op: str, why: str = _UNBOUNDED) -> None:
    """ConfigError naming the op ``op``, the argument ``name`` and its value when a number in ``value`` (a number or
    a sequence of them) is NaN or infinite; ``why``: what torchvision does with it (by default it raises)."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    try:
        bad = [v for v in values if not math.isfinite(float(v))]
    except (TypeError, ValueError):
        raise ConfigError(f"{op}: {name}={value!r} must be a number or a sequence of numbers") from None
    if bad:
        raise ConfigError(f"{op}: {name}={value!r} must be finite: {why}; give a finite value")


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


def apply_on(x: torch.Tensor, mask: torch.Tensor, op: Any) -> torch.Tensor:
    """``op`` applied to the samples ``mask`` picks, the others as they are."""
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        return x
    out = x.clone()
    out[idx] = op(x[idx], idx)
    return out


# -- draws: a torch.Generator's exact calls, or a KeyedDraws' per-sample ones ------------------------------------


def rand(
    generator: Draws,
    shape: Sequence[int],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    axis: int = 0,
) -> torch.Tensor:
    """Uniform in ``[0, 1)``: ``torch.rand(shape)``; keyed, per sample along ``axis``."""
    if isinstance(generator, KeyedDraws):
        return generator.uniform(shape, dtype, axis)
    return torch.rand(tuple(shape), generator=generator, device=device, dtype=dtype)


def randint(
    generator: Draws, low: int, high: int, shape: Sequence[int], device: torch.device, axis: int = 0
) -> torch.Tensor:
    """Integers in ``[low, high)``: ``torch.randint(low, high, shape)`` (``low == 0``: ``torch.randint(high, ...)``,
    the same draws); keyed, per sample along ``axis``."""
    if isinstance(generator, KeyedDraws):
        return generator.integers(low, high, shape, axis)
    if low == 0:
        return torch.randint(high, tuple(shape), generator=generator, device=device)
    return torch.randint(low, high, tuple(shape), generator=generator, device=device)


def randn(
    generator: Draws,
    shape: Sequence[int],
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    axis: int = 0,
) -> torch.Tensor:
    """Standard normals: ``torch.randn(shape)``; keyed, per sample along ``axis`` (Box-Muller)."""
    if isinstance(generator, KeyedDraws):
        return generator.normal(shape, dtype, axis)
    return torch.randn(tuple(shape), generator=generator, device=device, dtype=dtype)


def coin(x: torch.Tensor, p: float, generator: Draws) -> torch.Tensor:
    """Per sample, whether the op applies: torchvision's ``torch.rand(1) < p``."""
    return rand(generator, (x.shape[0],), x.device) < p


def uniform(n: int, low: float, high: float, x: torch.Tensor, generator: Draws) -> torch.Tensor:
    """``torch.empty(1).uniform_(low, high)`` per sample: float32 draws, as torchvision's (keyed: computed in
    float64 from the sample's uniform, then rounded to float32)."""
    if isinstance(generator, KeyedDraws):
        u = generator.uniform((n,), torch.float64)
        return (u * (float(high) - float(low)) + float(low)).to(torch.float32)
    return torch.empty(n, device=x.device).uniform_(low, high, generator=generator)


def permutation(generator: Draws, n: int, k: int, device: torch.device) -> torch.Tensor:
    """``(n, k)``: a uniform permutation of ``range(k)`` per sample, ``torch.rand((n, k)).argsort(1)``."""
    if isinstance(generator, KeyedDraws):
        return generator.permutation(k)
    return torch.rand((n, k), generator=generator, device=device).argsort(dim=1)


def categorical(generator: Draws, weights: Sequence[float], n: int, device: torch.device) -> torch.Tensor:
    """``(n,)``: an index per sample with probability proportional to ``weights``:
    ``torch.multinomial(weights, n, replacement=True)``."""
    if isinstance(generator, KeyedDraws):
        return generator.categorical(weights)
    w = torch.tensor(list(weights), dtype=torch.float64, device=device)
    return torch.multinomial(w, n, replacement=True, generator=generator)


def without_replacement(
    generator: Draws, weights: Sequence[float], n: int, count: int, device: torch.device
) -> torch.Tensor:
    """``(n, count)``: distinct indices per sample, each in turn with probability proportional to its weight
    among those left: ``torch.multinomial(weights.expand(n, -1), count, replacement=False)``."""
    if isinstance(generator, KeyedDraws):
        return generator.without_replacement(weights, count)
    w = torch.tensor(list(weights), dtype=torch.float64, device=device).expand(n, -1)
    return torch.multinomial(w, count, replacement=False, generator=generator)


def spawn(generator: Draws) -> Draws:
    """A stream for draws whose number depends on the data (a rejection loop): the generator itself (its one
    stream, as always), or keyed, a separate stream, so that the draws after the loop do not depend on it."""
    return generator.spawn() if isinstance(generator, KeyedDraws) else generator


def inner_draws(generator: Draws, x: torch.Tensor) -> int | KeyedDraws:
    """What a container's inner ops draw from: a seed drawn from the generator (one host read per batch), or
    keyed, the container's own ``"inner"`` stream (each inner op then takes a child of it, selected to the
    samples it runs on: per sample, as everything keyed)."""
    if isinstance(generator, KeyedDraws):
        return generator.spawn().child("inner")  # spawned: a second call of the container draws anew
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=x.device).item())
