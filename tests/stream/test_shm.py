"""Shared-memory hygiene: a reader killed with its process group leaves the engine's blocks, the next run cleans them
and works; blocks a living process uses are never touched. One job per local directory: another job on it is refused
by name, the ranks of one job share it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.errors import ConfigError
from gpufeed.mds import shm
from gpufeed.mds.shards import Shards

from .mds import MDS_SCRIPT, child_env, payload, recipe, write_mds

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")
pytestmark = pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm on this system")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_mds(tmp_path_factory.mktemp("shm") / "mds", 40)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the child did not get ready (exit {proc.poll()}): {out[-2000:]}")
        time.sleep(0.05)


def test_a_reader_killed_with_its_process_group_leaves_blocks_the_next_run_cleans_and_works(data, tmp_path):
    from streaming import StreamingDataset

    local, ready = tmp_path / "cache", tmp_path / "ready"
    cmd = [sys.executable, str(MDS_SCRIPT), "hold", str(data), str(local), str(ready)]
    child = subprocess.Popen(
        cmd,
        env=child_env(tmp_path),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(ready, child)
        (prefix, names), *others = shm.blocks_naming(local).items()
        assert not others and f"{prefix}_locals" in names and len(names) >= 6
        # alive: another job (this process) is refused, naming the living run; its blocks are mapped: nothing may
        # be cleaned
        pid = int(ready.read_text())
        with pytest.raises(
            ConfigError, match=rf"local={local} is in use by another job: pid {pid} on .*another local="
        ):
            shm.hold(local)
        with pytest.raises(ConfigError, match=rf"in use by another job: pid {pid} .*running .*mds.py hold"):
            Shards(local, str(data))  # refused before any engine object is made
        assert shm.clean_stale(local) == []
        assert shm.blocks_naming(local) == {prefix: names}
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the reader and its resource tracker, as a scheduler kills a job
        child.wait(10)
        child.stdout.close()  # type: ignore[union-attr]
    assert shm.blocks_naming(local) == {prefix: names}, "the killed run's blocks are left behind"
    # the engine alone cannot start again on this directory
    with pytest.raises(ValueError, match="Reused local directory"):
        StreamingDataset(remote=str(data), local=str(local))
    with Shards(local, str(data)) as shards:
        assert shards._lock is not None and shards._lock.first and sorted(shards._lock.cleaned) == sorted(names)
        assert shards.read([3]).images == [payload(3)]
        mine = shm.blocks_naming(local)
        assert len(mine) == 1 and set(next(iter(mine.values()))) <= shm.mapped_blocks()


def test_the_blocks_of_a_living_reader_outside_gpufeed_are_never_touched(data, tmp_path):
    from streaming import StreamingDataset

    local = tmp_path / "theirs"
    theirs = StreamingDataset(remote=str(data), local=str(local), batch_size=4)
    blocks = shm.blocks_naming(local)
    assert len(blocks) == 1
    with shm.hold(local) as lock:  # no gpufeed run holds it, but the blocks are mapped by a living process
        assert lock.first and lock.cleaned == []
    assert shm.clean_stale(local) == [] and shm.blocks_naming(local) == blocks
    assert theirs[5]["image"] == payload(5)


def test_the_first_holder_of_a_directory_is_told_so_and_the_others_share_it(tmp_path):
    local = tmp_path / "cache"
    a = shm.hold(local)
    b = shm.hold(local)
    assert (a.first, b.first) == (True, False)
    assert a.path == b.path == local / ".gpufeed-claim"  # in the directory it protects
    record = json.loads(a.path.read_text())
    assert (record["local"], record["pid"], record["job"]) == (str(local), os.getpid(), shm.job())
    a.release()
    b.release()
    with shm.hold(local) as c:
        assert c.first


def _as_rank_of(monkeypatch, port: str | None) -> None:
    """This process as a rank of a torchrun job whose rendezvous is on ``port`` (None: a job of its own)."""
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    if port is None:
        for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", "4")
        monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
        monkeypatch.setenv("MASTER_PORT", port)


def test_the_ranks_of_one_job_share_a_directory_and_another_job_is_refused_naming_it(tmp_path, monkeypatch):
    # flock is per open file: two holds in one process contend as two processes do, so each hold here stands for a
    # rank of its own; the job each belongs to is read from its environment, as torchrun sets it
    local = tmp_path / "cache"
    _as_rank_of(monkeypatch, "29500")
    ranks = [shm.hold(local), shm.hold(local), shm.hold(local)]  # three ranks of one job on this node
    assert [r.first for r in ranks] == [True, False, False]
    for port in ("29501", None):  # another torchrun job, then a single process
        _as_rank_of(monkeypatch, port)
        with pytest.raises(ConfigError) as refused:
            shm.hold(local)
        text = str(refused.value)
        assert f"in use by another job: pid {os.getpid()} on {socket.gethostname()}" in text
        assert "(job MASTER_ADDR=10.1.2.3 MASTER_PORT=29500; this one is " in text and "another local=" in text
    _as_rank_of(monkeypatch, "29500")
    with shm.hold(local) as late:  # a rank of the first job that comes late still joins
        assert not late.first
    for r in ranks:
        r.release()
    _as_rank_of(monkeypatch, "29501")
    with shm.hold(local) as other:  # the first job ended: the next one takes the directory over
        assert other.first and json.loads(other.path.read_text())["job"] == "MASTER_ADDR=10.1.2.3 MASTER_PORT=29501"


def test_a_job_is_named_by_its_launchers_rendezvous_and_a_lone_process_by_its_pid():
    rank = {"WORLD_SIZE": "8", "MASTER_ADDR": "node7", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r1"}
    assert shm.job(rank) == "TORCHELASTIC_RUN_ID=r1 MASTER_ADDR=node7 MASTER_PORT=29500"
    assert shm.job({**rank, "MASTER_PORT": "29501"}) != shm.job(rank)
    assert shm.job({"WORLD_SIZE": "2", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}) == "SLURM_JOB_ID=77 SLURM_STEP_ID=0"
    assert shm.job({"WORLD_SIZE": "2"}) == f"ppid={os.getppid()}@{socket.gethostname()}"  # mp.spawn's ranks
    assert shm.job({"WORLD_SIZE": "1", "MASTER_PORT": "29500"}) == f"pid={os.getpid()}@{socket.gethostname()}"
    # ranks placed by gf.stream(layout=...) before any process group or launcher variable: one job, by its parent
    assert shm.job({}, ranks=2) == f"ppid={os.getppid()}@{socket.gethostname()}"


def test_readers_of_one_remote_in_a_process_share_the_engine_object_and_leak_nothing(data, tmp_path):
    local = tmp_path / "cache"
    first = Shards(local, str(data))
    second = Shards(local, str(data))  # the same engine object: not "in use"
    assert second._ds is first._ds and second.read([9]).images == [payload(9)]
    first.close()
    assert second.read([10]).images == [payload(10)]
    second.close()
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):  # an evaluation loader rebuilt every epoch
        with Shards(local, str(data)) as shards:
            shards.read([3])
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_job_with_another_cache_dir_or_home_on_the_same_local_is_refused_by_the_claim_in_local(
    data, tmp_path, monkeypatch
):
    # the outside trial: a second user (another HOME) or another GPUFEED_CACHE_DIR on the same local held a lock of
    # its own (the lock lived under the cache directory) and was served 72/72 while the first job held local
    from gpufeed.mds import shards as shards_module

    local = tmp_path / "cache"
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "first-cache"))
    first = Shards(local, str(data))
    assert (local / ".gpufeed-claim").is_file()
    _as_rank_of(monkeypatch, "29700")  # another job (a torchrun rank of another rendezvous) ...
    monkeypatch.setenv("GPUFEED_CACHE_DIR", str(tmp_path / "second-cache"))  # ... with its own cache directory
    monkeypatch.setenv("HOME", str(tmp_path / "another-user"))
    monkeypatch.setattr(shards_module, "_OPEN", {})  # as in another process: no engine object of this one's
    for where in (local, tmp_path / "link"):  # the directory itself, and a symlink to it: one claim
        if where != local:
            where.symlink_to(local)
        with pytest.raises(ConfigError) as refused:
            Shards(where, str(data))
        text = str(refused.value)
        assert f"in use by another job: pid {os.getpid()} on {socket.gethostname()}" in text
        assert "give this job another local=" in text and str(local / ".gpufeed-claim") in text
    first.close()


def test_a_claim_left_by_a_dead_process_is_taken_over_and_local_only_data_takes_none(data, tmp_path, monkeypatch):
    local = tmp_path / "cache"
    local.mkdir()
    dead = {"local": str(local), "job": "pid=999999@elsewhere", "pid": 999999, "host": "elsewhere", "since": 0}
    (local / ".gpufeed-claim").write_text(json.dumps(dead))  # its holder died: no flock on it
    with shm.hold(local) as lock:
        assert lock.first and json.loads(lock.path.read_text())["pid"] == os.getpid()
    # local-only data is only read: no claim, nothing written into the dataset (a read-only mount works), and any
    # number of jobs read it at once
    from fakes import snapshot

    before = snapshot(data)
    _as_rank_of(monkeypatch, "29800")
    with Shards(data) as one:
        _as_rank_of(monkeypatch, "29801")
        with Shards(data) as two:
            assert one.read([7]).images == two.read([7]).images == [payload(7)]
    assert snapshot(data) == before


def test_a_read_only_local_for_a_remote_is_refused_before_anything_is_fetched(data, tmp_path, monkeypatch):
    import gpufeed as gf
    from gpufeed.mds import local as local_module

    local = tmp_path / "mounted"
    local.mkdir()
    real = os.access
    monkeypatch.setattr(local_module.os, "access", lambda p, mode: real(p, mode) and not mode & os.W_OK)
    with pytest.raises(ConfigError, match=r"local='.*mounted' is read-only, and remote='.*' is downloaded into it"):
        gf.stream(str(data), local, transform=recipe(), batch_size=4)
    assert list(local.iterdir()) == []


_CLAIMANT = """
import os, sys, time
from gpufeed.errors import ConfigError
from gpufeed.mds import shm
local, go, done = sys.argv[1:]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
try:
    lock = shm.hold(local)
    print("held", lock.first, flush=True)
except ConfigError as e:
    print("refused", str(e).split(" (job")[0], flush=True)
    sys.exit(0)
while not os.path.exists(done):
    time.sleep(0.01)
"""


def test_processes_racing_for_one_local_leave_exactly_one_holder_and_name_it_to_the_others(tmp_path):
    # real processes (flock is per open file: in-process holds cannot race for it), released together, each a job
    # of its own; whoever wins, the others are refused naming it
    local, go, done = tmp_path / "cache", tmp_path / "go", tmp_path / "done"
    env = child_env(tmp_path)
    for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        env.pop(name, None)
    children = [
        subprocess.Popen([sys.executable, "-c", _CLAIMANT, local, go, done], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(4)
    ]
    try:
        assert [c.stdout.readline().strip() for c in children] == ["ready"] * 4
        go.touch()
        said = [c.stdout.readline().strip() for c in children]
    finally:
        done.touch()
        for c in children:
            c.wait(timeout=120)
    held = [(c.pid, s) for c, s in zip(children, said, strict=True) if s.startswith("held")]
    assert len(held) == 1 and held[0][1] == "held True", said
    winner = held[0][0]
    refused = [s for s in said if s.startswith("refused")]
    assert len(refused) == 3 and all(f"in use by another job: pid {winner} on" in s for s in refused), said


@pytest.mark.parametrize("kind", ["a link", "a directory", "a FIFO"])
def test_a_claim_path_that_holds_no_claim_file_is_refused_and_left_alone(tmp_path, kind):
    # a shared local (a team's scratch) where someone left .gpufeed-claim -> another user's file: gpufeed truncated
    # and overwrote that file with its claim; a directory there made the claim a warning and the job unclaimed
    local, victim = tmp_path / "shared", tmp_path / "notes.txt"
    local.mkdir()
    victim.write_text("precious\n")
    claim = local / ".gpufeed-claim"
    {"a link": lambda: claim.symlink_to(victim), "a directory": claim.mkdir, "a FIFO": lambda: os.mkfifo(claim)}[kind]()
    said = {"a link": rf"a symbolic link \(to {victim}\)", "a directory": "a directory", "a FIFO": "not a regular"}
    with pytest.raises(ConfigError, match=rf"the claim file {claim} is {said[kind]}.*; remove it .*or give another"):
        shm.hold(local)
    assert victim.read_text() == "precious\n" and sorted(p.name for p in local.iterdir()) == [".gpufeed-claim"]


def test_a_claim_that_says_nothing_is_taken_over_when_free_and_refused_while_another_holds_it(tmp_path):
    # its first holder died (or hit a full disk) between emptying the file and writing it: it was read as "no job",
    # and every later job was served beside whoever held it
    local = tmp_path / "cache"
    local.mkdir()
    claim = local / ".gpufeed-claim"
    claim.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, os, sys; fd = os.open({str(claim)!r}, os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"is held by another process whose claim \({claim}\) says nothing"):
            shm.hold(local)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with shm.hold(local) as lock:  # no one holds it now: taken over, and written
        assert lock.first and json.loads(claim.read_text())["pid"] == os.getpid()


def test_a_claim_that_cannot_be_written_or_locked_is_said_not_a_raw_os_error(tmp_path, monkeypatch):
    import errno
    import fcntl
    import warnings

    from gpufeed.errors import CacheWriteError

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(shm.os, "pwrite", full)
        with pytest.raises(CacheWriteError, match=r"cannot write the claim file .*/a/.gpufeed-claim \(No space left"):
            shm.hold(tmp_path / "a")
    real = fcntl.flock

    def no_shared_lock(fd, operation):  # NFS without its lock daemon refuses some calls with ENOLCK
        if operation == fcntl.LOCK_SH:
            raise OSError(errno.ENOLCK, "No locks available")
        real(fd, operation)

    monkeypatch.setattr(shm.fcntl, "flock", no_shared_lock)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lock = shm.hold(tmp_path / "b")
    assert lock.path is None and not lock.first
    assert [str(w.message).split(" (")[0] for w in said] == [f"cannot claim {tmp_path / 'b'}"]
    assert "No locks available: this file system has no working flock" in str(said[0].message)
