"""Epoch order and seeds as pure functions.

Everything here is a function of its integer arguments only, computed on the CPU, so the same
(seed, epoch, n) gives the same order on every device, rank, process and storage tier.
"""

from __future__ import annotations

import torch

from .errors import ConfigError

__all__ = ["derive_seed", "epoch_order", "num_batches"]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """Mix integers into one 63-bit seed; different tuples give unrelated seeds.

    Used so that (seed, epoch) and (seed, epoch, rank, chunk) streams never coincide, which
    ``seed + epoch`` would not guarantee (seed 1 epoch 0 == seed 0 epoch 1).

    Example:
        >>> derive_seed(0, 1) != derive_seed(1, 0)
        True
    """
    h = 0x6A09E667F3BCC908  # arbitrary non-zero start, so derive_seed() of nothing is not 0
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK64))
    return h >> 1  # torch.Generator.manual_seed accepts any 64-bit value; 63 bits stays portable


def epoch_order(seed: int, epoch: int, n: int, shuffle: bool = True) -> torch.Tensor:
    """The visiting order of an epoch: a CPU int64 permutation of ``range(n)``.

    Example:
        >>> sorted(epoch_order(0, 3, 5).tolist())
        [0, 1, 2, 3, 4]
    """
    if n < 0:
        raise ConfigError(f"{n=} must be >= 0")
    if not shuffle:
        return torch.arange(n, dtype=torch.int64)
    g = torch.Generator(device="cpu").manual_seed(derive_seed(seed, epoch))
    return torch.randperm(n, generator=g, dtype=torch.int64)


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``n`` samples; ``drop_last`` drops only the ragged tail.

    Example:
        >>> num_batches(10, 4, drop_last=False), num_batches(10, 4, drop_last=True)
        (3, 2)
    """
    if batch_size < 1:
        raise ConfigError(f"{batch_size=} must be >= 1")
    return n // batch_size if drop_last else -(-n // batch_size)
