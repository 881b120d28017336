"""The plan: each rank's ids equal the engine's own iteration; global batches are the same sets in every layout; the
tail is cut to whole global batches on every rank."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

from gpufeed.errors import ConfigError
from gpufeed.mds import engine
from gpufeed.mds.index import Index
from gpufeed.mds.plan import (
    Layout,
    StreamSettings,
    block_size_for_cache,
    plan_epoch,
    plan_work,
    rank_order,
    stream_length,
)

from .mds import write_mds

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")

SETTINGS = StreamSettings(32, 4, shuffle=True, shuffle_seed=7, shuffle_block_size=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_mds(tmp_path_factory.mktemp("plan") / "mds", 300)


def _sizes(data: Path) -> np.ndarray:
    return Index.load(data / "index.json").samples_per_shard


def _engine(data: Path, settings: StreamSettings, world_size: int):
    from streaming import StreamingDataset

    return StreamingDataset(
        local=str(data),
        batch_size=settings.global_batch_size // world_size,
        num_canonical_nodes=settings.num_canonical_nodes,
        shuffle=settings.shuffle,
        shuffle_seed=settings.shuffle_seed,
        shuffle_algo=settings.shuffle_algo,
        shuffle_block_size=settings.shuffle_block_size,
    )


def _engine_iterates(ds, layout: Layout, epoch: int) -> list[int]:
    """The engine's own iteration (its partition, shared memory, threads) as rank ``layout.rank``, in one process:
    the rank's world for the order only (the engine's ``replication`` uses the same split), this process alone in its
    barriers."""
    from streaming.base.world import World

    ds._parallel_rank_world = World(layout.num_nodes, layout.ranks_per_node, 1, layout.rank)
    ds.next_epoch = epoch
    return [int(s["idx"]) for s in ds]


@pytest.mark.parametrize(
    "settings",
    [SETTINGS, StreamSettings(32, 2, shuffle=True, shuffle_algo="py1s"), StreamSettings(32, 3)],
    ids=["py1e", "py1s", "unshuffled"],
)
def test_one_rank_serves_what_the_engines_own_iteration_yields_in_each_epoch(data, settings):
    ds = _engine(data, settings, 1)
    orders = []
    for epoch in range(3):
        seen = [int(s["idx"]) for s in ds]  # a plain iteration: the engine's shared epoch counter advances
        planned = rank_order(plan_work(_sizes(data), settings, 1, 1, epoch), Layout())
        assert seen == planned.tolist()
        orders.append(seen)
    assert sorted(orders[0]) == list(range(300))
    assert (orders[0] != orders[1]) == settings.shuffle


@pytest.mark.parametrize("nodes, ranks", [(1, 2), (1, 4), (2, 2)])
def test_every_rank_of_a_simulated_layout_serves_what_the_engine_iterates_as_that_rank(data, nodes, ranks):
    ds = _engine(data, SETTINGS, nodes * ranks)
    for epoch in (0, 1):
        work = plan_work(_sizes(data), SETTINGS, nodes, ranks, epoch)
        for rank in range(nodes * ranks):
            layout = Layout.of_rank(rank, nodes * ranks, ranks)
            assert _engine_iterates(ds, layout, epoch) == rank_order(work, layout).tolist()


def test_a_resumed_rank_serves_what_the_engine_serves_after_load_state_dict(data):
    ds = _engine(data, SETTINGS, 4)
    state = {
        "epoch": 1,
        "sample_in_epoch": 96,
        "num_canonical_nodes": 4,
        "shuffle_seed": 7,
        "initial_physical_nodes": 2,
    }
    work = plan_work(_sizes(data), SETTINGS, 2, 2, epoch=1, sample_in_epoch=96, initial_physical_nodes=2)
    for rank in range(4):
        ds.load_state_dict(state)
        layout = Layout.of_rank(rank, 4, 2)
        assert _engine_iterates(ds, layout, 1) == rank_order(work, layout).tolist()


# ---- elastic: planning alone, any layout in one process ----

SIZES = np.array([37, 41, 29, 40, 33, 38, 31, 35, 39, 34], dtype=np.int64)  # 357 samples in 10 shards


def _global_batches(settings, nodes, ranks, epoch, sample_in_epoch=0, initial=None) -> list[frozenset[int]]:
    plans = [
        plan_epoch(SIZES, settings, Layout.of_rank(r, nodes * ranks, ranks), epoch, sample_in_epoch, initial)
        for r in range(nodes * ranks)
    ]
    assert len({p.num_batches for p in plans}) == 1, "every rank serves the same number of batches"
    return [frozenset(np.concatenate([p.batch(k) for p in plans]).tolist()) for k in range(plans[0].num_batches)]


@pytest.mark.parametrize("epoch", [0, 1])
def test_global_batches_are_the_same_sets_with_1_2_and_4_ranks_and_2_nodes_of_2(epoch):
    one = _global_batches(SETTINGS, 1, 1, epoch)
    assert len(one) == stream_length(357, 4) // 32 == 11
    assert all(len(b) == 32 for b in one)
    for nodes, ranks in [(1, 2), (1, 4), (2, 2), (4, 1)]:
        assert _global_batches(SETTINGS, nodes, ranks, epoch) == one
    assert _global_batches(SETTINGS, 1, 1, epoch + 1) != one


def test_the_tail_the_engine_repeats_and_leaves_ragged_is_cut_to_whole_global_batches_on_every_rank():
    # 357 samples, ncn=1, 7 ranks of 2 (global batch 14): the engine gives every rank 51 ids (357 / 7), the last
    # per-rank batch ragged (1 of 2); gpufeed serves 25 whole global batches (350 samples), 1 id per rank left over
    settings = StreamSettings(14, 1, shuffle=True, shuffle_seed=3, shuffle_block_size=64)
    work = plan_work(SIZES, settings, 1, 7, epoch=0)
    raw = [rank_order(work, Layout.of_rank(r, 7, 7)) for r in range(7)]
    assert [len(r) for r in raw] == [51] * 7
    assert sorted(np.concatenate(raw).tolist()) == list(range(357))
    plans = [plan_epoch(SIZES, settings, Layout.of_rank(r, 7, 7), 0) for r in range(7)]
    assert [(p.num_batches, len(p.ids), len(p.tail)) for p in plans] == [(25, 50, 1)] * 7
    for p, r in zip(plans, raw, strict=True):
        assert np.array_equal(np.concatenate([p.ids, p.tail]), r)
    served = np.concatenate([p.ids for p in plans])
    assert len(set(served.tolist())) == 350


def test_a_last_batch_the_engine_fills_with_repeats_in_one_layout_is_cut_in_every_layout():
    # 318 samples, global batch 32: 9 whole global batches and 30 samples. With 4 ranks the engine pads each rank
    # to 80 (2 repeats), which makes a 10th batch of 8 on every rank; with 1 rank it is ragged (30 of 32). A 10th
    # global batch would exist on 4 ranks and not on 1: gpufeed cuts both at 9.
    sizes = np.array([32] * 9 + [30])
    settings = StreamSettings(32, 1)
    four = plan_work(sizes, settings, 1, 4, epoch=0)
    assert four.shape == (1, 4, 10, 8) and (four != -1).all()
    assert [plan_epoch(sizes, settings, Layout.of_rank(r, 4, 4), 0).num_batches for r in range(4)] == [9] * 4
    assert plan_epoch(sizes, settings, Layout(), 0).num_batches == 9


def test_a_plan_from_a_position_holds_the_remaining_global_batches_of_the_epoch():
    whole = _global_batches(SETTINGS, 1, 2, 0)
    assert _global_batches(SETTINGS, 1, 4, 0, sample_in_epoch=3 * 32) == whole[3:]
    plan = plan_epoch(SIZES, SETTINGS, Layout.of_rank(0, 2, 2), 0, 3 * 32)
    assert plan.sample_in_epoch_after(2) == 5 * 32


# ---- settings and layouts refused ----


def test_a_global_batch_that_the_world_size_does_not_divide_is_refused():
    with pytest.raises(ConfigError, match=r"global_batch_size=30 is not divisible by the world size 4"):
        plan_epoch(SIZES, StreamSettings(30, 4), Layout.of_rank(0, 4, 4), 0)


def test_a_node_count_that_does_not_fit_the_canonical_nodes_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"num_canonical_nodes=4 and 3 nodes: one must divide the other"):
        plan_epoch(SIZES, StreamSettings(12, 4), Layout.of_rank(0, 3, 1), 0)


def test_a_position_inside_a_global_batch_is_refused():
    with pytest.raises(ConfigError, match=r"sample_in_epoch=40 is not a multiple of global_batch_size=32"):
        plan_epoch(SIZES, SETTINGS, Layout(), 0, sample_in_epoch=40)


def test_a_layout_from_the_environment_needs_the_local_world_size():
    assert Layout.from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}) == Layout(2, 4, 1, 1)
    assert Layout.from_env({}) == Layout()
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE is not set: launch with torchrun"):
        Layout.from_env({"RANK": "1", "WORLD_SIZE": "2"})


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ConfigError, match="shuffle_algo='py9' is not one of"):
        StreamSettings(32, 1, shuffle_algo="py9")
    with pytest.raises(ConfigError, match="num_canonical_nodes=0 must be >= 1"):
        StreamSettings(32, 0)


# ---- the shuffle block for a cache ----


def test_the_shuffle_block_fits_half_the_cache_and_warns_when_not_even_one_shard_fits():
    # 40 shards of 1,000 bytes fit; half of them over 2 canonical nodes, minus 2 shards each: 8 shards of 10 samples
    assert block_size_for_cache([10] * 100, 1000, 40_000, 2) == 64
    assert block_size_for_cache([10] * 100, 1000, 10**12, 1) == 4_000_000  # capped at the engine default
    with pytest.warns(UserWarning, match=r"holds 8 shards, too few .* using shuffle_block_size=15"):
        assert block_size_for_cache([10] * 100, 1000, 8000, 2) == 15
    # in the figure the user gave: the engine's 8,000 bytes plus the 2,000 gpufeed keeps back; 16,000 would fit
    said = r"cache_limit=10,000 bytes \(2,000 of them kept .*\) holds 8 shards.* cache_limit=18,000 bytes \(8,000 more"
    with pytest.warns(UserWarning, match=said):
        assert block_size_for_cache([10] * 100, 1000, 8000, 2, reserved=2000) == 15


# ---- the engine is optional ----


def test_a_missing_engine_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "streaming", None)
    engine.streaming.cache_clear()
    try:
        with pytest.raises(engine.EngineMissingError, match=r"pip install 'gpufeed\[streaming\]'") as caught:
            plan_work(SIZES, SETTINGS, 1, 1, 0)
        assert isinstance(caught.value, ImportError) and isinstance(caught.value, ConfigError)
    finally:
        engine.streaming.cache_clear()


def test_an_engine_release_older_than_supported_is_refused(monkeypatch):
    versions = {"streaming-community": "0.14.1"}

    def version(name):
        if name not in versions:
            raise engine.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(engine.metadata, "version", version)
    engine.streaming.cache_clear()
    try:
        with pytest.raises(
            engine.EngineMissingError,
            match=r"streaming-community==0.14.1 is older than gpufeed supports \(streaming-community>=0.14.2\)",
        ):
            engine.streaming()
    finally:
        engine.streaming.cache_clear()


def test_no_module_of_gpufeed_stream_imports_the_engine_at_import_time():
    # `import streaming` takes seconds and pulls transformers: only inside functions
    package = Path(engine.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            module = node.module if isinstance(node, ast.ImportFrom) else None
            assert not any(n.split(".")[0] == "streaming" for n in names + [module or ""]), path.name


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_an_index_with_an_empty_shard_is_planned_as_the_engine_iterates_it(tmp_path):
    # MDSWriter leaves an empty first shard when a sample is larger than size_limit; the engine shuffles no unit
    # for it, and neither may gpufeed
    data = write_mds(tmp_path / "mds", 40, size_limit=1)
    sizes = _sizes(data)
    assert sizes[0] == 0 and len(sizes) == 41
    settings = StreamSettings(8, 2, shuffle=True, shuffle_seed=4, shuffle_block_size=4)
    ds = _engine(data, settings, 1)
    for epoch in (0, 1):
        assert [int(s["idx"]) for s in ds] == rank_order(plan_work(sizes, settings, 1, 1, epoch), Layout()).tolist()
