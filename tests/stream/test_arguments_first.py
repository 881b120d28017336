"""Every argument of ``gf.stream`` is checked before the remote is asked anything: the S3 stub counts the requests
and must see none; ``local`` is not even created. A remote that does not answer fails once ``download_timeout`` has
passed, while the client's download is still going: never after all the attempts the engine and its client
would make."""

from __future__ import annotations

import threading

import pytest
import torch
import torchvision.transforms as T

import gpufeed as gf
from gpufeed.errors import ConfigError, StorageError
from gpufeed.mds.plan import Layout

from .mds import recipe, write_photos
from .s3stub import S3Stub

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")
pytest.importorskip("boto3", reason="the engine's S3 client: pip install boto3")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_photos(tmp_path_factory.mktemp("first") / "photos", 24, size_limit=4096, digests=True)


@pytest.fixture
def stub(photos, monkeypatch):
    served = S3Stub(photos)
    for k, v in served.env.items():
        monkeypatch.setenv(k, v)
    yield served
    served.stop()


def _open(stub, local, **kw):
    args = {"global_batch_size": 8, "transform": recipe(), "device": "cpu", "num_canonical_nodes": 1, **kw}
    return gf.stream(stub.url(), local, **args)


def _mix_without_labels() -> dict:
    import torchvision.transforms.v2 as v2

    return {"mix": v2.MixUp(alpha=0.2, num_classes=24), "label_key": None}


BAD = [
    ({"seed": -1}, "seed=-1 must be in [0, 2"),
    ({"seed": "a"}, "seed='a' must be an int"),
    ({"ahead": 0}, "ahead=0 must be >= 1"),
    ({"ahead": 10**6}, "ahead=1,000,000 is more than gpufeed allows"),
    ({"prefetch_shards": 10**9}, "prefetch_shards=1,000,000,000 is more than gpufeed allows"),
    ({"prefetch_shards": 0}, "prefetch_shards=0 must be >= 1"),
    ({"dtype": torch.int64}, "dtype=torch.int64 must be None, torch.uint8 or a floating dtype"),
    ({"dtype": "float32"}, "dtype='float32' must be a torch.dtype"),
    ({"transform": 42}, "builtins.int cannot be cached or run batched"),
    ({"transform": T.Compose([T.ToTensor()])}, "the recipe must start with RandomResizedCrop"),
    ({"num_classes": 0}, "num_classes=0 must be >= 1"),
    ({"num_classes": 2.5}, "num_classes=2.5 must be an int"),
    ({"validate_hash": "nope"}, "validate_hash='nope' is not a hash the engine computes"),
    ({"layout": "2 nodes"}, "layout='2 nodes' must be a gpufeed.mds.plan.Layout"),
    ({"channels_last": "yes"}, "channels_last='yes' must be True or False"),
    ({"image_key": 3}, "image_key=3 must be the name of the image column"),
    (_mix_without_labels(), "mix= mixes images with their labels, but label_key=None"),
    ({"views": 0}, "views=0 must be >= 1"),
    # refused only once the shards were open (the remote asked 4 to 6 times): the arguments alone decide them
    ({**_mix_without_labels(), "label_key": "label", "views": 2}, "with views > 1 mix each view yourself"),
    ({"views": 2, "transform": T.Compose([T.Resize(16), T.CenterCrop(12), T.ToTensor()])}, "it needs a random trans"),
    ({"layout": Layout.of_rank(0, 3, 1), "num_canonical_nodes": 2, "global_batch_size": 6}, "and 3 nodes: one must"),
]


@pytest.mark.parametrize("kw, said", BAD, ids=[f"{k}-{'-'.join(kw)}" for k, (kw, _) in enumerate(BAD)])
def test_a_bad_argument_is_refused_before_the_remote_is_asked_anything(stub, tmp_path, kw, said):
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace("[", r"\[")):
        _open(stub, tmp_path / "cache", **kw)
    assert stub.requests == [] and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("kind", ["a file", "a symlink loop", "a path through a file"])
def test_a_local_that_cannot_be_a_directory_is_a_config_error_before_the_network(stub, tmp_path, kind):
    (tmp_path / "file").write_text("notes\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    local = {"a file": tmp_path / "file", "a symlink loop": tmp_path / "loop", "a path through a file": None}[kind]
    local = local or tmp_path / "file" / "cache"
    said = {"a file": "is a file, not a directory", "a symlink loop": "is a symbolic link loop"}.get(kind)
    with pytest.raises(ConfigError, match=rf"local='{local}' {said or 'cannot be used .Not a directory.'}; give a"):
        _open(stub, local)
    with pytest.raises(ConfigError, match=r"local='.*' (is a|cannot be used)"):  # local-only data too
        gf.stream(local=local, transform=recipe(), batch_size=4, device="cpu")
    assert stub.requests == []


@pytest.mark.parametrize("endpoint", ["not a url", "127.0.0.1:9000", "http://host:port", "ftp://host"])
def test_an_s3_endpoint_that_is_no_url_names_the_variable(stub, tmp_path, monkeypatch, endpoint):
    monkeypatch.setenv("S3_ENDPOINT_URL", endpoint)
    with pytest.raises(ConfigError, match=rf"S3_ENDPOINT_URL='{endpoint}' \(in the environment\) is not an endpoint"):
        _open(stub, tmp_path / "cache")
    assert stub.requests == []


def test_a_validate_hash_the_index_does_not_record_is_refused_before_any_shard(stub, tmp_path):
    # md5 is a hash the engine computes; this index records none (gpufeed convert's record none): known from the
    # index, which is fetched, and refused before a shard is asked for
    with pytest.raises(ConfigError, match=r"validate_hash='md5': .*/cache/index.json records no md5 hash of shard 0"):
        _open(stub, tmp_path / "cache", validate_hash="md5")
    assert {key for _, key in stub.requests} <= {"index.json", "gpufeed.json"}


def test_a_good_layout_is_taken(stub, tmp_path):
    with _open(stub, tmp_path / "cache", layout=Layout.of_rank(0, 1, 1)) as loader:
        assert loader.layout.world_size == 1 and len(next(iter(loader))[1]) == 8


def test_a_frozen_remote_fails_in_one_download_timeout_not_one_per_attempt(stub, tmp_path, monkeypatch):
    # the outside trial: download_timeout=5 took 25-30 s (the engine's attempts x botocore's 3, each a full timeout).
    # No clock is read here (a loaded machine must not fail it): the engine's downloader is held inside its download
    # of the index until the test lets it go, so gf.stream can only raise by giving up on that download while it is
    # still going; had it waited for the client's retries, it would wait for the release (a bound only a hang meets)
    from gpufeed.mds import remote

    stub.faults["index.json"] = "frozen"
    started, released = [], threading.Event()
    made = remote.downloader

    class Held:
        def __init__(self, inner):
            self.inner = inner

        def download(self, url, path, timeout):
            started.append(url.rsplit("/", 1)[-1])
            try:
                return self.inner.download(url, path, timeout)
            finally:
                released.wait()

        def clean_up(self):
            self.inner.clean_up()

    monkeypatch.setattr(remote, "downloader", lambda url, timeout: Held(made(url, timeout)))
    hang = threading.Timer(300, released.set)
    hang.start()
    try:
        with pytest.raises(StorageError) as failed:
            _open(stub, tmp_path / "cache", download_timeout=1, download_retry=3)
        gave_up = not released.is_set()  # raised while the index's download was still held
        fetched = list(started)
    finally:
        released.set()
        hang.cancel()
    text = str(failed.value)
    assert text.startswith("index.json of the MDS dataset s3://bucket could not be fetched from s3://bucket/index.json")
    assert "the remote did not answer in time" in text and "download_timeout=1 s" in text and "gf.stream again" in text
    assert gave_up, "gf.stream waited for the client's download (and its retries) to end"
    # one download started, the index's: gpufeed.json (fetched after it, within the same wait) never was
    assert fetched == ["index.json"] and "gpufeed.json" not in [key for _, key in stub.requests]
