"""One checking layer for every public entry: a hostile argument to ``gf.accelerate``, ``DeviceLoader`` or
``gf.stream`` is a ``ConfigError`` (or ``DataError`` for the data itself) naming it, raised before a sample is read,
a cache entry looked up or a remote reached; never a raw error from numpy, the allocator or a storage client."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, TensorDataset

import gpufeed as gf
from gpufeed.errors import ConfigError, DataError, GpufeedError
from gpufeed.pipeline.stream import as_bytes, check_stream_arguments
from gpufeed.validate import MAX_VIEWS, MAX_WORLD


class _Unread(Dataset):
    """A dataset that fails the test if a sample is read: an argument must be refused before."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        raise AssertionError(f"sample {i} was read before the arguments were checked")


# values no argument of these kinds takes
HOSTILE = st.sampled_from([math.nan, math.inf, -math.inf, -1, -0.5, "x", "no", "yes", b"1", [], {}, object(), 1j])


def _kwargs(name: str, value: object) -> dict[str, object]:
    return {"device": "cpu", "progress": False, "cache": False, name: value} if name != "progress" else {
        "device": "cpu", "cache": False, name: value,
    }  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["lock_timeout", "cache_lambda", "progress", "batch_size", "seed", "views", "world_size",
                          "rank", "num_workers", "max_side", "memory_budget", "shuffle", "drop_last"]),
    value=HOSTILE,
)  # fmt: skip
def test_a_hostile_argument_to_accelerate_is_a_config_error_before_any_read(name: str, value: object) -> None:
    if name in ("seed",) and isinstance(value, int):  # any int is a seed
        return
    if name == "lock_timeout" and value == math.inf:  # no limit: taken (test_lock_timeout_...)
        return
    with pytest.raises(ConfigError, match=name):
        gf.accelerate(_Unread(), **_kwargs(name, value))


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"views": 10**6}, f"views=1,000,000 draws that many augmented copies of every sample; gpufeed serves at most "
                           f"{MAX_VIEWS}"),
        ({"world_size": 10**9, "rank": 0}, rf"world_size=1,000,000,000 is more ranks than gpufeed shares data to \(at "
                                           rf"most {MAX_WORLD:,}\)"),
        ({"world_size": 4, "rank": 4}, r"rank=4 must be in \[0, world_size=4\)"),
        ({"lock_timeout": -1}, "lock_timeout=-1 must be a finite number of seconds >= 0"),
        ({"lock_timeout": math.nan}, "lock_timeout=nan must be a finite number of seconds >= 0"),
        ({"lock_timeout": "30"}, "lock_timeout='30' must be a number of seconds"),
        ({"lock_timeout": True}, "lock_timeout=True must be a number of seconds"),
        ({"cache_lambda": "x"}, "cache_lambda='x' must be True or False"),
        ({"progress": "no"}, "progress='no' must be True or False"),
    ],
)  # fmt: skip
def test_bounds_and_kinds_are_named_with_the_value(kwargs: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        gf.accelerate(_Unread(), **{"device": "cpu", "cache": False, **kwargs})


def test_lock_timeout_zero_and_a_number_are_taken() -> None:
    ds = TensorDataset(torch.zeros(4, 3, 4, 4, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    for timeout in (0, 2.5, 7, math.inf):  # inf: wait as long as another process's build takes
        assert len(gf.accelerate(ds, batch_size=2, device="cpu", progress=False, lock_timeout=timeout)) == 2


class _Huge(Dataset):
    def __len__(self) -> int:
        return 10**15  # an epoch's order alone: 7 PiB

    def __getitem__(self, i: int):
        raise AssertionError("read")


def test_a_length_no_epoch_order_fits_is_named_before_anything_is_allocated() -> None:
    with pytest.raises(ConfigError, match=r"len\(dataset\) = 1,000,000,000,000,000: an epoch's order alone"):
        gf.accelerate(_Huge(), device="cpu", progress=False)


def test_the_device_loader_checks_chunk_batches_views_and_meta_tensors() -> None:
    images, labels = torch.zeros(4, 3, 4, 4, dtype=torch.uint8), torch.zeros(4, dtype=torch.long)
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ConfigError, match="chunk_batches"):
            gf.DeviceLoader(images, labels, device="cpu", chunk_batches=bad)
    assert gf.DeviceLoader(images, labels, batch_size=2, device="cpu", chunk_batches=3).config.chunk_batches == 3
    with pytest.raises(ConfigError, match="views=65 draws"):
        gf.DeviceLoader(images, labels, device="cpu", views=MAX_VIEWS + 1)
    meta = torch.empty(4, 3, 4, 4, dtype=torch.uint8, device="meta")
    with pytest.raises(DataError, match=r"images is a meta tensor \(shape \(4, 3, 4, 4\), no data\)"):
        gf.DeviceLoader(meta, labels, device="cpu")
    with pytest.raises(DataError, match="labels is a meta tensor"):
        gf.DeviceLoader(images, torch.empty(4, dtype=torch.long, device="meta"), device="cpu")
    on_meta = TensorDataset(meta, labels)
    with pytest.raises(DataError, match=r"TensorDataset\[0\]'s image is a meta tensor"):
        gf.accelerate(on_meta, device="cpu", progress=False, cache=False)


@pytest.mark.parametrize(
    "args, said",
    [
        (("s3://bucket/data", "lots", 2, 60.0, 1), "cache_limit='lots' must be a size in bytes"),
        (("s3://bucket/data", "0 gb", 2, 60.0, 1), "cache_limit='0 gb' must be at least 1 byte"),
        (("s3://bucket/data", -5, 2, 60.0, 1), "cache_limit=-5 must be >= 1"),
        (("s3://bucket/data", None, 2, math.nan, 1), "download_timeout=nan must be a finite number"),
        (("s3://bucket/data", None, 2, 0, 1), "download_timeout=0 must be a number of seconds > 0"),
        (("s3://bucket/data", None, 0, 60.0, 1), "download_retry=0 must be >= 1"),
        (("ftp://host/data", None, 2, 60.0, 1), "'ftp://host/data': the streaming engine reads .* not ftp://"),
        (("s3://bucket/data", None, 2, 60.0, [1, 2]), r"views=\[...\] \(one recipe per view\) is gf.accelerate's"),
        (("s3://bucket/data", None, 2, 60.0, 10**6), "views=1,000,000 draws"),
    ],
)
def test_stream_arguments_are_checked_before_the_network(args: tuple, said: str) -> None:
    pytest.importorskip("streaming")
    with pytest.raises(ConfigError, match=said):
        check_stream_arguments(*args)
    with pytest.raises(ConfigError, match=said):  # through gf.stream itself: no credentials, no shard looked for
        remote, cache_limit, retry, timeout, views = args
        gf.stream(remote, "/nonexistent-local", transform=None, batch_size=4, cache_limit=cache_limit,
                  download_retry=retry, download_timeout=timeout, views=views)  # fmt: skip


def test_sizes_read_as_the_engine_reads_them() -> None:
    assert [as_bytes(v, "cache_limit") for v in ("1.5kb", "64GB", " 3 mb ", "2200000", "1 tb", 4096)] == [
        1536, 64 * 2**30, 3 * 2**20, 2_200_000, 2**40, 4096,
    ]  # fmt: skip
    assert check_stream_arguments("s3://bucket/data", "2gb", 1, 0.5, 2) == 2 * 2**30
    assert check_stream_arguments("/data/mds", None, 2, 60, 1) is None


@settings(max_examples=40, deadline=None)
@given(value=st.one_of(HOSTILE, st.text(max_size=6)))
def test_any_cache_limit_is_a_size_or_a_config_error(value: object) -> None:
    try:
        size = as_bytes(value, "cache_limit")
    except GpufeedError as e:
        assert isinstance(e, ConfigError) and "cache_limit=" in str(e)
    else:
        assert isinstance(size, int) and size >= 1


@pytest.fixture
def barred(tmp_path, monkeypatch):
    """A directory this process may not enter: mode 000 for a user, and for root (who may enter anything) the OS
    calls on paths under it answer EACCES, as they do for a user."""
    import errno
    import os

    path = tmp_path / "barred"
    path.mkdir()
    if os.getuid() != 0:
        path.chmod(0)
        yield path
        path.chmod(0o700)
        return

    def barring(call):
        def barred_call(target, *args, **kwargs):
            if not isinstance(target, int) and os.fsdecode(target).startswith(f"{path}/"):
                raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(target))
            return call(target, *args, **kwargs)

        return barred_call

    for name in ("stat", "lstat", "mkdir", "open", "listdir", "scandir", "rename", "replace", "unlink", "rmdir"):
        monkeypatch.setattr(os, name, barring(getattr(os, name)))
    yield path


@pytest.fixture
def link_loop(tmp_path):
    """A symbolic link that points at itself."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return loop


def _cached_dataset():
    import torchvision.transforms as T

    from fakes import cifar_like

    return cifar_like(8, transform=T.Compose([T.Resize(20), T.RandomCrop(16), T.ToTensor()]))


def _kept_in_memory(root, monkeypatch, said: str, env: bool = False) -> None:
    """accelerate with its cache under ``root`` (``cache=`` or GPUFEED_CACHE_DIR): one CacheNotWrittenWarning whose
    CacheWriteError says ``said``, and the batches cache=False serves; build_cache there raises that error."""
    from gpufeed.errors import CacheNotWrittenWarning, CacheWriteError

    ds = _cached_dataset()
    if env:
        monkeypatch.setenv("GPUFEED_CACHE_DIR", str(root / "cache"))
    where = {"cache": True} if env else {"cache": root / "cache"}
    with pytest.warns(CacheNotWrittenWarning, match="the data stays in memory") as caught:
        loader = gf.accelerate(ds, batch_size=4, device="cpu", seed=3, progress=False, **where)
    errors = [w.message.error for w in caught if isinstance(w.message, CacheNotWrittenWarning)]
    assert len(errors) == 1 and isinstance(errors[0], CacheWriteError) and said in str(errors[0])
    assert loader.plan.storage == "device"
    plain = gf.accelerate(ds, batch_size=4, device="cpu", seed=3, progress=False, cache=False)
    for (x, y), (ex, ey) in zip(loader, plain, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    with pytest.raises(CacheWriteError, match=said):
        gf.build_cache(ds, root / "cache" / "entry")


@pytest.mark.parametrize("env", [False, True], ids=["cache=", "GPUFEED_CACHE_DIR"])
def test_a_cache_root_under_a_directory_that_cannot_be_entered_keeps_the_data_in_memory(barred, monkeypatch, env):
    _kept_in_memory(barred, monkeypatch, "Permission denied", env)


@pytest.mark.parametrize("env", [False, True], ids=["cache=", "GPUFEED_CACHE_DIR"])
@pytest.mark.parametrize("under", ["loop", "loop/deeper"])
def test_a_cache_root_under_a_loop_of_links_keeps_the_data_in_memory(link_loop, monkeypatch, env, under):
    root = link_loop.parent / under
    _kept_in_memory(root, monkeypatch, "cannot be resolved", env)


@pytest.mark.parametrize(
    "argv",
    [
        ["cache", "verify", "--data", "LOOP"],
        ["cache", "verify", "--data", "LOOP/images"],
        ["cache", "--cache-dir", "LOOP", "info"],
        ["cache", "--cache-dir", "LOOP/x", "verify"],
        ["cache", "clear", "--cache-dir", "LOOP"],
        ["cache", "--cache-dir", "BARRED/x", "info"],
    ],
)
def test_the_cache_commands_name_a_path_they_cannot_look_at_without_a_traceback(link_loop, barred, capsys, argv):
    from gpufeed.cli.main import main

    argv = [a.replace("LOOP", str(link_loop)).replace("BARRED", str(barred)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    path = next(a for a in argv if a.startswith("/"))
    assert "gpufeed cache: ConfigError: " in err and path in err and "Traceback" not in err
    assert "cannot be resolved" in err or "cannot be looked at" in err


def test_a_file_that_cannot_be_reached_changes_the_folders_key_instead_of_failing_it(tmp_path, monkeypatch) -> None:
    import errno
    import os

    from torchvision.datasets import ImageFolder

    import gpufeed.read.fingerprint as fingerprint

    from fakes import image_folder

    image_folder(tmp_path / "photos", [(12, 10)] * 4)
    folder = ImageFolder(str(tmp_path / "photos"))
    before = fingerprint.dataset_identity(folder)
    barred = folder.samples[1][0]
    real = os.stat

    def stat(path, *args, **kwargs):  # a class folder that is readable but not searchable
        if str(path) == barred:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fingerprint.os, "stat", stat)
    after = fingerprint.dataset_identity(folder)
    assert after is not None and before is not None and after["files"] != before["files"]


# NOTE [ Seeds, epochs and batch sizes: one range at every entry ] (gpufeed.validate): one table, every entry.
SEEDS_TAKEN = [0, 1, 2**32, 2**63, 2**64 - 1, np.int64(7), np.uint64(2**64 - 1), torch.tensor(5)]
SEEDS_REFUSED = [
    (-1, "seed=-1 must be in \\[0, 2\\*\\*64\\)"),
    (-(2**63), "must be in \\[0, 2\\*\\*64\\)"),
    (2**64, "seed=18446744073709551616 must be in \\[0, 2\\*\\*64\\)"),
    (10**30, "must be in \\[0, 2\\*\\*64\\)"),
    (np.int64(-5), "seed=-5 must be in"),
    (1.0, "seed=1.0 must be an int"),
    (True, "seed=True must be an int"),
    ("3", "seed='3' must be an int"),
    (None, "seed=None must be an int"),
]


def _tiny():
    return torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8), torch.arange(6)


def _entries(tmp_path):
    """Each entry that takes a seed, as a call of it."""
    from gpufeed import augment as A

    images, labels = _tiny()
    ds = TensorDataset(images, labels)
    flip = A.Compose([A.RandomHorizontalFlip()])
    return {
        "DeviceLoader": lambda seed: gf.DeviceLoader(images, labels, batch_size=4, device="cpu", seed=seed),
        "accelerate": lambda seed: gf.accelerate(ds, batch_size=4, device="cpu", seed=seed, progress=False),
        "accelerate, fallback": lambda seed: gf.accelerate(
            _Unread(), batch_size=4, device="cpu", seed=seed, progress=False, fallback="prefetch"
        ),
        "KeyedDraws": lambda seed: flip(images, generator=A.KeyedDraws(seed, 0, torch.arange(6))),
    }


@pytest.mark.parametrize("entry", ["DeviceLoader", "accelerate", "KeyedDraws"])
def test_every_entry_takes_the_same_seeds(tmp_path, entry) -> None:
    call = _entries(tmp_path)[entry]
    for seed in SEEDS_TAKEN:
        call(seed)


@pytest.mark.parametrize("entry", ["DeviceLoader", "accelerate", "accelerate, fallback", "KeyedDraws"])
def test_every_entry_refuses_the_same_seeds_by_name(tmp_path, entry) -> None:
    call = _entries(tmp_path)[entry]
    for seed, said in SEEDS_REFUSED:
        with pytest.raises(ConfigError, match=said):
            call(seed)


def test_the_stream_and_the_command_line_refuse_the_same_seeds(tmp_path, capsys) -> None:
    pytest.importorskip("streaming")
    from gpufeed.cli.main import build_parser

    for seed, said in SEEDS_REFUSED:  # before the shards are looked for
        with pytest.raises(ConfigError, match=said):
            gf.stream(None, str(tmp_path / "nothing-here"), transform=None, batch_size=4, seed=seed)
    for command in ("train", "bench"):
        for text in ("-1", str(2**64), "1.5"):
            with pytest.raises(SystemExit) as exited:
                build_parser().parse_args([command, "--seed", text])
            assert exited.value.code == 2 and "--seed" in capsys.readouterr().err
        assert build_parser().parse_args([command, "--seed", str(2**64 - 1)]).seed == 2**64 - 1


def test_seed_minus_one_is_not_a_spelling_of_another_seed() -> None:
    # torch wraps it: manual_seed(-1) is manual_seed(2**64 - 1); gpufeed takes only the second spelling
    assert torch.equal(
        torch.Generator().manual_seed(-1).get_state(), torch.Generator().manual_seed(2**64 - 1).get_state()
    )
    images, labels = _tiny()
    top = gf.DeviceLoader(images, labels, batch_size=6, device="cpu", seed=2**64 - 1)
    assert sorted(next(iter(top))[1].tolist()) == list(range(6))


@pytest.mark.parametrize(
    "epoch, said",
    [(10**30, f"epoch={10**30}"), (2**63, "epoch=9223372036854775808"), (-1, "epoch=-1"), (1.5, "epoch=1.5"),
     (True, "epoch=True"), ("2", "epoch='2'"), (None, "epoch=None")],
)  # fmt: skip
def test_a_state_or_set_epoch_with_an_absurd_epoch_is_refused_naming_it(epoch, said) -> None:
    from gpufeed.errors import StateError

    images, labels = _tiny()
    saved = gf.DeviceLoader(images, labels, batch_size=4, device="cpu").state_dict()
    fresh = gf.DeviceLoader(images, labels, batch_size=4, device="cpu")
    state = {**saved, "epoch": epoch}
    with pytest.raises(StateError, match=said + r".*expected an int epoch in \[0, 2\*\*63\)"):
        fresh.load_state_dict(state)
    with pytest.raises(ConfigError, match="epoch"):
        fresh.set_epoch(epoch)
    fresh.load_state_dict({**saved, "epoch": 2**63 - 2})  # the largest epoch a state may hold is taken
    assert fresh.epoch == 2**63 - 2


def test_a_state_that_finished_the_last_epoch_there_is_refused() -> None:
    from gpufeed.errors import StateError

    images, labels = _tiny()
    loader = gf.DeviceLoader(images, labels, batch_size=4, device="cpu")
    done = {**loader.state_dict(), "epoch": 2**63 - 1, "batch": len(loader)}  # resumes at 2**63: none
    with pytest.raises(StateError, match="epoch=9223372036854775807"):
        gf.DeviceLoader(images, labels, batch_size=4, device="cpu").load_state_dict(done)


@pytest.mark.parametrize("batch_size", [2**62, 2**63 - 1, 10**9])
def test_a_batch_larger_than_the_data_is_served_short_on_a_folder_too(tmp_path, batch_size) -> None:
    import torchvision.transforms as T

    from fakes import image_folder

    folder = image_folder(
        tmp_path, [(20, 24), (30, 26), (22, 22)], transform=T.Compose([T.RandomResizedCrop(8), T.ToTensor()])
    )
    loader = gf.accelerate(folder, batch_size=batch_size, device="cpu", progress=False, cache=False)
    assert [tuple(x.shape) for x, _ in loader] == [(3, 3, 8, 8)]
    images, labels = _tiny()
    from gpufeed import augment as A

    tensors = gf.DeviceLoader(images, labels, batch_size=batch_size, device="cpu", transform=A.RandomHorizontalFlip())
    assert [tuple(x.shape) for x, _ in tensors] == [(6, 3, 8, 8)]


@pytest.mark.parametrize("batch_size", [2**63, 10**30])
def test_a_batch_size_torch_cannot_index_is_refused_naming_it(batch_size) -> None:
    images, labels = _tiny()
    with pytest.raises(ConfigError, match=f"batch_size={batch_size} must be < 2\\*\\*63"):
        gf.DeviceLoader(images, labels, batch_size=batch_size, device="cpu")
    with pytest.raises(ConfigError, match=f"batch_size={batch_size} must be < 2\\*\\*63"):
        gf.accelerate(_Unread(), batch_size=batch_size, device="cpu", progress=False)


def test_more_training_ranks_than_samples_are_refused_and_evaluation_takes_them() -> None:
    images, labels = torch.zeros(37, 3, 4, 4, dtype=torch.uint8), torch.arange(37)
    for world in (38, 10**6):
        with pytest.raises(ConfigError, match=f"world_size={world:,} ranks share 37 samples: ranks 37 and up"):
            gf.DeviceLoader(images, labels, batch_size=8, device="cpu", world_size=world, rank=0)
        with pytest.raises(ConfigError, match=f"world_size={world:,} ranks share 37 samples"):
            gf.accelerate(TensorDataset(images, labels), batch_size=8, device="cpu", world_size=world, rank=0)
    assert len(gf.DeviceLoader(images, labels, batch_size=1, device="cpu", world_size=37, rank=36)) == 1
    padded = gf.DeviceLoader(images, labels, batch_size=8, device="cpu", world_size=64, rank=63, even="pad")
    assert padded.real_counts == (0,) and len(list(padded)) == 1  # the repeats are known
    uneven = gf.DeviceLoader(images, labels, batch_size=8, device="cpu", world_size=64, rank=63, even=False)
    assert list(uneven) == []  # every sample once: this rank has none


def test_a_layout_of_ranks_that_would_not_fit_memory_is_refused_before_it_is_made() -> None:
    import psutil

    n = 2**16
    images, labels = torch.zeros(n, 1, 1, 1, dtype=torch.uint8), torch.zeros(n, dtype=torch.long)
    batch = max(1, int(psutil.virtual_memory().total // 8 // (2**16) * 2))  # the padded rounds alone exceed memory
    for even in (True, "pad"):
        with pytest.raises(ConfigError, match=r"world_size=65,536 ranks with batch_size=.* GiB of indices"):
            gf.DeviceLoader(images, labels, batch_size=batch, device="cpu", world_size=n, rank=1, even=even)
