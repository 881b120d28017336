"""The per-sample fallback when one of its DataLoader workers dies (SIGKILL, as the out-of-memory killer
sends): a typed error naming the worker, the state kept at the failed position, fresh workers next time."""

import os
import signal
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

import gpufeed as gf

N, BATCH = 40, 4  # 10 batches an epoch


class Doomed(Dataset):
    """Sample ``i`` is a tensor filled with ``i`` and the label ``i``; the worker that loads sample ``doom``
    while ``flag`` exists kills itself with SIGKILL (once: it removes the flag first)."""

    def __init__(self, flag: Path | None = None, doom: int = -1) -> None:
        self.flag, self.doom = flag, doom

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        if i == self.doom and self.flag is not None and self.flag.exists():
            self.flag.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((3, 4, 4), float(i)), i


def _loader(dataset: Dataset, workers: int = 2, device: torch.device | None = None) -> gf.FallbackLoader:
    return gf.FallbackLoader(
        dataset,
        None,
        BATCH,
        True,
        False,
        device or torch.device("cpu"),
        5,
        dtype=None,
        channels_last=False,
        num_workers=workers,
        reason="a test of worker deaths",
    )


def _labels(batches) -> list[int]:
    return [i for _, y in batches for i in y.tolist()]


def _position(loader) -> tuple[int, int]:
    state = loader.state_dict()
    return state["epoch"], state["batch"]


def _order(epoch: int) -> list[int]:
    return gf.sampling.epoch_order(5, epoch, N).tolist()


def test_a_worker_killed_mid_epoch_is_a_worker_error_and_the_next_epoch_gets_fresh_workers(tmp_path, device):
    # On CUDA the batches are pinned by the DataLoader's pin-memory thread, which stopping the workers must not hang.
    flag = tmp_path / "kill-once"
    flag.touch()
    doom = _order(0)[6 * BATCH]  # a sample of batch 6 of epoch 0
    loader = _loader(Doomed(flag, doom), device=device)
    got, broken = [], loader.loader
    # torch's SIGCHLD handler would raise its own RuntimeError wherever this thread happens to be (here: maybe in
    # this loop's body); blocked, the death is found by the DataLoader's own check, inside the loader's iteration.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        with pytest.raises(gf.WorkerError) as error:
            for batch in loader:
                got.append(batch)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    served = len(got)
    assert not flag.exists() and served <= 6  # batch 6 never came, nor any after it
    assert _labels(got) == _order(0)[: served * BATCH]
    message = str(error.value)
    assert "was killed by SIGKILL" in message and "during epoch 0" in message
    assert f"loader.set_epoch(0, batch={served})" in message and "out-of-memory killer" in message
    assert _position(loader) == (0, served)  # the state keeps the failed position
    assert len(broken._iterator._workers) == 2 and not any(w.is_alive() for w in broken._iterator._workers)
    assert loader.loader is not broken and loader.loader._iterator is None  # replaced; its workers start when used

    epoch1 = list(loader)  # a new for: fresh workers, the next epoch, as after a break
    assert _labels(epoch1) == _order(1) and _position(loader) == (2, 0)
    assert all(torch.equal(x, y.float().view(-1, 1, 1, 1).expand(-1, 3, 4, 4)) for x, y in epoch1)

    loader.set_epoch(0, batch=served)  # what the message names: finish the failed epoch
    assert _labels(list(loader)) == _order(0)[served * BATCH :]


def test_a_state_saved_after_a_worker_death_resumes_the_failed_epoch_in_a_fresh_loader(tmp_path):
    flag = tmp_path / "kill-once"
    flag.touch()
    loader = _loader(Doomed(flag, _order(0)[3 * BATCH]))
    got = []
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        with pytest.raises(gf.WorkerError):
            got.extend(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    state = loader.state_dict()
    fresh = _loader(Doomed(), workers=0)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert _labels(got) + _labels(rest) == _order(0)  # nothing lost, nothing twice


def test_a_worker_killed_while_the_training_step_runs_leaves_a_loader_that_recovers():
    # The SIGCHLD handler torch installs raises its RuntimeError wherever the main thread is when the worker dies:
    # in the loop's body here, or inside the loader's iteration (then a WorkerError). Either way the loop ends,
    # the state keeps the position, and the next iteration does not inherit the dead worker.
    loader = _loader(Doomed())
    got = []
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for batch in loader:
            got.append(batch)
            if len(got) == 2:
                pid = loader.loader._iterator._workers[0].pid
                os.kill(pid, signal.SIGKILL)
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: torch's handler sees it
    assert _position(loader) == (0, len(got))
    assert _labels(list(loader)) == _order(1)
    assert _labels(list(loader)) == _order(2)


def test_an_eof_from_a_worker_the_kernel_has_not_reaped_yet_is_still_a_worker_death():
    # A worker killed while passing a batch's shared memory: the parent reads EOF before the process is gone.
    # The worker reports itself gone at its n-th is_alive() (not after a time, which a loaded machine could reach
    # before the first ask): what is asked once and what is asked again is then the same at any speed.
    from gpufeed.workers import workers_that_died

    class Worker:
        pid, exitcode = 4321, -signal.SIGKILL

        def __init__(self, alive_for):
            self.asks, self.alive_for = 0, alive_for

        def is_alive(self):
            self.asks += 1
            return self.asks <= self.alive_for

    class Iterator:
        _shutdown = False

        def __init__(self, alive_for):
            self._workers = [Worker(10**9), Worker(alive_for)]

    eof = Iterator(3)
    assert workers_that_died(eof, EOFError()) == ["1 (pid 4321) was killed by SIGKILL"]
    assert eof._workers[1].asks == 4  # asked again (every 0.05 s, up to 5 s) until it reported itself gone
    assert workers_that_died(Iterator(3), ConnectionResetError()) == ["1 (pid 4321) was killed by SIGKILL"]
    other = Iterator(3)
    assert workers_that_died(other, ValueError("a sample's own error")) == []  # answered at once
    assert other._workers[1].asks == 1
    assert workers_that_died(Iterator(10**9), EOFError(), wait_s=0.2) == []  # not a death after all: the error stands


def test_torchs_sigchld_handler_firing_while_gpufeed_waits_for_the_dead_worker_is_taken_as_that_death(monkeypatch):
    # Python runs the handler in the main thread whenever the signal comes, even when the main thread blocks SIGCHLD
    # and another thread takes it: it raised torch's RuntimeError inside gpufeed's wait, not the WorkerError.
    from gpufeed import workers

    class Worker:
        pid, exitcode = 4242, -9

        def __init__(self):
            self.alive = True

        def is_alive(self):
            return self.alive

    class Iterator:
        _workers = [Worker()]

    it = Iterator()

    def handler_fires(seconds):
        it._workers[0].alive = False  # the kernel reports it gone, and torch's handler raises here
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")

    monkeypatch.setattr(workers.time, "sleep", handler_fires)
    assert workers.workers_that_died(it, EOFError()) == ["0 (pid 4242) was killed by SIGKILL"]
    monkeypatch.setattr(workers.time, "sleep", lambda s: (_ for _ in ()).throw(RuntimeError("something else")))
    it._workers[0].alive = True
    with pytest.raises(RuntimeError, match="something else"):
        workers.workers_that_died(it, EOFError())


def test_a_loader_collected_in_a_reference_cycle_stops_its_workers_without_terminating_them(monkeypatch):
    # Left to torch, the cycle's collection closed the index queues' feeders before the sentinels were put: each
    # worker waited out torch's 5 s join, then torch terminated it. Stopped by gpufeed's finalizer (NOTE [ Stopping
    # the persistent workers ]), each gets its sentinel and exits on its own within the collection: none is
    # terminated.
    import gc
    import multiprocessing.process

    terminated = []
    terminate = multiprocessing.process.BaseProcess.terminate
    monkeypatch.setattr(
        multiprocessing.process.BaseProcess, "terminate", lambda w: terminated.append(w) or terminate(w)
    )
    loader = _loader(Doomed())
    loader.cycle = loader
    next(iter(loader))
    workers = list(loader.loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    del loader
    gc.collect()
    assert not terminated and not any(w.is_alive() for w in workers)
