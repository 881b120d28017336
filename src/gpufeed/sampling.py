"""Epoch order and seeds as pure functions.

Everything here is a function of its integer arguments only, computed on the CPU, so the same
(seed, epoch, n) gives the same order on every device, rank, process and storage tier.

NOTE [ Sharing an epoch out to ranks: the three ``even`` modes ]
- ``even=True`` (training): every rank the same number of batches, so no rank waits in a collective
  (DDP's gradient all-reduce). ``drop_last`` drops whole batches; without it, every rank's batches also have
  the same shapes, batch for batch (a gather per batch, ``gather_for_metrics``, needs that whichever launcher
  started the ranks): the epoch is laid out as under ``even="pad"``, its repeats known to ``real_counts`` and
  ``gather_for_metrics``. On one rank nothing is repeated and only the last batch is short.
- ``even="pad"`` (evaluation with collectives): every sample once, then repeats of the order's first
  samples at the very end, up to ``world * batch_size`` per round: every rank the same number of
  batches, each a full ``batch_size`` (one rank: only the last batch short, nothing repeated). The
  repeats sit at the end of the last round, so a gather of that round in rank order holds the real
  samples first: Accelerate's ``gather_for_metrics`` keeps the first ``n % (world * batch_size)``
  (:func:`gather_remainder`), as it does for its own padded loaders; a plain loop keeps the first
  :func:`real_counts` samples of each batch.
- ``even=False``: every sample exactly once, ranks' batch counts differ by at most one; a collective
  per batch (``all_reduce`` of a running metric) then waits forever on the rank with more batches.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from .errors import ConfigError

__all__ = [
    "EVEN_MODES",
    "as_even",
    "derive_seed",
    "epoch_order",
    "gather_remainder",
    "global_seed",
    "local_indices",
    "rank_indices",
    "real_counts",
    "seed_globals",
    "shard_batches",
]

EVEN_MODES = (True, False, "pad")  # NOTE [ Sharing an epoch out to ranks: the three ``even`` modes ]
Even = bool | str


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


def seed_globals(seed: int) -> None:
    """Seed torch's CPU generator, ``random`` and numpy's global state (:func:`global_seed` without the restore: where
    they are no one else's, a DataLoader worker's; saving and restoring them took 0.34 ms a sample, numpy's state
    most of it, against about 1 ms for a CIFAR recipe's per-sample ops)."""
    torch.random.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


@contextmanager
def global_seed(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator, ``random`` and numpy's global state for the block, then restore them.

    What a per-sample transform draws (torchvision uses torch's generator, some code ``random`` or
    numpy) becomes a function of ``seed``, and the caller's global randomness is left as it was.
    CUDA's generators are not touched: torchvision's per-sample ops do not use them.
    """
    cpu = torch.random.default_generator
    saved = cpu.get_state(), random.getstate(), np.random.get_state()
    try:
        seed_globals(seed)
        yield
    finally:
        cpu.set_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


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


def as_even(value: object, drop_last: bool = False, shard: str = "full") -> Even:
    """``value`` as one of :data:`EVEN_MODES`, or a ConfigError saying what each mode does.

    Example:
        >>> as_even("pad")
        'pad'
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value != "pad":
        raise ConfigError(
            f"even={value!r} must be True (training: equal batch counts), 'pad' (evaluation: equal batch counts, "
            "the repeats at the end and known) or False (evaluation: every sample once, batch counts may differ)"
        )
    if drop_last:
        raise ConfigError(
            "even='pad' serves every sample and pads the last batches; drop_last=True drops the ragged tail: "
            "pass drop_last=False to evaluate every sample, or even=True to train on full batches"
        )
    if shard != "full":
        raise ConfigError(
            f"even='pad' with shard={shard!r}: the ranks' local shares differ in size, so the repeats would sit "
            "between ranks in a gathered batch where gather_for_metrics cannot drop them; use shard='full', or "
            "even=False and sum per-rank counts"
        )
    return "pad"


def _padded_total(n: int, batch_size: int, world: int) -> int:
    """Samples served per epoch under ``even="pad"``: ``n`` rounded up to whole rounds of ``world`` full
    batches (one rank: ``n``, its last batch short)."""
    if world == 1:
        return n
    per_round = world * batch_size
    return -(-n // per_round) * per_round


def _layout(even: Even, drop_last: bool, world: int) -> Even:
    """The layout ``even`` gives: True without ``drop_last`` on several ranks is ``"pad"``'s (equal shapes on every
    rank, batch for batch: NOTE [ Sharing an epoch out to ranks ])."""
    return "pad" if even is True and not drop_last and world > 1 else even


def shard_batches(n: int, batch_size: int, world: int, drop_last: bool, even: Even) -> tuple[int, int, int]:
    """How an epoch of ``n`` samples is cut for ``world`` ranks: ``(slots, full_used, padded)``.

    The global sequence is ``full_used`` full batches of the order, then ``padded`` full batches of
    repeated samples (from the start of the order), then the ragged tail batch if there is one and
    it is kept: ``slots`` batch slots in all, handed to ranks in turn (slot ``j`` to rank ``j % world``).

    ``even=True`` (training): every rank gets the same number of slots: with ``drop_last`` whole
    batches are dropped (fewer than ``world * batch_size`` samples), else it is ``even="pad"``'s layout (equal
    shapes on every rank). ``even=False`` (evaluation): no padding, each
    sample once; rank counts differ by at most one batch. With one rank, nothing is padded.
    ``even="pad"``: the whole order, then ``padded`` *samples* (not batches) of repeats, in ``slots``
    batches; ``full_used`` is ``n // batch_size`` (see NOTE [ Sharing an epoch out to ranks ]).

    Example:
        >>> shard_batches(10, 2, 3, drop_last=False, even=True)   # 10 samples + 2 repeats: 2 full batches per rank
        (6, 5, 2)
        >>> shard_batches(10, 2, 3, drop_last=True, even=True)    # 3 batches used, 4 samples dropped
        (3, 3, 0)
    """
    if world < 1:
        raise ConfigError(f"world_size={world} must be >= 1")
    even = _layout(even, drop_last, world)
    full, tail = divmod(n, batch_size)
    if even == "pad":
        total = _padded_total(n, batch_size, world)
        return -(-total // batch_size), full, total - n
    real = full + (1 if tail and not drop_last else 0)
    if not even:
        return (full if drop_last else real), full, 0
    if drop_last:
        used = (full // world) * world
        return used, used, 0
    slots = -(-real // world) * world
    return slots, full, slots - real


def rank_indices(
    order: torch.Tensor, batch_size: int, rank: int, world: int, drop_last: bool, even: Even
) -> torch.Tensor:
    """The part of the global ``order`` that ``rank`` visits, batch after batch (see :func:`shard_batches`).

    Every rank derives the same global order, so the shares are disjoint and together cover it.
    Only a rank's last batch can be short.

    Example:
        >>> rank_indices(torch.arange(10), 2, 1, 3, drop_last=False, even=False).tolist()
        [2, 3, 8, 9]
    """
    if not 0 <= rank < world:
        raise ConfigError(f"rank={rank} must be in [0, world_size={world})")
    n = order.shape[0]
    slots, full, padded = shard_batches(n, batch_size, world, drop_last, even)
    if _layout(even, drop_last, world) == "pad":  # the whole order, then the repeats: they end the last round
        parts = [order] if not padded else [order, order.repeat(-(-padded // n))[:padded]]
        return _slots_of(torch.cat(parts), batch_size, rank, world, slots)
    parts = [order[: full * batch_size]]
    if padded:
        parts.append(order.repeat(-(-padded * batch_size // n))[: padded * batch_size])
    if slots > full + padded:  # the ragged tail, last
        parts.append(order[full * batch_size :])
    return _slots_of(torch.cat(parts), batch_size, rank, world, slots)


def _slots_of(seq: torch.Tensor, batch_size: int, rank: int, world: int, slots: int) -> torch.Tensor:
    """Batch slots ``rank, rank + world, ...`` of the global sequence ``seq``, concatenated."""
    mine = range(rank, slots, world)
    if not mine:
        return seq[:0]
    return torch.cat([seq[j * batch_size : (j + 1) * batch_size] for j in mine])


def real_counts(
    n: int, batch_size: int, rank: int, world: int, drop_last: bool, even: Even, shard: str = "full"
) -> tuple[int, ...]:
    """For each batch ``rank`` serves in an epoch: how many of its first samples are real, the rest being repeats
    that pad the epoch (see NOTE [ Sharing an epoch out to ranks ]). The same every epoch.

    Under ``even="pad"`` the real samples of all ranks together are the epoch's order, each once: an evaluation
    loop keeps ``x[:count]`` (or the mask ``torch.arange(len(x)) < count``).

    Example:
        >>> real_counts(10, 4, 1, 2, drop_last=False, even="pad")   # rank 1: samples 4-7, then 4 repeats
        (4, 0)
    """
    if shard == "local":  # local_indices: full batches, whole batches of repeats, then the ragged tail
        local = len(range(rank, n, world))
        full, tail = divmod(local, batch_size)
        if drop_last:
            return (batch_size,) * ((n // world) // batch_size if even else full)
        if not even:
            return (batch_size,) * full + ((tail,) if tail else ())
        largest = -(-n // world)
        missing = max(0, -(-largest // batch_size) - (full + (1 if tail else 0)))
        return (batch_size,) * full + (0,) * missing + ((tail,) if tail else ())
    slots, full, padded = shard_batches(n, batch_size, world, drop_last, even)
    if _layout(even, drop_last, world) == "pad":
        return tuple(max(0, min(batch_size, n - j * batch_size)) for j in range(rank, slots, world))
    tail = n - full * batch_size
    counts = [batch_size] * full + [0] * padded + ([tail] if slots > full + padded else [])
    return tuple(counts[j] for j in range(rank, slots, world))


def gather_remainder(n: int, batch_size: int, world: int, even: Even, drop_last: bool = False) -> int:
    """What Accelerate's ``GradientState.remainder`` holds for its own loaders: the real samples in the last
    gathered round, ``n % (world * batch_size)`` (0: the round is all real), under ``even="pad"`` (and ``even=True``
    without ``drop_last``, laid out alike), whose repeats
    end that round; -1 (keep every gathered sample) otherwise, where no prefix of the round is the real part.

    Example:
        >>> gather_remainder(101, 8, 2, even="pad")   # 6 rounds of 16, then 5 real samples and 11 repeats
        5
    """
    return n % (world * batch_size) if _layout(even, drop_last, world) == "pad" else -1


def local_indices(
    order: torch.Tensor, batch_size: int, n: int, world: int, drop_last: bool, even: Even
) -> torch.Tensor:
    """A rank's visiting order over its *local* share (``shard="local"``), equalised across ranks.

    ``order`` permutes the rank's own samples (``n // world`` or one more). With ``even`` every rank
    ends with the same number of batches: under ``drop_last`` each uses ``(n // world) // batch_size``
    full batches; otherwise a rank one batch short repeats samples from its order's start to make
    one more full batch (placed before its ragged tail, so only the last batch is short).
    """
    local = order.shape[0]
    full, tail = divmod(local, batch_size)
    if drop_last:
        use = (n // world) // batch_size if even else full
        return order[: use * batch_size]
    if not even:
        return order
    largest = -(-n // world)
    target = -(-largest // batch_size)  # batches of the largest share
    missing = target - (full + (1 if tail else 0))
    if missing <= 0 or local == 0:
        return order
    pad = order.repeat(-(-missing * batch_size // local))[: missing * batch_size]
    return torch.cat([order[: full * batch_size], pad, order[full * batch_size :]])
