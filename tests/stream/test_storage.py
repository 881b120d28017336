"""Storage faults of a stream's remote: down, frozen, a deleted shard. Each is a StorageError naming the shard, the
remote and the fix, raised in the batch that needed the shard; the wait for it is bounded by ``download_timeout``
(the engine's attempts and the client's retries inside it); the loader's state then resumes the epoch.

The remote is an S3 endpoint stub on the loopback address (``s3stub.py``: it freezes, 404s or goes down on demand),
or a directory."""

from __future__ import annotations

import re
import shutil
import threading
import time

import numpy as np
import pytest

import gpufeed as gf
from gpufeed.errors import ConfigError, StorageError
from gpufeed.mds.prefetch import Prefetcher
from gpufeed.mds.shards import Shards

from .mds import payload, recipe, write_mds, write_photos
from .s3stub import S3Stub

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")
pytest.importorskip("boto3", reason="the engine's S3 client: pip install boto3")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_photos(tmp_path_factory.mktemp("storage") / "photos", 96, size_limit=4096)  # ~50 shards


@pytest.fixture
def stub(photos, monkeypatch):
    served = S3Stub(photos)
    for k, v in served.env.items():
        monkeypatch.setenv(k, v)
    yield served
    served.stop()


def _stream(remote: str, local, **kw):
    settings = {"global_batch_size": 8, "transform": recipe(), "device": "cpu", "shuffle": False}
    return gf.stream(remote, local, num_canonical_nodes=1, ahead=1, prefetch_shards=2, **{**settings, **kw})


def _first_batch_needing(loader, shard: int) -> int:
    plan = loader.epoch_plan(0)
    where = loader.shards.index.locate(plan.ids)[0]
    return int(np.flatnonzero(where == shard)[0]) // plan.batch_size


def test_a_remote_that_goes_down_mid_epoch_is_a_storage_error_and_the_state_resumes_the_epoch(
    stub, photos, tmp_path, monkeypatch
):
    loader = _stream(stub.url(), tmp_path / "cache", download_retry=1, download_timeout=30)
    expected = loader.epoch_plan(0).ids[: len(loader) * 8].tolist()
    served: list[int] = []
    it = iter(loader)
    for _ in range(2):
        served += next(it)[1].tolist()
    stub.stop()  # connections refused from here: botocore's EndpointConnectionError
    with pytest.raises(StorageError) as failed:
        for _, y in it:
            served += y.tolist()
    text = str(failed.value)
    shard = int(re.search(r"shard shard\.(\d{5})\.mds \(samples", text).group(1))  # type: ignore[union-attr]
    assert f"could not be fetched from s3://bucket/shard.{shard:05d}.mds into {tmp_path / 'cache'}" in text
    assert "the remote could not be reached (EndpointConnectionError" in text and "S3_ENDPOINT_URL" in text
    assert "state_dict()" in text and "load_state_dict(state)" in text
    assert 2 <= len(served) // 8 <= _first_batch_needing(loader, shard)  # raised in the batch that needed it
    state = loader.state_dict()
    assert state["engine"]["sample_in_epoch"] == len(served)
    again = S3Stub(photos)  # the remote is back (at another port)
    try:
        for k, v in again.env.items():
            monkeypatch.setenv(k, v)
        resumed = _stream(again.url(), tmp_path / "cache", download_retry=2, download_timeout=60)
        resumed.load_state_dict(state)
        rest = [i for _, y in resumed for i in y.tolist()]
    finally:
        again.stop()
    assert served + rest == expected  # the epoch, each sample once, in order


def test_a_frozen_remote_is_raised_after_download_timeout_however_many_retries(stub, tmp_path):
    # unbounded, this read waited 3 engine attempts x 3 botocore attempts x 1 s (and the backoffs): about 12 s.
    # No clock is read (a loaded machine must not fail it): the engine's download of each frozen shard is held until
    # the test lets it go, so a read can raise only by giving up on a download still going; one that waited for the
    # download would wait for the release, a bound only a hang meets
    shards = Shards(tmp_path / "cache", stub.url(), download_timeout=1.0, download_retry=3)
    frozen, later = shards.index.basenames[5], shards.index.basenames[9]
    stub.faults[frozen] = stub.faults[later] = "frozen"
    started, released = [], threading.Event()
    prepare = shards._ds.prepare_shard

    def held(shard, *args, **kwargs):
        if shard not in (5, 9):
            return prepare(shard, *args, **kwargs)
        started.append(shard)
        try:
            return prepare(shard, *args, **kwargs)
        finally:
            released.wait()

    shards._ds.prepare_shard = held
    hang = threading.Timer(300, released.set)
    hang.start()
    try:
        with pytest.raises(StorageError, match=rf"shard {frozen} .*the remote did not answer in time .*timeout=1 s"):
            shards.read([int(shards.index.starts[5])])
        assert not released.is_set() and started == [5]  # given up on the one download, still going
        # a shard the prefetcher could not fetch is raised by the read that needs it, without a second wait: a
        # second wait would now last an hour (the release comes first, and fails the test)
        ids = list(range(int(shards.index.starts[9]), int(shards.index.ends[9])))
        with Prefetcher(shards, ids, ahead=1) as ahead:
            deadline = time.monotonic() + 60  # a bound only a hang meets
            while not ahead.failed and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ahead.failed and ahead.error is None
            ahead.advance(0)  # nothing raised here: the read raises it
            shards._downloads.timeout = 3600.0
            with pytest.raises(StorageError, match=rf"shard {later} .*did not answer in time"):
                shards.read(ids)
        assert not released.is_set() and started == [5, 9]  # the prefetcher's download, kept: none other
    finally:
        released.set()
        hang.cancel()
    shards.close()


@pytest.mark.parametrize("remote", ["s3", "directory"])
def test_a_deleted_shard_is_a_storage_error_in_the_batch_that_needs_it(remote, stub, photos, tmp_path):
    victim = 20
    if remote == "s3":
        url = stub.url()
        stub.faults[f"shard.{victim:05d}.mds"] = "missing"  # the client's ClientError 404
    else:
        url = str(shutil.copytree(photos, tmp_path / "remote"))
        (tmp_path / "remote" / f"shard.{victim:05d}.mds").unlink()  # the engine's FileNotFoundError
    loader = _stream(url, tmp_path / "cache", download_retry=1, download_timeout=30)
    served = []
    with pytest.raises(StorageError) as failed:
        for _, y in loader:
            served.append(y)
    text = str(failed.value)
    assert f"shard shard.{victim:05d}.mds (samples " in text and f"from {url}/shard.{victim:05d}.mds" in text
    assert "the remote has no such object" in text and "upload the shard again" in text
    assert len(served) == _first_batch_needing(loader, victim)
    assert loader.state_dict()["engine"]["sample_in_epoch"] == 8 * len(served)
    loader.close()


def test_a_users_own_mds_on_s3_without_gpufeed_json_is_served(stub, tmp_path):
    # the client answers 404 for the absent gpufeed.json (a ClientError, not FileNotFoundError): no metadata
    with Shards(tmp_path / "cache", stub.url()) as shards:
        assert shards.meta == {} and shards.classes is None and not shards.verify
        assert shards.read([3]).labels.tolist() == [3]


def test_the_engines_eviction_error_is_a_config_error_naming_the_cache_limit(tmp_path, monkeypatch):
    data = write_mds(tmp_path / "mds", 40)
    shards = Shards(tmp_path / "cache", str(data))

    def full(shard: int, blocking: bool = True) -> None:
        raise ValueError("Attempted shard eviction, but there are no shards present locally to evict.")

    monkeypatch.setattr(shards._ds, "prepare_shard", full)
    with pytest.raises(ConfigError, match=r"shard shard.00003.mds does not fit in local=.*give each job its own"):
        shards.prepare(3)
    monkeypatch.undo()
    assert shards.read([39]).images == [payload(39)]
    shards.close()


def test_an_index_the_remote_no_longer_gives_is_read_from_local_with_a_warning_not_silently(stub, tmp_path):
    # the remote's index gone (a deleted dataset, a wrong prefix, an expired credential): local's copy was used
    # without a word, however stale
    with Shards(tmp_path / "cache", stub.url()) as shards:
        first = shards.read([3, 4]).images
    stub.faults["index.json"] = "missing"
    with pytest.warns(UserWarning) as said, Shards(tmp_path / "cache", stub.url()) as shards:
        assert shards.read([3, 4]).images == first
    texts = [str(w.message) for w in said if "index.json could not be fetched" in str(w.message)]
    assert len(texts) == 1 and texts[0].startswith(f"{stub.url()}/index.json could not be fetched (the remote has no")
    assert f"reading the copy cached in {tmp_path / 'cache' / 'index.json'}, which may be older" in texts[0]
