"""The stream state: JSON-able, the engine's five keys inside; resumed at another world size it serves exactly what
the uninterrupted run had left; a state of other data, batch size or seed is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpufeed.errors import StateError
from gpufeed.mds.index import Index
from gpufeed.mds.plan import Layout, StreamSettings, plan_epoch
from gpufeed.mds.state import ENGINE_KEYS, FORMAT, load_stream_state, stream_state

from .mds import write_mds

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")

SIZES = np.array([37, 41, 29, 40, 33, 38, 31, 35, 39, 34], dtype=np.int64)  # 357 samples
SETTINGS = StreamSettings(32, 4, shuffle=True, shuffle_seed=7, shuffle_block_size=64)
FP = "f" * 40


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_mds(tmp_path_factory.mktemp("state") / "mds", 300)


def _global(settings, nodes, ranks, epoch, sample_in_epoch=0, initial=None, sizes=SIZES) -> list[frozenset[int]]:
    """Global batches (as sets) of an epoch from a position, for a layout."""
    plans = [
        plan_epoch(sizes, settings, Layout.of_rank(r, nodes * ranks, ranks), epoch, sample_in_epoch, initial)
        for r in range(nodes * ranks)
    ]
    return [frozenset(np.concatenate([p.batch(k) for p in plans]).tolist()) for k in range(plans[0].num_batches)]


def _save(settings, *, epoch, done_batches, initial, seed=0):
    """A state after ``done_batches`` global batches of ``epoch``, through JSON as a checkpoint would be."""
    plan = plan_epoch(SIZES, settings, Layout(), epoch)
    state = stream_state(
        settings,
        epoch=epoch,
        sample_in_epoch=plan.sample_in_epoch_after(done_batches),
        initial_physical_nodes=initial,
        fingerprint=FP,
        num_samples=357,
        seed=seed,
    )
    return json.loads(json.dumps(state))


def test_the_state_is_json_and_nests_exactly_the_engines_five_keys():
    state = _save(SETTINGS, epoch=2, done_batches=3, initial=2)
    assert state["format"] == FORMAT and state["global_batch_size"] == 32 and state["seed"] == 0
    assert state["engine"] == {
        "epoch": 2,
        "sample_in_epoch": 96,
        "num_canonical_nodes": 4,
        "shuffle_seed": 7,
        "initial_physical_nodes": 2,
    }
    assert tuple(state["engine"]) == ENGINE_KEYS
    assert state["dataset"] == {"fingerprint": FP, "samples": 357}


@pytest.mark.parametrize(
    "saved, resumed", [((1, 2), (1, 1)), ((1, 1), (1, 2)), ((2, 2), (1, 4)), ((1, 4), (2, 1))], ids=str
)
def test_a_state_saved_at_one_world_size_resumes_at_another_with_exactly_the_remaining_batches(saved, resumed):
    whole = _global(SETTINGS, *saved, epoch=1)
    state = _save(SETTINGS, epoch=1, done_batches=4, initial=saved[0])
    resume = load_stream_state(state, SETTINGS, fingerprint=FP, num_samples=357, seed=0)
    assert (resume.epoch, resume.sample_in_epoch, resume.initial_physical_nodes) == (1, 128, saved[0])
    rest = _global(resume.settings, *resumed, resume.epoch, resume.sample_in_epoch, resume.initial_physical_nodes)
    assert rest == whole[4:]
    # and the next epoch is the uninterrupted run's next epoch
    assert _global(resume.settings, *resumed, 2, initial=resume.initial_physical_nodes) == _global(SETTINGS, *saved, 2)


def test_a_run_started_on_4_nodes_resumes_on_3_through_the_engines_relaxed_partition():
    settings = StreamSettings(12, 4, shuffle=True, shuffle_seed=1, shuffle_block_size=64)
    whole = _global(settings, 4, 1, epoch=0)
    state = stream_state(
        settings, epoch=0, sample_in_epoch=5 * 12, initial_physical_nodes=4, fingerprint=FP, num_samples=357, seed=0
    )
    resume = load_stream_state(state, settings, fingerprint=FP, num_samples=357, seed=0)
    assert _global(settings, 3, 1, 0, resume.sample_in_epoch, resume.initial_physical_nodes) == whole[5:]


@pytest.mark.parametrize(
    "change, says",
    [
        ({"global_batch_size": 64}, "global_batch_size=32 (this run: 64)"),
        ({"seed": 1}, "seed=0 (this run: 1)"),
        ({"fingerprint": "e" * 40}, "index ffffffffffff (this run: 357 samples, index eeeeeeeeeeee)"),
        ({"num_samples": 300}, "dataset 357 samples"),
    ],
)
def test_a_state_of_another_batch_size_seed_or_dataset_is_refused_saying_what_differs(change, says):
    state = _save(SETTINGS, epoch=0, done_batches=2, initial=1)
    settings = StreamSettings(change.get("global_batch_size", 32), 4, shuffle=True, shuffle_seed=7)
    with pytest.raises(StateError, match="state was saved with") as caught:
        load_stream_state(
            state,
            settings,
            fingerprint=change.get("fingerprint", FP),
            num_samples=change.get("num_samples", 357),
            seed=change.get("seed", 0),
        )
    assert says in str(caught.value)


def test_the_saved_runs_order_settings_are_adopted_and_named():
    state = _save(SETTINGS, epoch=0, done_batches=2, initial=1)
    mine = StreamSettings(32, 2, shuffle=True, shuffle_seed=3)
    resume = load_stream_state(state, mine, fingerprint=FP, num_samples=357, seed=0)
    assert resume.settings == SETTINGS
    assert resume.adopted == {
        "num_canonical_nodes": (2, 4),
        "shuffle_seed": (3, 7),
        "shuffle_block_size": (2_000_000, 64),
    }


def test_what_is_not_a_stream_state_is_refused():
    with pytest.raises(StateError, match="not the dict a stream loader's state_dict"):
        load_stream_state([1, 2], SETTINGS, fingerprint=FP, num_samples=357, seed=0)
    with pytest.raises(StateError, match=r"state has keys \['batch', 'epoch'\]"):
        load_stream_state({"epoch": 0, "batch": 3}, SETTINGS, fingerprint=FP, num_samples=357, seed=0)
    with pytest.raises(StateError, match="format='gpufeed.cache/1' is not"):
        load_stream_state({"format": "gpufeed.cache/1"}, SETTINGS, fingerprint=FP, num_samples=357, seed=0)
    engine_only = {"epoch": 0, "sample_in_epoch": 40, "num_canonical_nodes": 4, "shuffle_seed": 7}
    with pytest.raises(StateError, match=r"\['sample_in_epoch'\]=40 is not a multiple of global_batch_size=32"):
        load_stream_state(engine_only, SETTINGS, fingerprint=FP, num_samples=357, seed=0)
    with pytest.raises(StateError, match=r"\['epoch'\]=-1 must be an int >= 0"):
        load_stream_state({**engine_only, "epoch": -1}, SETTINGS, fingerprint=FP, num_samples=357, seed=0)


def _engine(data, world=1):
    from streaming import StreamingDataset

    return StreamingDataset(
        local=str(data),
        batch_size=32 // world,
        num_canonical_nodes=4,
        shuffle=True,
        shuffle_seed=7,
        shuffle_block_size=64,
    )


def test_a_streaming_dataloaders_state_resumes_where_the_engine_itself_resumes(data):
    from streaming import StreamingDataLoader

    loader = StreamingDataLoader(_engine(data), batch_size=32)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    saved = json.loads(json.dumps(loader.state_dict()))
    assert set(saved) == set(ENGINE_KEYS) and saved["sample_in_epoch"] == 96
    index = Index.load(data / "index.json")
    resume = load_stream_state(
        saved, StreamSettings(32, 1), fingerprint=index.fingerprint, num_samples=index.num_samples, seed=0
    )
    assert resume.adopted["num_canonical_nodes"] == (1, 4) and resume.adopted["shuffle_seed"] == (9176, 7)
    resume = load_stream_state(saved, SETTINGS, fingerprint=index.fingerprint, num_samples=300, seed=0)
    plan = plan_epoch(index.samples_per_shard, resume.settings, Layout(), resume.epoch, resume.sample_in_epoch)
    fresh = _engine(data)
    fresh.load_state_dict(saved)
    engine_rest = [int(s["idx"]) for s in fresh]
    assert plan.ids.tolist() == engine_rest[: len(plan.ids)]
    assert plan.tail.tolist() == engine_rest[len(plan.ids) :]


def test_the_engines_stale_epoch_trap_cannot_happen_since_gpufeed_passes_the_position_itself(data):
    ds = _engine(data)
    uninterrupted = [int(s["idx"]) for s in _engine(data)]
    for k, _ in enumerate(ds):  # e.g. a sanity pass over the first batches, then the resume
        if k == 63:
            break
    state = {
        "epoch": 0,
        "sample_in_epoch": 64,
        "num_canonical_nodes": 4,
        "shuffle_seed": 7,
        "initial_physical_nodes": 1,
    }
    ds.load_state_dict(state)
    after = [int(s["idx"]) for s in ds]
    # the engine: its shared epoch counter already says 1, so the state is "stale" and silently ignored: a whole
    # epoch 1 instead of the rest of epoch 0
    assert len(after) == 300 and after[:10] != uninterrupted[64:74]
    index = Index.load(data / "index.json")
    resume = load_stream_state(state, SETTINGS, fingerprint=index.fingerprint, num_samples=300, seed=0)
    plan = plan_epoch(index.samples_per_shard, resume.settings, Layout(), resume.epoch, resume.sample_in_epoch)
    assert plan.ids.tolist() == uninterrupted[64 : 64 + len(plan.ids)]
    assert len(plan.ids) == 300 // 32 * 32 - 64
