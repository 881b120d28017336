"""Users' data and shared caches: nothing gpufeed did not create is touched; read-only caches work;
lock waits are announced and bounded; full or unwritable disks fail cleanly."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T
from torchvision.datasets import ImageFolder

import gpufeed as gf
from gpufeed import CacheError, CacheWriteError, ConfigError, build_cache, open_cache
from gpufeed.cache import build_lock
from gpufeed.cache.format import MANIFEST
from gpufeed.read.fingerprint import cache_key
from gpufeed.read.samples import ingest

from fakes import cifar_like, snapshot, user_folder

TESTS = str(Path(__file__).parent.parent)


def _dataset(n=40, seed=0, size=16):
    return cifar_like(n, seed=seed, transform=T.Compose([T.Resize(size), T.RandomCrop(size, padding=2), T.ToTensor()]))


def _make_target(tmp_path, kind):
    if kind == "image folder":
        return user_folder(tmp_path)
    target = tmp_path / "target"
    if kind == "empty directory":
        target.mkdir()
    elif kind == "file":
        target.write_text("someone's notes\n")
    elif kind == "symlink to a folder":
        target.symlink_to(user_folder(tmp_path), target_is_directory=True)
    elif kind == "foreign manifest":
        target.mkdir()
        (target / MANIFEST).write_text(json.dumps({"format": "another-tool", "files": ["a.bin"]}))
        (target / "a.bin").write_bytes(b"\x00" * 100)
    elif kind == "unparsable manifest":
        target.mkdir()
        (target / MANIFEST).write_text("{not json")
    return target


KINDS = ["image folder", "empty directory", "file", "symlink to a folder", "foreign manifest", "unparsable manifest"]


@pytest.mark.parametrize("kind", KINDS)
def test_build_cache_refuses_a_path_it_did_not_create_and_changes_nothing(tmp_path, kind):
    target = _make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(CacheError, match="choose (a path that does not exist yet|another path)") as e:
        build_cache(_dataset(), target, num_workers=0, progress=False)
    assert str(target) in str(e.value)
    assert snapshot(tmp_path) == before  # no lock file, no .building directory, nothing inside


@pytest.mark.parametrize("kind", ["image folder", "foreign manifest"])
def test_removing_refuses_a_directory_gpufeed_did_not_create(tmp_path, kind):
    from gpufeed.cache import remove_entry

    target = _make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(CacheError, match="not a gpufeed cache entry"):
        remove_entry(target)
    assert snapshot(tmp_path) == before


def test_a_gpufeed_entry_for_other_data_is_replaced_with_a_warning(tmp_path):
    first = build_cache(_dataset(seed=0), tmp_path / "entry", progress=False)
    with pytest.warns(UserWarning, match="replacing the cache at .*another dataset"):
        second = build_cache(_dataset(seed=1), tmp_path / "entry", progress=False)
    assert second.key != first.key
    assert torch.equal(second.images, ingest(_dataset(seed=1), T.Resize(16), progress=False).images)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock", "entry"]


_KILL_SWAP = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    import torchvision.transforms as T
    import gpufeed.cache.writer as writer
    from gpufeed import build_cache
    from fakes import cifar_like
    writer._checkpoint = lambda p: os._exit(17) if p == "moved the old entry aside" else None
    build_cache(cifar_like(40, seed=1, transform=T.Resize(16)), {target!r}, progress=False)
""")


def test_a_build_killed_between_moving_the_old_entry_aside_and_renaming_the_new_one_in_is_recovered(tmp_path):
    target = tmp_path / "entry"
    build_cache(cifar_like(40, seed=0, transform=T.Resize(16)), target, progress=False)
    script = _KILL_SWAP.format(tests=TESTS, target=str(target))
    assert subprocess.run([sys.executable, "-c", script]).returncode == 17
    assert not target.exists()  # killed at exactly that point: the old entry aside, the new one not yet in
    assert len(list(tmp_path.glob(".entry.old-*"))) == 1 and len(list(tmp_path.glob(".entry.building-*"))) == 1
    again = build_cache(cifar_like(40, seed=1, transform=T.Resize(16)), target, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock", "entry"]  # both leftovers removed
    assert torch.equal(again.images, open_cache(target).images)


def _leftover(path, files):
    path.mkdir()
    for name, data in files.items():
        (path / name).write_text(data) if isinstance(data, str) else (path / name).write_bytes(data)
    return path


def test_leftovers_are_recognised_by_what_they_hold_not_by_their_names(tmp_path):
    from gpufeed.cache.manage import leftovers

    manifest = (build_cache(_dataset(), tmp_path / "model", progress=False).path / MANIFEST).read_text()
    ours = [
        _leftover(tmp_path / ".entry.building-4242-0123abcd", {"images.bin": b"\0" * 10}),
        _leftover(tmp_path / ".entry.building-4343-89abcdef", {}),  # killed right after mkdir
        _leftover(tmp_path / ".entry.old-4242-0123abcd", {MANIFEST: manifest, "labels.bin": b"1"}),
        _leftover(tmp_path / ".entry.old-89abcdef", {MANIFEST: manifest}),  # gpufeed 0.1's name
    ]
    theirs = [
        _leftover(tmp_path / ".entry.building-4242-aaaabbbb", {"images.bin": b"", "notes.txt": "mine"}),
        _leftover(tmp_path / ".entry.old-20240101", {"vimrc": "set nu"}),  # a name that matches, not ours
        _leftover(tmp_path / ".entry.old-4242-ccccdddd", {}),  # an .old holds a gpufeed manifest, or is not ours
        _leftover(tmp_path / ".entry.building-notes", {}),
        _leftover(tmp_path / ".entry2.old-4242-0123abcd", {MANIFEST: manifest}),  # another entry's
    ]
    found = leftovers(tmp_path / "entry")
    assert found == sorted(ours) and not set(found) & set(theirs)


def test_cache_clear_removes_entries_and_leftovers_and_nothing_else(tmp_path, capsys):
    from gpufeed.cli.main import main

    root = tmp_path / "cache"
    entry = build_cache(_dataset(), root / "entry", progress=False).path
    _leftover(root / ".entry.building-4242-0123abcd", {"images.bin": b"\0"})
    user_folder(root)  # a user's folder inside the cache root...
    _leftover(root / ".vim.old-20240101", {"vimrc": "set nu"})  # ...and a hidden one with a leftover's name
    (root / "notes.txt").write_text("mine")
    keep = {k: v for k, v in snapshot(root).items() if not k.startswith(("entry", ".entry"))}
    assert main(["cache", "--cache-dir", str(root), "clear"]) == 0
    assert not entry.exists() and not list(root.glob(".entry.building-*"))
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k != ".entry.lock"} == keep


def test_a_running_build_keeps_its_entry_and_leftovers(tmp_path):
    from gpufeed.cache import remove_entry

    entry = build_cache(_dataset(), tmp_path / "entry", progress=False).path
    leftover = _leftover(tmp_path / ".entry.building-4242-0123abcd", {"images.bin": b"\0"})
    with build_lock(entry):
        for path in (entry, leftover):
            with pytest.raises(CacheError, match=rf"{path} is kept: .* is building"):
                remove_entry(path)
    remove_entry(leftover)
    remove_entry(entry)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock"]


def test_a_swap_that_fails_puts_the_old_entry_back(tmp_path, monkeypatch):
    import gpufeed.cache.writer as writer

    old = build_cache(_dataset(seed=0), tmp_path / "entry", progress=False)
    expected = old.images.clone()

    def fail(phase):
        if phase == "moved the old entry aside":
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(writer, "_checkpoint", fail)
    with pytest.raises(CacheWriteError, match="Input/output error"), pytest.warns(UserWarning, match="replacing"):
        build_cache(_dataset(seed=1), tmp_path / "entry", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock", "entry"]
    assert torch.equal(open_cache(tmp_path / "entry").images, expected)


# -- a read-only shared cache, used by another (unprivileged) user ------------------------------------------------

_READER = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {tests!r})
    import torch, torchvision.transforms as T
    import gpufeed as gf
    from fakes import cifar_like

    def first_batch(loader):
        x, y = next(iter(loader))
        return [float(x.double().sum()), y.tolist()]

    ds = cifar_like(40, transform=T.Compose([T.Resize(16), T.RandomCrop(16, padding=2), T.ToTensor()]))
    out = {{}}
    out["open"] = float(gf.open_cache({entry!r}).images.double().sum())
    out["build_cache_hit"] = gf.build_cache(ds, {entry!r}, progress=False).key
    loader = gf.accelerate(ds, batch_size=8, device="cpu", cache={root!r}, progress=False)
    out["accelerate_ingest"] = loader.plan.ingest
    out["accelerate_batch"] = first_batch(loader)
    miss = cifar_like(40, transform=T.Compose([T.Resize(12), T.RandomCrop(12, padding=2), T.ToTensor()]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = gf.accelerate(miss, batch_size=8, device="cpu", cache={root!r}, progress=False)
    out["miss_warnings"] = [str(w.message) for w in caught]
    out["miss_batch"] = first_batch(loader)
    try:
        gf.build_cache(miss, root={root!r}, progress=False)
    except gf.CacheWriteError as e:
        out["build_error"] = str(e)
    print(json.dumps(out))
""")


def _unprivileged():
    """In the child before exec: root without the capabilities that bypass file permissions.

    Root ignores permission bits through CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH; dropped from the
    bounding set, the exec'd process checks them like any user's (it can still run this interpreter,
    which a real other user could not reach under /root). Other users need nothing dropped.
    """
    if os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _first_batch(loader):
    x, y = next(iter(loader))
    return [float(x.double().sum()), y.tolist()]


def test_a_read_only_shared_cache_is_used_by_an_unprivileged_user():
    shared = Path(tempfile.mkdtemp(prefix="gpufeed-shared-"))  # not under pytest's private (0700) tmp dir
    try:
        shared.chmod(0o755)
        ds = _dataset()
        cache = gf.accelerate(ds, batch_size=8, device="cpu", cache=shared, progress=False)
        entry = Path(cache.plan.cache_path)
        expected_sum = float(open_cache(entry).images.double().sum())
        miss = cifar_like(40, transform=T.Compose([T.Resize(12), T.RandomCrop(12, padding=2), T.ToTensor()]))
        expected_miss = _first_batch(gf.accelerate(miss, batch_size=8, device="cpu", cache=False, progress=False))
        for path in [shared, *shared.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        before = snapshot(shared)
        script = _READER.format(tests=TESTS, entry=str(entry), root=str(shared))
        env = {**os.environ, "GPUFEED_CACHE_DIR": str(shared)}
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, preexec_fn=_unprivileged
        )
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout.strip().splitlines()[-1])
        assert out["open"] == expected_sum
        assert out["build_cache_hit"] == open_cache(entry).key
        assert out["accelerate_ingest"].startswith("cache hit, verified")
        assert out["accelerate_batch"] == _first_batch(gf.accelerate(ds, batch_size=8, device="cpu", cache=False))
        assert out["miss_batch"] == expected_miss  # a miss it cannot write: the data stays in memory
        assert sum("the data stays in memory" in w for w in out["miss_warnings"]) == 1
        assert "not writable" in out["build_error"] and str(shared) in out["build_error"]
        assert snapshot(shared) == before  # not even a lock file
    finally:
        for path in [shared, *shared.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(shared)


# -- waiting on another process's build ----------------------------------------------------------------------------

_WAITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import torchvision.transforms as T
    from gpufeed import build_cache
    from fakes import cifar_like
    ds = cifar_like(40, transform=T.Resize(16))
    print("asking for the entry", file=sys.stderr, flush=True)
    c = build_cache(ds, {target!r}, lock_timeout=60)
    print("built", c.images.shape[0])
""")


def test_a_wait_on_another_build_is_announced_within_seconds_with_progress_and_ends_when_released(tmp_path):
    target = tmp_path / "entry"
    with build_lock(target):
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _WAITER.format(tests=TESTS, target=str(target))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        announced: list[tuple[float, str]] = []
        reader = threading.Thread(
            target=lambda: announced.extend((time.monotonic() - start, line) for line in proc.stderr), daemon=True
        )
        reader.start()
        while not any("waiting for" in line for _, line in announced) and time.monotonic() - start < 60:
            time.sleep(0.05)
        time.sleep(1.5)  # let the progress bar tick
    # the reader thread alone reads stderr (communicate() would read it too, racing it for the lines checked below)
    reader.join(timeout=120)
    out = proc.stdout.read()
    proc.wait(timeout=10)
    assert proc.returncode == 0 and out.strip() == "built 40"
    asked = next(t for t, line in announced if "asking for the entry" in line)
    when, line = next((t, line) for t, line in announced if "waiting for" in line)
    assert f"pid {os.getpid()}" in line and "since" in line and str(target) in line and "giving up after 60 s" in line
    # after the child asked; how many seconds into its wait depends on the machine's load here (the parent's reader
    # and the child's start), so test_a_wait_is_announced_2_s_into_it_by_the_clock checks that on a clock of its own
    assert when >= asked
    assert "waiting for the cache build" in "".join(line for _, line in announced)  # the progress bar


class _Clock:
    """The lock's clock (``gpufeed.cache.lock.time``) whose ``sleep`` moves it on instead of waiting: the seconds a
    wait lasted, and when it was announced, are counted in polls, whatever the load. ``at(s, fn)`` runs ``fn`` once
    the clock reaches ``s``; what is written to stderr is recorded with the clock's time."""

    def __init__(self, monkeypatch):
        from gpufeed.cache import lock

        self.now, self.events, self.written = 0.0, [], []
        monkeypatch.setattr(lock, "time", self)
        clock = self

        class Stderr:
            def write(self, text):
                clock.written.append((clock.now, text))
                return len(text)

            def flush(self):
                pass

        monkeypatch.setattr(sys, "stderr", Stderr())

    def monotonic(self):
        return self.now

    def time(self):  # wall-clock dates (the holder's "since") stay real
        return time.time()

    def sleep(self, seconds):
        self.now += seconds
        for event in [e for e in self.events if e[0] <= self.now]:
            self.events.remove(event)
            event[1]()

    def at(self, seconds, fn):
        self.events.append((seconds, fn))

    def first(self, text):
        return next(t for t, written in self.written if text in written)


def test_a_wait_is_announced_2_s_into_it_by_the_clock_and_its_bar_counts_the_seconds_until_released(
    tmp_path, monkeypatch
):
    from contextlib import ExitStack

    target = tmp_path / "entry"
    other = ExitStack()
    other.enter_context(build_lock(target))  # another build holds it (flock: another open file, same effect)
    clock = _Clock(monkeypatch)
    clock.at(5.0, other.close)
    with build_lock(target, timeout=60, progress=True):
        waited = clock.now
    announced = clock.first("gpufeed: waiting for")
    assert 2.0 <= announced < 2.0 + 0.1 + 1e-9, announced  # the first poll at or past announce_s=2 (polls of 0.1 s)
    assert 5.0 <= waited < 5.0 + 0.1 + 1e-9, waited  # it took the lock at the first poll after the release
    bar = "".join(text for t, text in clock.written if t >= announced)
    assert "waiting for the cache build" in bar and "5/60" in bar  # the bar counted the seconds waited


def test_a_wait_gives_up_after_the_timeout_with_the_holder_named(tmp_path, monkeypatch, capsys):
    target = tmp_path / "entry"
    with build_lock(target):
        with pytest.MonkeyPatch.context() as patch:
            clock = _Clock(patch)  # the lock's clock: the seconds it waited are counted in polls, at any load
            with pytest.raises(CacheError, match=rf"gave up after 1 s waiting for .*pid {os.getpid()} on .* since"):
                build_cache(_dataset(), target, lock_timeout=1.0, progress=False)
        assert 1.0 <= clock.now < 1.0 + 0.1 + 1e-9, clock.now  # at the first poll past the timeout
    assert not target.exists()
    entry = gf.cache.entry_path(type(_dataset()).__name__, cache_key(_dataset(), [T.Resize(16)]), tmp_path)
    with build_lock(entry):
        monkeypatch.setenv("GPUFEED_LOCK_TIMEOUT", "0")
        with pytest.raises(CacheError, match="gave up after 0 s"):
            gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=tmp_path, progress=False, num_workers=0)
    assert not entry.exists()


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_lock_timeout_is_a_config_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv("GPUFEED_LOCK_TIMEOUT", value)
    with pytest.raises(ConfigError, match="GPUFEED_LOCK_TIMEOUT"):
        build_cache(_dataset(), tmp_path / "entry", progress=False)
    with pytest.raises(ConfigError, match="lock_timeout=-2"):
        build_cache(_dataset(), tmp_path / "entry", progress=False, lock_timeout=-2)


# -- full disks and unwritable locations ---------------------------------------------------------------------------


def test_disk_full_while_writing_is_a_typed_error_and_leaves_nothing_partial(tmp_path, monkeypatch):
    import gpufeed.cache.writer as writer

    def full(phase):
        if phase == "wrote labels.bin":
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "_checkpoint", full)
    target = tmp_path / "cache" / "entry"
    with pytest.raises(CacheWriteError, match=r"No space left on device; it needs [\d,]+ bytes.*free disk space") as e:
        build_cache(_dataset(), target, progress=False)
    assert str(target) in str(e.value)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".entry.lock"]  # no entry, no .building
    with pytest.warns(UserWarning, match="the data stays in memory, not cached on disk: cannot write the cache") as w:
        loader = gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=tmp_path / "cache", progress=False)
    assert len([x for x in w if "stays in memory" in str(x.message)]) == 1
    assert loader.plan.cache_path is None
    assert _first_batch(loader) == _first_batch(gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=False))


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (needs mount rights: root in a container that allows it; skipped otherwise)."""
    mount = tmp_path / "small"
    mount.mkdir()
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if run.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {run.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_real_full_disk_is_refused_before_writing_and_fails_cleanly_while_writing(small_disk, monkeypatch):
    import gpufeed.cache.writer as writer

    big = cifar_like(1200, transform=T.Compose([T.Resize(32), T.ToTensor()]))  # 3.7 MB of images
    with pytest.raises(CacheWriteError, match=r"not enough disk space; it needs [\d,]+ bytes, [\d,]+ are free"):
        build_cache(big, small_disk / "entry", progress=False)
    monkeypatch.setattr(writer, "_free_bytes", lambda path: None)  # no pre-check: the write itself hits ENOSPC
    with pytest.raises(CacheWriteError, match="No space left on device"):
        build_cache(big, small_disk / "entry", progress=False)
    assert sorted(p.name for p in small_disk.iterdir()) == [".entry.lock"]


def test_a_disk_full_before_the_build_starts_keeps_the_data_in_memory(small_disk):
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # every block taken: the build lock's few bytes do not fit either
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    with pytest.raises(CacheWriteError, match=r"cannot write the build lock .*No space left on device.*free space"):
        build_cache(_dataset(), small_disk / "cache" / "entry", progress=False)
    with pytest.warns(UserWarning, match="the data stays in memory, not cached on disk: cannot write the build lock"):
        loader = gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=small_disk / "cache", progress=False)
    assert loader.plan.cache_path is None
    assert _first_batch(loader) == _first_batch(gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=False))


# -- the manifest covers itself ------------------------------------------------------------------------------------


def _edit_manifest(entry, edit, fix_digest=False):
    from gpufeed.cache.format import _digest

    path = entry / MANIFEST
    raw = json.loads(path.read_text())
    edit(raw)
    if fix_digest:  # a consistent forgery: only the dtype/byte-order check can catch it
        raw["digest"] = _digest(raw)
    path.write_text(json.dumps(raw))


def _shape(raw):
    n, c, h, w = raw["arrays"]["images"]["shape"]
    raw["arrays"]["images"]["shape"] = [n, h, c, w]  # same byte count


def _dtype(raw):
    raw["arrays"]["labels"]["dtype"] = "<f8"  # int64 -> float64: same byte count


@pytest.mark.parametrize("edit", [_shape, _dtype], ids=["shape", "dtype"])
def test_an_edited_shape_or_dtype_is_detected_everywhere_and_never_served(tmp_path, edit, capsys):
    from gpufeed.cli.main import main

    ds = _dataset()
    loader = gf.accelerate(ds, batch_size=8, device="cpu", cache=tmp_path, progress=False, seed=3)
    entry = Path(loader.plan.cache_path)
    expected = _first_batch(loader)
    _edit_manifest(entry, edit)
    with pytest.raises(CacheError, match="does not match its own digest"):
        open_cache(entry)
    assert main(["cache", "verify", str(entry)]) == 1
    assert "does not match its own digest" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="rebuilding the cache: .*does not match its own digest"):
        again = gf.accelerate(ds, batch_size=8, device="cpu", cache=tmp_path, progress=False, seed=3)
    assert _first_batch(again) == expected  # rebuilt from the dataset, not served from the edited entry


@pytest.mark.parametrize(
    "dtype, match",
    [(">i8", "big-endian dtype '>i8'"), ("<c16", "dtype '<c16', which gpufeed never writes"), ("=i8", "native")],
)
def test_a_forged_dtype_or_byte_order_is_a_typed_error(tmp_path, dtype, match):
    cache = build_cache(_dataset(), tmp_path / "entry", progress=False)
    _edit_manifest(cache.path, lambda raw: raw["arrays"]["labels"].update(dtype=dtype), fix_digest=True)
    with pytest.raises(CacheError, match=match):
        open_cache(cache.path)


def test_labels_are_stored_little_endian_with_an_explicit_byte_order(tmp_path):
    cache = build_cache(_dataset(), tmp_path / "entry", progress=False)
    arrays = json.loads((cache.path / MANIFEST).read_text())["arrays"]
    assert (arrays["images"]["dtype"], arrays["labels"]["dtype"]) == ("|u1", "<i8")
    assert (cache.path / "labels.bin").read_bytes()[:16] == (0).to_bytes(8, "little") + (1).to_bytes(8, "little")


def test_a_cache_inside_the_datasets_own_directory_is_refused(tmp_path):
    folder = user_folder(tmp_path)
    ds = ImageFolder(str(folder), transform=T.Compose([T.Resize((8, 8)), T.RandomHorizontalFlip(), T.ToTensor()]))
    before = snapshot(tmp_path)
    with pytest.raises(CacheWriteError, match="gpufeed never writes into a dataset's directory"):
        build_cache(ds, folder / "cache", progress=False)
    with pytest.warns(UserWarning, match=rf"stays in memory.*inside {folder}, the directory of the dataset"):
        loader = gf.accelerate(ds, batch_size=2, device="cpu", cache=folder, progress=False)
    assert loader.plan.cache_path is None and len(list(loader)) == 2
    assert snapshot(tmp_path) == before
    assert ImageFolder(str(folder)).classes == ["class0", "class1"]
    loader = gf.accelerate(ds, batch_size=2, device="cpu", cache=tmp_path / "elsewhere", progress=False)
    assert loader.plan.cache_path.startswith(str(tmp_path / "elsewhere"))


def test_a_dataset_rooted_at_the_working_directory_does_not_block_the_default_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # e.g. MNIST(".") run from $HOME, with the cache under ~/.cache/gpufeed
    ds = cifar_like(20, root=".", transform=T.Compose([T.Resize(16), T.ToTensor()]))
    ds.base_folder = None  # a dataset whose data is not in root/base_folder (MNIST, a custom one)
    cache = build_cache(ds, tmp_path / ".cache" / "gpufeed" / "entry", progress=False)
    assert cache.images.shape == (20, 3, 16, 16)


_NO_ACCESS = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, {tests!r})
    import torchvision.transforms as T
    import gpufeed as gf
    from fakes import cifar_like

    ds = cifar_like(40, transform=T.Compose([T.Resize(16), T.RandomCrop(16, padding=2), T.ToTensor()]))
    out = {{}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = gf.accelerate(ds, batch_size=8, device="cpu", cache={root!r}, progress=False)
    out["warnings"] = [str(w.message) for w in caught]
    out["batches"] = len(list(loader))
    try:
        gf.build_cache(ds, root={root!r}, progress=False)
    except gf.CacheError as e:
        out["error"] = [type(e).__name__, str(e)]
    print(json.dumps(out))
""")


def test_a_cache_location_that_cannot_even_be_read_keeps_the_data_in_memory():
    locked = Path(tempfile.mkdtemp(prefix="gpufeed-locked-"))
    try:
        gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=locked, progress=False)  # an entry in there
        locked.chmod(0o000)
        script = _NO_ACCESS.format(tests=TESTS, root=str(locked))
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, preexec_fn=_unprivileged)
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout.strip().splitlines()[-1])
        assert out["batches"] == 5 and sum("stays in memory" in w for w in out["warnings"]) == 1
        assert out["error"][0] == "CacheWriteError" and "Permission denied" in out["error"][1]
    finally:
        locked.chmod(0o755)
        shutil.rmtree(locked)


def test_an_entry_whose_manifest_is_garbled_is_not_deleted_but_does_not_block_training(tmp_path, capsys):
    from gpufeed.cli.main import main

    loader = gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=tmp_path, progress=False)
    entry = Path(loader.plan.cache_path)
    raw = bytearray((entry / MANIFEST).read_bytes())
    raw[30] = 0  # one byte: the manifest no longer parses, so nothing proves gpufeed wrote this directory
    (entry / MANIFEST).write_bytes(bytes(raw))
    before = snapshot(tmp_path)
    with pytest.warns(UserWarning, match=rf"stays in memory.*{entry} holds only files named as a gpufeed cache's"):
        again = gf.accelerate(_dataset(), batch_size=8, device="cpu", cache=tmp_path, progress=False)
    assert _first_batch(again) == _first_batch(loader)
    assert main(["cache", "clear", str(entry)]) == 1
    assert f"delete it yourself (rm -r {entry})" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
