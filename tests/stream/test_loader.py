"""gf.stream / StreamLoader: the engine's order in whole global batches, each sample's pixels its own whatever rank or
batch serves it, elastic resume (2 ranks -> 1, 1 -> 2) bit-identical, the epoch contract (break, set_epoch, side
passes), a remote fetched under a cache limit, and the errors a user meets.

Every dataset here is :func:`~tests.stream.mds.write_photos`: real JPEGs and PNGs of different sizes whose label is
the sample's id, so a batch's labels say which samples it holds.
"""

from __future__ import annotations

import gc
import io
import threading
import warnings

import numpy as np
import pytest
import torch
import torchvision.transforms as T

import gpufeed as gf
from gpufeed import augment as A
from gpufeed.augment.keyed import KeyedDraws
from gpufeed.errors import ConfigError, DataError, StateError
from gpufeed.loading.stream import encoded_batch
from gpufeed.mds.plan import Layout
from gpufeed.mds.shards import Samples
from gpufeed.store.encoded import decode

from .mds import open_photos, photo, recipe, write_photos

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")

N = 90  # samples; shards of ~8 KB hold 4-10 of them
RECIPE = recipe()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_photos(tmp_path_factory.mktemp("photos") / "mds", N)


def _loader(data, world=1, rank=0, **kw):
    return open_photos(data, layout=Layout.of_rank(rank, world, 1), **kw)


def _served(loader, epoch=None, batches=None):
    """[(ids, images)] per batch; ``batches``: stop after that many (the iteration dropped there)."""
    if epoch is not None:
        loader.set_epoch(epoch)
    out = []
    for k, (x, y) in enumerate(loader):
        out.append((y.tolist(), x))
        if batches is not None and k + 1 == batches:
            break
    return out


def _by_id(served):
    return {i: x[j] for ids, x in served for j, i in enumerate(ids)}


def _alone(loader, i, epoch):
    """Sample ``i`` decoded and augmented on its own, with its keyed draws."""
    ids = np.array([i])
    x = decode(encoded_batch(Samples(ids, [photo(i)], np.array([i])), ids), torch.device("cpu"))
    return loader.transform(x, generator=KeyedDraws(loader.seed, epoch, torch.tensor([i])))[0]


def test_an_epoch_serves_the_engines_plan_in_whole_global_batches_a_new_order_each_epoch(photos):
    loader = _loader(photos, shuffle=True)
    assert len(loader) == N // 8  # 2 canonical nodes: the stream is 90 positions, 11 whole global batches
    epochs = []
    for epoch in (0, 1):
        plan = loader.epoch_plan(epoch)
        served = _served(loader)
        assert [ids for ids, _ in served] == plan.batches().tolist()
        assert all(x.shape == (8, 3, 12, 12) and x.dtype == torch.float32 for _, x in served)
        epochs.append([i for ids, _ in served for i in ids])
    assert len(set(epochs[0])) == 88 and epochs[0] != epochs[1] and loader.epoch == 2


def test_each_samples_pixels_are_its_own_keyed_draws_whatever_batch_serves_it(photos):
    loader = _loader(photos, shuffle=True)
    served = _served(loader, epoch=1)
    for i, x in list(_by_id(served).items())[::9]:
        assert torch.equal(x, _alone(loader, i, epoch=1)), f"sample {i}"
    again = _by_id(_served(loader, epoch=1))  # the same epoch again: the same pixels
    assert all(torch.equal(x, again[i]) for i, x in _by_id(served).items())
    other = _by_id(_served(loader, epoch=2))
    assert sum(not torch.equal(x, other[i]) for i, x in _by_id(served).items() if i in other) > 40


def test_a_stream_without_labels_serves_whole_batches_of_images_the_labelled_ones(photos):
    labelled = list(_loader(photos, shuffle=False))
    alone = list(_loader(photos, shuffle=False, label_key=None))
    assert len(alone) == len(labelled) and all(isinstance(x, torch.Tensor) and x.shape == (8, 3, 12, 12) for x in alone)
    assert all(torch.equal(x, y[0]) for x, y in zip(alone, labelled, strict=True))  # the batch, not its first image


@pytest.mark.parametrize("world", [2, 4])
def test_more_ranks_serve_the_same_global_batches_with_the_same_pixels_as_one(photos, world):
    one = _served(_loader(photos, shuffle=True), epoch=1)
    ranks = [_served(_loader(photos, world, r, shuffle=True), epoch=1) for r in range(world)]
    assert all(len(r) == len(one) for r in ranks)
    for k, (ids, _) in enumerate(one):
        assert sorted(i for r in ranks for i in r[k][0]) == sorted(ids), f"global batch {k}"
    pixels = _by_id(one)
    for r in ranks:
        assert all(torch.equal(x, pixels[i]) for i, x in _by_id(r).items())


@pytest.mark.parametrize(("saved_world", "resumed_world"), [(2, 1), (1, 2)])
def test_a_state_saved_at_one_world_size_resumes_at_another_with_the_remaining_samples_bit_identical(
    photos, saved_world, resumed_world
):
    whole = _served(_loader(photos, shuffle=True), epoch=1)
    saving = [_loader(photos, saved_world, r, shuffle=True) for r in range(saved_world)]
    first = [_served(loader, epoch=1, batches=3) for loader in saving]
    state = saving[-1].state_dict()  # any rank's state resumes every rank
    assert state["engine"]["epoch"] == 1 and state["engine"]["sample_in_epoch"] == 24
    resumed = []
    for r in range(resumed_world):
        loader = _loader(photos, resumed_world, r, shuffle=True)
        loader.load_state_dict(state)
        resumed.append(_served(loader))
    assert all(len(r) == len(whole) - 3 for r in resumed)
    for k, (ids, _) in enumerate(whole):
        got = [i for r in (first if k < 3 else resumed) for i in r[k if k < 3 else k - 3][0]]
        assert sorted(got) == sorted(ids), f"global batch {k}"
    pixels = _by_id(whole)
    for r in resumed:
        assert all(torch.equal(x, pixels[i]) for i, x in _by_id(r).items())


def test_a_break_then_a_saved_state_finishes_the_interrupted_epoch_and_stops_the_reader(photos):
    loader = _loader(photos, shuffle=True)
    whole = _served(loader, epoch=0)
    loader.set_epoch(0)
    for k, _ in enumerate(loader):
        if k == 4:
            break
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith(("gpufeed-stream-read", "gpufeed-stream-pre"))]
    state = loader.state_dict()
    assert (state["engine"]["epoch"], state["engine"]["sample_in_epoch"]) == (0, 40)
    assert [ids for ids, _ in _served(loader)] == [ids for ids, _ in _served(_loader(photos, shuffle=True), 1)]
    fresh = _loader(photos, shuffle=True)
    fresh.load_state_dict(state)
    rest = _served(fresh)
    assert [ids for ids, _ in rest] == [ids for ids, _ in whole[5:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, whole[5:], strict=True))
    assert fresh.epoch == 1


def test_a_side_pass_inside_the_loop_serves_the_same_epoch_and_moves_nothing(photos):
    loader = _loader(photos, shuffle=True)
    it = iter(loader)
    first = next(it)[1].tolist()
    side = next(iter(loader))[1].tolist()
    assert side == first and loader.state_dict()["engine"]["sample_in_epoch"] == 8
    assert len(list(it)) == len(loader) - 1


def test_set_epoch_with_a_batch_starts_part_way_as_the_engine_resumes(photos):
    loader = _loader(photos, shuffle=True)
    whole = _served(loader, epoch=2)
    loader.set_epoch(2, batch=6)
    part = _served(loader)
    assert [sorted(ids) for ids, _ in part] == [sorted(ids) for ids, _ in whole[6:]]
    pixels = _by_id(whole)
    assert all(torch.equal(x, pixels[i]) for i, x in _by_id(part).items())


def test_views_draw_their_own_pixels_and_the_first_view_is_the_single_views(photos):
    single = _by_id(_served(_loader(photos), epoch=0))
    loader = _loader(photos, views=2)
    (views, y), *_ = loader
    assert isinstance(views, list) and len(views) == 2
    assert all(torch.equal(views[0][j], single[i]) for j, i in enumerate(y.tolist()))
    assert not torch.equal(views[0], views[1])


def test_gpufeed_ops_dtype_and_channels_last_are_served_as_asked(photos):
    ops = A.Compose([A.RandomResizedCrop(10), A.RandomHorizontalFlip()])
    loader = _loader(photos, transform=ops, dtype=torch.float16, channels_last=True)
    x, y = next(iter(loader))
    assert x.dtype == torch.float16 and x.shape == (8, 3, 10, 10)
    assert x.is_contiguous(memory_format=torch.channels_last) and float(x.max()) <= 1.0
    assert "RandomResizedCrop" in str(loader.plan) and "global batch 8 = 1 rank(s) x 8" in str(loader.plan)


def test_a_state_of_another_seed_or_pipeline_is_refused_naming_it_and_strict_false_loads_it(photos):
    state = _loader(photos).state_dict()
    with pytest.raises(StateError, match="seed=3 .this run: 4."):
        _loader(photos, seed=4).load_state_dict(state)
    other = _loader(photos, transform=T.Compose([T.RandomResizedCrop(12), T.ToTensor()]))
    with pytest.raises(StateError, match="transform="):
        other.load_state_dict(state)
    other.load_state_dict(state, strict=False)
    with pytest.raises(StateError, match="global_batch_size=8 .this run: 16."):
        _loader(photos, global_batch_size=16).load_state_dict(state)


def test_a_streaming_dataloaders_five_keys_resume_at_their_position(photos):
    whole = _served(_loader(photos), epoch=1)
    loader = _loader(photos)
    keys = {"epoch": 1, "sample_in_epoch": 16, "num_canonical_nodes": 2, "shuffle_seed": 9176}
    loader.load_state_dict({**keys, "initial_physical_nodes": None})
    assert [ids for ids, _ in _served(loader)] == [ids for ids, _ in whole[2:]]


def test_a_saved_runs_order_settings_are_taken_over_and_a_differing_choice_is_warned_of(photos):
    state = _loader(photos, shuffle=True, shuffle_seed=11).state_dict()
    loader = _loader(photos, shuffle=True, shuffle_seed=12)
    with pytest.warns(UserWarning, match="shuffle_seed=11 .you passed 12."):
        loader.load_state_dict(state)
    assert loader.settings.shuffle_seed == 11
    expected = _loader(photos, shuffle=True, shuffle_seed=11).epoch_plan(0).ids
    assert np.array_equal(loader.epoch_plan(0).ids, expected)


def test_a_sample_that_is_no_image_fails_at_its_batch_naming_it_after_the_batches_before(tmp_path):
    data = write_photos(tmp_path / "mds", 40, bad=(21,))
    loader = _loader(data, shuffle=False)
    where = [k for k in range(len(loader)) if 21 in loader.epoch_plan(0).batch(k)][0]
    got = []
    with pytest.raises(DataError, match="sample 21"):
        for x, _ in loader:
            got.append(x)
    assert len(got) == where
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith("gpufeed-stream")]


def test_a_remote_directory_is_fetched_under_a_cache_limit_with_each_samples_pixels_unchanged(photos, tmp_path):
    pixels = _by_id(_served(_loader(photos, shuffle=True), epoch=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small cache's one-shard shuffle block is warned of
        loader = _loader(photos, remote=str(photos), local=tmp_path / "cache", cache_limit=120_000, shuffle=True)
    try:
        assert loader.settings.block_size < _loader(photos).settings.block_size  # fitted to the cache
        served = _served(loader, epoch=0)
        ids = [i for ids, _ in served for i in ids]
        assert len(served) == N // 8 and len(set(ids)) == len(ids) == 88
        assert all(torch.equal(x, pixels[i]) for i, x in _by_id(served).items() if i in pixels)
        assert "fetched from" in str(loader.plan) and "cache limit 120,000 bytes" in str(loader.plan)
    finally:
        loader.shards.close()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"transform": T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])}, "must start with RandomResizedCrop"),
        ({"transform": A.Compose([A.RandomHorizontalFlip()])}, "must start with RandomResizedCrop"),
        ({"transform": T.Compose([T.Resize(20), T.ToTensor()]), "drop_last": False}, "differ in size .*CenterCrop"),
        ({"batch_size": 4}, "not both or neither"),
        ({"global_batch_size": 7, "world": 2}, "not divisible by the world size 2"),
        ({"global_batch_size": 200}, "at least global_batch_size=200"),
        ({"num_classes": 10}, "sample .* has label .*num_classes=10"),
    ],
)
def test_mistakes_are_typed_errors_naming_the_argument(photos, kw, match):
    kw = dict(kw)
    world = kw.pop("world", 1)
    error = DataError if "num_classes" in kw or "drop_last" in kw else ConfigError
    with pytest.raises(error, match=match):
        list(_loader(photos, world, **kw))


EVAL = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))])


def _eval_loader(data, world=1, rank=0, **kw):
    return _loader(data, world, rank, transform=EVAL, shuffle=False, drop_last=False, **kw)


def test_an_evaluation_recipe_serves_the_engines_iteration_with_torchvisions_pixels(photos):
    from PIL import Image
    from streaming import StreamingDataset

    loader = _eval_loader(photos)
    served = _served(loader)
    engine = StreamingDataset(local=str(photos), batch_size=8, shuffle=False, num_canonical_nodes=2)
    try:
        expected = [int(sample["label"]) for sample in engine]
    finally:
        del engine
    assert [i for ids, _ in served for i in ids] == expected and len(expected) == N
    assert [len(ids) for ids, _ in served] == [8] * 11 + [2] and len(loader) == 12
    for i, x in list(_by_id(served).items())[::7]:
        with Image.open(io.BytesIO(photo(i))) as im:
            assert torch.equal(x, EVAL(im.convert("RGB"))), f"sample {i}"
    assert "per sample, as torchvision runs them" in str(loader.plan)


def test_an_evaluation_epoch_over_ranks_gives_every_rank_as_many_batches_and_every_sample_once_or_more(photos):
    ranks = [_served(_eval_loader(photos, 4, r)) for r in range(4)]
    counts = {len(r) for r in ranks}
    ids = [i for r in ranks for batch, _ in r for i in batch]
    # the engine pads every rank to 23 samples (92 for 90: two repeats), in batches of 2: 11 whole and one of 1
    assert counts == {12} and set(ids) == set(range(N)) and len(ids) == 92
    assert [len(r[-1][0]) for r in ranks] == [1, 1, 1, 1]
    # its repeats come last in a rank's share, and real_counts says so: scoring x[:n] scores every sample once
    real = [_eval_loader(photos, 4, r).real_counts for r in range(4)]
    scored = [i for r, counts in zip(ranks, real, strict=True) for (batch, _), n in zip(r, counts, strict=True)
              for i in batch[:n]]  # fmt: skip
    assert sorted(scored) == list(range(N)) and sum(map(sum, real)) == N


def test_a_small_evaluation_set_serves_every_sample_and_a_ragged_per_sample_part_batches(tmp_path):
    data = write_photos(tmp_path / "mds", 9)
    ranks = [_eval_loader(data, 2, r, global_batch_size=16) for r in range(2)]  # fewer samples than a batch
    served = [[i for _, y in loader for i in y.tolist()] for loader in ranks]
    assert sorted(set(served[0] + served[1])) == list(range(9)) and len(served[0]) == len(served[1])
    recipe = T.Compose([T.Resize(20), T.RandomResizedCrop(12), T.ToTensor()])  # sizes differ until the crop
    with _loader(data, transform=recipe, drop_last=False, shuffle=False) as loader:
        x, y = next(iter(loader))
        assert x.shape == (8, 3, 12, 12) and y.tolist() == loader.epoch_plan(0).batch(0).tolist()
    assert loader.shards.closed


def test_an_evaluation_state_resumes_the_rest_of_the_epoch(photos):
    whole = _served(_eval_loader(photos))
    loader = _eval_loader(photos)
    for k, _ in enumerate(loader):
        if k == 4:
            break
    fresh = _eval_loader(photos)
    fresh.load_state_dict(loader.state_dict())
    rest = _served(fresh)
    assert [ids for ids, _ in rest] == [ids for ids, _ in whole[5:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, whole[5:], strict=True))


def test_a_streaming_dataset_given_to_accelerate_is_refused_naming_the_stream_call(photos, tmp_path):
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=str(photos), batch_size=8, shuffle=True, shuffle_seed=5)
    with pytest.raises(ConfigError, match=rf"gpufeed\.stream\(remote=None, local='{photos}', .*shuffle_seed=5"):
        gf.accelerate(dataset)
    del dataset


def test_a_streaming_dataset_or_a_subset_of_one_passed_as_data_names_the_stream_call(photos):
    from streaming import StreamingDataset
    from torch.utils.data import Subset

    dataset = StreamingDataset(local=str(photos), batch_size=8)
    try:
        with pytest.raises(ConfigError, match=r"gpufeed\.stream\(remote=None, local="):
            gf.stream(dataset, transform=RECIPE, batch_size=8)
        with pytest.raises(ConfigError, match=r"gpufeed\.stream\(remote=None, local="):
            gf.accelerate(Subset(dataset, range(40)))
    finally:
        del dataset
    with pytest.raises(ConfigError, match="download_retry=0"):
        _loader(photos, download_retry=0)


def test_a_served_batch_that_views_the_decoded_images_is_not_overwritten_by_the_next(photos):
    # The reader decodes each batch into a buffer handed back for a later batch once the transform's output is
    # served; an output that is a view of that buffer keeps it (hostmem.Recycled): earlier batches stay as served.
    class FirstPixels(A.BatchTransform):
        ragged_input = one_size_output = True
        random = False

        def apply(self, x, params):
            return x.data[: len(x) * 12].view(len(x), 3, 2, 2)  # a view of the decoded images' buffer

    loader = _loader(photos, transform=FirstPixels(), dtype=None)
    kept, copies = [], []
    for x, _ in loader:
        kept.append(x)
        copies.append(x.clone())
    assert len(kept) == len(loader) and all(torch.equal(a, b) for a, b in zip(kept, copies, strict=True))


def test_each_images_header_is_read_once_and_later_epochs_take_its_size_from_then(photos, monkeypatch):
    import gpufeed.loading.stream as stream

    read = []

    def counted(source, name):
        read.append(name)
        return header_shape(source, name)

    header_shape = stream.header_shape
    monkeypatch.setattr(stream, "header_shape", counted)
    loader = _loader(photos, shuffle=True)
    first = _by_id(_served(loader, epoch=1))
    assert len(read) == len(set(read)) == 88  # the two probed at construction are among the epoch's
    again = _by_id(_served(loader, epoch=1))
    assert len(read) == 88 and all(torch.equal(x, again[i]) for i, x in first.items())
    monkeypatch.setattr(stream, "_KNOWN_SIZES", N - 1)  # a dataset too large to keep its sizes: read each time
    read.clear()
    large = _loader(photos, shuffle=True)
    assert all(torch.equal(x, first[i]) for i, x in _by_id(_served(large, epoch=1)).items())
    assert len(read) == 2 + 88 and large._shapes is None
