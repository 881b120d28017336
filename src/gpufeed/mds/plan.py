"""Which sample ids one rank serves in an epoch, in order: the engine's planner, without iterating the engine.

NOTE [ Why the plan comes from the index, not from a StreamingDataset ]
For one unweighted stream with ``batching_method='random'``, the engine's ``generate_work`` is the composition of
two pure functions of the index's samples per shard: ``get_partitions`` (the ``relaxed`` partition of the epoch's
positions over nodes x ranks, dropping the ``sample_in_epoch`` already consumed) and ``get_shuffle`` (the
shard-aware permutation of an epoch). gpufeed calls those two directly (``engine.py``), so planning
- needs no ``StreamingDataset``: local-only data is served without any of the engine's shared memory, and a remote
  one is planned before its dataset object exists;
- never passes the engine's ``__iter__``: no node-wide shared-memory barrier per epoch (the DDP hang at epoch ends
  when one rank re-iterates early), no shared epoch counter, and no stale-resume trap (``load_state_dict`` after an
  iteration silently ignored): the caller passes the epoch and position itself;
- is one function of (index, settings, layout, epoch, position), the same on every rank and in every resumed run.
One "worker" per rank: gpufeed's threads replace DataLoader workers, and the order a rank receives through a
round-robin DataLoader does not depend on its worker count. The result is checked against the engine's own
iteration: one process and simulated layouts in ``tests/stream/test_plan.py``, two real ranks under torchrun in
``tests/stream/test_shards.py``. Cost: every rank computes the whole layout's plan (as the engine's node leader
does), about 0.2 s and 10 MB an epoch for ImageNet-1k, 2-3 s and 110 MB for 14 M samples (research memo).

NOTE [ The epoch's tail: repeats, never drops; gpufeed cuts whole global batches ]
The engine makes every canonical node's range the same length by repeating a row's last sample (up to
``num_canonical_nodes - 1`` repeats), then pads every rank to the same count with repeats (node padding when nodes
outnumber canonical nodes, rank padding up to ``world - 1``), then pads the last per-rank batch with ``-1``. So a
rank's engine share can end in a ragged batch and a few repeated samples. gpufeed serves fixed-size batches
(``drop_last=True``): an epoch is the first ``(stream - sample_in_epoch) // global_batch_size`` global batches,
where ``stream = num_canonical_nodes * ceil(num_samples / num_canonical_nodes)`` is the part of the engine's
order that no layout changes. Global batch ``k`` is the union of every rank's batch ``k``, so every rank stops
after the same number of batches, and the global batches (as sets) are the same for every layout; up to
``global_batch_size - 1`` positions of the stream's end are not served that epoch (another epoch's shuffle moves
them), and up to ``num_canonical_nodes - 1`` samples can appear twice.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..validate import as_flag, as_int
from . import engine

__all__ = [
    "DOWNLOADERS_PER_RANK",
    "SHUFFLE_ALGOS",
    "EpochPlan",
    "Layout",
    "StreamSettings",
    "block_size_for_cache",
    "check_layout",
    "engine_cache_limit",
    "plan_epoch",
    "plan_share",
    "plan_work",
    "rank_order",
    "stream_length",
]

SHUFFLE_ALGOS = ("py1e", "py1br", "py1s", "py2s", "naive")


@dataclass(frozen=True)
class StreamSettings:
    """What fixes the order of every epoch, whatever the number of nodes and ranks (keep it for a whole run).

    Args:
        global_batch_size: samples per step over all ranks; each rank serves ``global_batch_size // world``. Fixed
            for the run: resuming at another world size keeps it (it must divide by every world size used).
        num_canonical_nodes: how the engine splits the epoch into ranges (each read by one node at a time); physical
            node counts must divide it or be multiples of it. Never derived from the first run's layout (the engine
            does that when it is None, and the order then depends on where the run started).
        shuffle: shuffle each epoch (``shuffle_seed + epoch``); otherwise the canonical nodes' ranges interleaved.
        shuffle_seed: the engine's seed of the order (not the augmentation seed).
        shuffle_algo: one of :data:`SHUFFLE_ALGOS`.
        shuffle_block_size: samples per shuffle block; None = the engine's default
            ``max(4_000_000 // num_canonical_nodes, 1 << 18)``, which thrashes a small cache: see
            :func:`block_size_for_cache`.
    """

    global_batch_size: int
    num_canonical_nodes: int
    shuffle: bool = False
    shuffle_seed: int = 9176
    shuffle_algo: str = "py1e"
    shuffle_block_size: int | None = None

    def __post_init__(self) -> None:
        as_int(self.global_batch_size, "global_batch_size", 1)
        as_int(self.num_canonical_nodes, "num_canonical_nodes", 1)
        as_flag(self.shuffle, "shuffle")
        as_int(self.shuffle_seed, "shuffle_seed", 0)
        if self.shuffle_algo not in SHUFFLE_ALGOS:
            raise ConfigError(f"shuffle_algo={self.shuffle_algo!r} is not one of {SHUFFLE_ALGOS}")
        if self.shuffle_block_size is not None:
            as_int(self.shuffle_block_size, "shuffle_block_size", 1)

    @property
    def block_size(self) -> int:
        """The shuffle block in samples (the engine's default when none was set)."""
        if self.shuffle_block_size is not None:
            return self.shuffle_block_size
        return max(4_000_000 // self.num_canonical_nodes, 1 << 18)

    def batch_size(self, world_size: int) -> int:
        """Samples per batch on each of ``world_size`` ranks."""
        if self.global_batch_size % world_size:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not divisible by the world size {world_size}: every "
                "rank serves global_batch_size // world samples per batch; choose a global batch size divisible by "
                "every world size the run will use"
            )
        return self.global_batch_size // world_size


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: ``num_nodes`` x ``ranks_per_node`` ranks, this one on ``node`` as ``rank_of_node``."""

    num_nodes: int = 1
    ranks_per_node: int = 1
    node: int = 0
    rank_of_node: int = 0

    def __post_init__(self) -> None:
        as_int(self.num_nodes, "num_nodes", 1)
        as_int(self.ranks_per_node, "ranks_per_node", 1)
        if not 0 <= as_int(self.node, "node") < self.num_nodes:
            raise ConfigError(f"node={self.node} must be in [0, num_nodes={self.num_nodes})")
        if not 0 <= as_int(self.rank_of_node, "rank_of_node") < self.ranks_per_node:
            raise ConfigError(f"rank_of_node={self.rank_of_node} must be in [0, ranks_per_node={self.ranks_per_node})")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def rank(self) -> int:
        return self.node * self.ranks_per_node + self.rank_of_node

    @classmethod
    def of_rank(cls, rank: int, world_size: int, ranks_per_node: int) -> Layout:
        """Rank ``rank`` of ``world_size`` with ``ranks_per_node`` ranks on each node (torchrun's numbering)."""
        if world_size % ranks_per_node:
            raise ConfigError(f"world_size={world_size} is not a multiple of ranks_per_node={ranks_per_node}")
        return cls(world_size // ranks_per_node, ranks_per_node, rank // ranks_per_node, rank % ranks_per_node)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Layout:
        """This process's layout from torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), as the
        engine reads them; one rank when they are absent.

        Example:
            >>> Layout.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
            Layout(num_nodes=2, ranks_per_node=2, node=1, rank_of_node=1)
        """
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", 1))
        if world > 1 and "LOCAL_WORLD_SIZE" not in env:
            # the engine would assume one rank per node: every rank its own node, and the ranks of a real node
            # would each wait for a shared-memory leader that never comes
            raise ConfigError(
                f"WORLD_SIZE={world} but LOCAL_WORLD_SIZE is not set: launch with torchrun (it sets both), or set "
                "LOCAL_WORLD_SIZE to the number of ranks on each node"
            )
        return cls.of_rank(int(env.get("RANK", 0)), world, int(env.get("LOCAL_WORLD_SIZE", 1)))


def stream_length(num_samples: int, num_canonical_nodes: int) -> int:
    """Positions of an epoch that every layout orders alike: ``num_canonical_nodes * ceil(num_samples / ncn)``
    (NOTE [ The epoch's tail ... ])."""
    return num_canonical_nodes * math.ceil(num_samples / num_canonical_nodes)


def check_layout(settings: StreamSettings, num_nodes: int, ranks_per_node: int, initial: int | None) -> None:
    """A ConfigError if ``num_nodes`` nodes cannot serve ``settings``' canonical nodes (``initial``: the node count
    of the run's first epoch, from a state)."""
    ncn = settings.num_canonical_nodes
    fits = ncn % num_nodes == 0 or num_nodes % ncn == 0
    if initial in (None, num_nodes) or fits:
        if not fits:
            raise ConfigError(
                f"num_canonical_nodes={ncn} and {num_nodes} nodes: one must divide the other; set "
                "num_canonical_nodes to a multiple of every node count the run will use (e.g. their product)"
            )
        return
    # resumed on a node count that does not fit: the engine replays the first run's partition, re-dealt
    if settings.global_batch_size % (initial * ranks_per_node):
        raise ConfigError(
            f"resuming a run started on {initial} nodes on {num_nodes} nodes needs global_batch_size="
            f"{settings.global_batch_size} divisible by {initial} x {ranks_per_node} ranks per node"
        )


def plan_work(
    samples_per_shard: Sequence[int] | np.ndarray,
    settings: StreamSettings,
    num_nodes: int,
    ranks_per_node: int,
    epoch: int,
    sample_in_epoch: int = 0,
    initial_physical_nodes: int | None = None,
    whole_batches: bool = True,
) -> np.ndarray:
    """The engine's whole plan of an epoch for a layout: ``(nodes, ranks_per_node, batches, batch_size)`` sample ids,
    ``-1`` where the engine pads; what its ``generate_work`` gives with one worker per rank.

    ``sample_in_epoch`` global samples of the epoch are already consumed (a multiple of the global batch size);
    ``initial_physical_nodes``: the node count of the run's first epoch, from a saved state (None at a fresh start).
    ``whole_batches``: the plan is cut into whole global batches, so the dataset must hold one at least.
    """
    sizes = np.asarray(samples_per_shard, dtype=np.int64)
    num_samples = int(sizes.sum())
    ncn = settings.num_canonical_nodes
    batch = settings.batch_size(num_nodes * ranks_per_node)
    as_int(epoch, "epoch", 0)
    as_int(sample_in_epoch, "sample_in_epoch", 0)
    if sample_in_epoch % settings.global_batch_size:
        raise ConfigError(
            f"sample_in_epoch={sample_in_epoch} is not a multiple of global_batch_size={settings.global_batch_size}: "
            "gpufeed resumes at a global batch boundary"
        )
    if num_samples <= ncn or (whole_batches and num_samples < settings.global_batch_size):
        raise ConfigError(
            f"the dataset has {num_samples} samples: it needs more than num_canonical_nodes={ncn} and at least "
            f"global_batch_size={settings.global_batch_size}"
        )
    if sample_in_epoch > stream_length(num_samples, ncn):
        raise ConfigError(f"sample_in_epoch={sample_in_epoch} is past the epoch's {num_samples} samples")
    check_layout(settings, num_nodes, ranks_per_node, initial_physical_nodes)
    positions = engine.get_partitions(
        num_samples, ncn, num_nodes, ranks_per_node, batch, sample_in_epoch, initial_physical_nodes
    )
    if settings.shuffle:
        # the engine shuffles "shuffle units": one per shard with samples (an empty shard has none)
        order = engine.get_shuffle(
            settings.shuffle_algo, sizes[sizes > 0], ncn, settings.shuffle_seed, epoch, settings.block_size
        )
        positions = np.where(positions != -1, order[positions], -1)
    return positions[:, :, 0]


def rank_order(work: np.ndarray, layout: Layout) -> np.ndarray:
    """This rank's whole engine share, in order, padding removed: what ``for s in StreamingDataset(...)`` yields
    on that rank (tail included, ragged and repeated; :class:`EpochPlan` cuts it)."""
    ids = work[layout.node, layout.rank_of_node].reshape(-1)
    return ids[ids != -1]


@dataclass(frozen=True)
class EpochPlan:
    """One rank's share of one epoch (from ``sample_in_epoch`` on) in whole batches of ``batch_size``.

    ``ids[k * batch_size:(k + 1) * batch_size]`` is this rank's part of global batch ``k``; every rank has the same
    ``num_batches``. ``tail``: what the engine would also give this rank and gpufeed does not serve (NOTE [ The
    epoch's tail ... ]). After ``k`` batches, the epoch's position to save is :meth:`sample_in_epoch_after` ``(k)``.
    """

    epoch: int
    sample_in_epoch: int
    global_batch_size: int
    batch_size: int
    ids: np.ndarray
    tail: np.ndarray
    last_partial: bool = False  # the engine's whole share (:func:`plan_share`): its last batch may be smaller
    real: int | None = None  # plan_share: ids[:real] are first occurrences, the rest the engine's repeats

    def real_counts(self) -> list[int]:
        """Per batch, how many of its first samples are real (the others repeats, :func:`plan_share`)."""
        real = len(self.ids) if self.real is None else self.real
        b = self.batch_size
        return [max(0, min(len(self.batch(k)), real - k * b)) for k in range(self.num_batches)]

    @property
    def num_batches(self) -> int:
        if self.last_partial:
            return -(-len(self.ids) // self.batch_size)
        return len(self.ids) // self.batch_size

    def batch(self, k: int) -> np.ndarray:
        """This rank's ids of batch ``k`` (counted from this plan's start)."""
        if not 0 <= k < self.num_batches:
            raise IndexError(f"batch {k} is not in [0, {self.num_batches})")
        return self.ids[k * self.batch_size : (k + 1) * self.batch_size]

    def batches(self) -> np.ndarray:
        """``(num_batches, batch_size)``: every batch of this rank (a view; whole batches only)."""
        return self.ids.reshape(len(self.ids) // self.batch_size, self.batch_size)

    def sample_in_epoch_after(self, batches_done: int) -> int:
        """Global samples of the epoch consumed once ``batches_done`` batches of this plan are served (on every
        rank): the position a state records."""
        return self.sample_in_epoch + batches_done * self.global_batch_size


def plan_epoch(
    samples_per_shard: Sequence[int] | np.ndarray,
    settings: StreamSettings,
    layout: Layout,
    epoch: int,
    sample_in_epoch: int = 0,
    initial_physical_nodes: int | None = None,
) -> EpochPlan:
    """The ids ``layout``'s rank serves in ``epoch`` from ``sample_in_epoch`` on, in whole batches.

    Example::

        settings = StreamSettings(global_batch_size=256, num_canonical_nodes=8, shuffle=True)
        plan = plan_epoch(shards.index.samples_per_shard, settings, Layout.from_env(), epoch=3)
        for k in range(plan.num_batches):
            batch = shards.read(plan.batch(k))      # every rank: the same num_batches
        # a state after k batches records plan.sample_in_epoch_after(k)
    """
    work = plan_work(
        samples_per_shard,
        settings,
        layout.num_nodes,
        layout.ranks_per_node,
        epoch,
        sample_in_epoch,
        initial_physical_nodes,
    )
    full = (stream_length(int(np.sum(samples_per_shard)), settings.num_canonical_nodes) - sample_in_epoch) // (
        settings.global_batch_size
    )
    complete = (work != -1).all(axis=(0, 1, 3))
    # every position before the stream's end is a real sample in any layout, so this never cuts more; kept so that
    # a change in the engine cannot give ranks different counts (a collective would wait forever)
    full = min(full, int(complete.argmin()) if not complete.all() else len(complete))
    mine = work[layout.node, layout.rank_of_node]
    rest = mine[full:].reshape(-1)
    return EpochPlan(
        epoch=epoch,
        sample_in_epoch=sample_in_epoch,
        global_batch_size=settings.global_batch_size,
        batch_size=work.shape[-1],
        ids=np.ascontiguousarray(mine[:full].reshape(-1)),
        tail=rest[rest != -1],
    )


def plan_share(
    samples_per_shard: Sequence[int] | np.ndarray,
    settings: StreamSettings,
    layout: Layout,
    epoch: int,
    sample_in_epoch: int = 0,
    initial_physical_nodes: int | None = None,
) -> EpochPlan:
    """``layout``'s rank's whole engine share of ``epoch`` from ``sample_in_epoch`` on: what ``StreamingDataset``
    yields on that rank (every sample at least once, the last batch possibly smaller, every rank the same count), with
    the engine's few padding repeats moved to the end of the share: ``ids[:real]`` are each sample's first
    occurrence in the layout's order (global batch by global batch, rank by rank), ``ids[real:]`` repeats, so an
    evaluation scores each sample once (``StreamLoader.real_counts``). For evaluation, where none may be left out.

    A position in the last stretch, past the dataset's samples (only the engine's repeats are left there, and the
    engine refuses to resume into it), continues the epoch's plan from its start instead.
    """
    num_samples = int(np.sum(samples_per_shard))
    start = sample_in_epoch if sample_in_epoch < num_samples else 0
    work = plan_work(
        samples_per_shard, settings, layout.num_nodes, layout.ranks_per_node, epoch, start, initial_physical_nodes,
        whole_batches=False,
    )  # fmt: skip
    nodes, ranks, batches, size = work.shape
    order = work.transpose(2, 0, 1, 3).reshape(-1)  # global batch by global batch, then node, rank, slot
    valid = np.flatnonzero(order != -1)
    first = np.zeros(order.shape, dtype=bool)
    first[valid[np.unique(order[valid], return_index=True)[1]]] = True
    mine = work[layout.node, layout.rank_of_node].reshape(-1)
    real = first.reshape(batches, nodes, ranks, size)[:, layout.node, layout.rank_of_node].reshape(-1)[mine != -1]
    mine = mine[mine != -1]
    ids, count = np.concatenate([mine[real], mine[~real]]), int(real.sum())
    if start != sample_in_epoch:
        skip = (sample_in_epoch // settings.global_batch_size) * size
        ids, count = ids[skip:], max(0, count - skip)
    return EpochPlan(
        epoch=epoch,
        sample_in_epoch=sample_in_epoch,
        global_batch_size=settings.global_batch_size,
        batch_size=size,
        ids=np.ascontiguousarray(ids),
        tail=ids[:0],
        last_partial=True,
        real=count,
    )


def block_size_for_cache(
    samples_per_shard: Sequence[int] | np.ndarray,
    shard_bytes: int,
    cache_bytes: int,
    num_canonical_nodes: int,
    *,
    reserved: int = 0,
) -> int:
    """The largest shuffle block (samples) whose shards fit in half of ``cache_bytes`` for the run's canonical nodes.

    At any point of an epoch, a canonical node reads from the shards whose shuffle window covers that point: about
    ``1.25 x block / samples_per_shard + 2`` of them. One node may read every canonical node at once (a run on one
    node), so the block is sized for all ``num_canonical_nodes`` together, within half the cache (the other half for
    the shards prefetched ahead and those still finishing). The engine's default block (262,144 samples) spans far
    more shards than a small cache holds, and evicts shards before their samples are used: measured 16 downloads
    per shard at a quarter cache, 1.0 with a fitted block. Capped at the engine's default; at least the largest
    shard (below it the engine's ``py1e`` leaves a shard's samples unshuffled, and warns): a cache too small for that
    warns here, naming the size that would fit. ``reserved``: the bytes of the user's ``cache_limit`` that are not in
    ``cache_bytes`` (the index, the downloads in flight): the warning speaks of ``cache_bytes + reserved``, the
    figure the user gave.

    Example:
        >>> block_size_for_cache([10] * 100, shard_bytes=1000, cache_bytes=40_000, num_canonical_nodes=1)
        144
    """
    sizes = np.asarray(samples_per_shard, dtype=np.int64)
    shards_fit = int(cache_bytes) // max(int(shard_bytes), 1)
    per_node = shards_fit // (2 * num_canonical_nodes) - 2
    block = int(per_node * float(sizes.mean()) / 1.25)
    smallest = math.ceil(int(sizes.max()) / 0.75) + 1
    if block < smallest:
        needed = 2 * num_canonical_nodes * (math.ceil(1.25 * smallest / float(sizes.mean())) + 2) * shard_bytes
        given, wanted = int(cache_bytes) + reserved, needed + reserved
        kept = f" ({reserved:,} of them kept for the index and the downloads in flight)" if reserved else ""
        warnings.warn(
            f"cache_limit={given:,} bytes{kept} holds {shards_fit} shards, too few for a shuffle across shards with "
            f"num_canonical_nodes={num_canonical_nodes}; using shuffle_block_size={smallest:,} (one shard). "
            f"cache_limit={wanted:,} bytes ({wanted - given:,} more; or fewer canonical nodes, or smaller shards) "
            "shuffles across shards",
            stacklevel=2,
        )
        return smallest
    return min(block, max(4_000_000 // num_canonical_nodes, 1 << 18))


# NOTE [ Cache limit: what the engine is given ]
# The engine checks ``cache_usage + shard <= cache_limit`` before a download but adds the shard's size only when it
# completes, so concurrent downloads on a node each pass the check and the directory overshoots (measured: +2.7
# shards with two ranks). gpufeed gives the engine ``cache_limit - downloaders x largest shard``, where each rank
# downloads from at most two threads (its prefetcher and a reader re-fetching an evicted shard): the directory then
# stays under the user's limit (polled in ``tests/stream/test_shards.py``). Local-only data takes no limit: its
# shards are the only copy and are never to be evicted (the engine's upstream release deleted them).
DOWNLOADERS_PER_RANK = 2


def engine_cache_limit(cache_limit: int, max_shard_bytes: int, ranks_per_node: int) -> int:
    """The limit the engine gets for a user's ``cache_limit`` (NOTE [ Cache limit: what the engine is given ])."""
    return cache_limit - DOWNLOADERS_PER_RANK * ranks_per_node * max_shard_bytes
