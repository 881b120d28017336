"""What fixes the sequence of batches of either loader, and the rank it serves: a saved state must match it."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..sampling import Even, shard_batches

__all__ = ["EpochConfig", "distributed_rank"]


def distributed_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from ``torch.distributed`` when initialised, else ``(0, 1)``."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if rank is not None or world_size is not None:
        raise ConfigError(f"rank={rank!r} and world_size={world_size!r}: give both or neither")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


_ORDER_BYTES = 8  # an epoch's order holds one int64 per position


def check_layout(n: int, batch_size: int, world_size: int, drop_last: bool, even: Even) -> None:
    """Every rank lays out the whole epoch, repeats included (``world_size * batch_size`` positions per round): a
    layout that would not fit this machine's memory is an error naming it, not an allocator's failure mid-epoch."""
    _, _, padded = shard_batches(n, batch_size, world_size, drop_last, even)
    pad = even == "pad" or (even is True and not drop_last and world_size > 1)  # padded in samples, else in batches
    positions = n + (padded if pad else padded * batch_size)
    import psutil

    total = psutil.virtual_memory().total
    if positions * _ORDER_BYTES > total:
        raise ConfigError(
            f"world_size={world_size:,} ranks with batch_size={batch_size:,}: an epoch laid out for them (every rank "
            f"the same number of full batches) holds {positions:,} positions, {positions * _ORDER_BYTES / 2**30:,.0f} "
            f"GiB of indices, more than this machine's {total / 2**30:,.0f} GiB; give a smaller batch_size or fewer "
            "ranks"
        )


@dataclass(frozen=True)
class EpochConfig:
    """What fixes the sequence of batches, for both loaders; a saved state must match it to be resumed."""

    n: int  # samples in the whole dataset (before sharding)
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    chunk_batches: int
    rank: int = 0
    world_size: int = 1
    even: Even = True  # True, False or "pad": NOTE [ Sharing an epoch out to ranks ] in gpufeed.sampling
    shard: str = "full"

    def __post_init__(self) -> None:
        # batch_size, seed, the flags, even and shard were checked by the loader's options (gpufeed.options)
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ConfigError(f"world_size={self.world_size!r} must be an int >= 1")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank={self.rank!r} must be in [0, world_size={self.world_size})")
        if self.shard == "local" and self.n < self.world_size:
            raise ConfigError(
                f"shard='local' needs at least one sample per rank: {self.n} samples, {self.world_size} ranks"
            )
        if self.even is True and self.n < self.world_size:
            # DistributedSampler pads such an epoch with repeats without a word; a training rank whose every sample
            # is another rank's repeat is a launch mistake, not a share (evaluation's even="pad" and even=False
            # name the repeats and the empty ranks, and take it)
            raise ConfigError(
                f"world_size={self.world_size:,} ranks share {self.n:,} samples: ranks {self.n:,} and up would train "
                f"on repeats of the other ranks' samples only; use at most {self.n:,} ranks for this data, or "
                "even='pad' (evaluation: every rank the same number of batches, the repeats known to real_counts) or "
                "even=False"
            )
        check_layout(self.n, self.batch_size, self.world_size, self.drop_last, self.even)
        if not isinstance(self.chunk_batches, int) or self.chunk_batches < 1:
            raise ConfigError(f"chunk_batches={self.chunk_batches!r} must be an int >= 1")
