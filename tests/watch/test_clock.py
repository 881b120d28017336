"""The CUDA clock of a watched loop, with events that complete when told: exact step times, few events held, no
synchronisation before the flush."""

import math

from gpufeed.watch.clock import READ_EVERY, DeviceClock, nvml_index


class _Events:
    """A stand-in for ``torch.cuda``: event ``k`` is recorded at time ``k * k`` ms and completes when released."""

    def __init__(self) -> None:
        self.made: list[_Event] = []
        self.released = 0  # events with an index under this have completed
        self.synchronized = 0

    def Event(self, enable_timing: bool) -> "_Event":  # noqa: N802 - torch.cuda.Event's name
        assert enable_timing
        self.made.append(_Event(self, len(self.made)))
        return self.made[-1]


class _Event:
    def __init__(self, cuda: _Events, k: int) -> None:
        self.cuda, self.k = cuda, k

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return self.k < self.cuda.released

    def synchronize(self) -> None:
        self.cuda.synchronized += 1
        self.cuda.released = max(self.cuda.released, self.k + 1)

    def elapsed_time(self, other: "_Event") -> float:
        assert self.query() and other.query()
        return float(other.k * other.k - self.k * self.k)


def test_completed_events_become_exact_step_times_and_a_long_run_holds_few_events():
    cuda, clock = _Events(), DeviceClock()
    for batch in range(1000):
        cuda.released = max(0, batch - 3)  # the device runs 3 batches behind the host
        clock.mark(batch, cuda)
        assert len(clock.events) <= READ_EVERY
    assert cuda.synchronized == 0  # nothing waited for the device inside the loop
    steps = clock.steps(1000)
    assert cuda.synchronized == 1 and len(clock.events) == 1  # the last, kept for a next pair
    assert steps == [((k + 1) ** 2 - k * k) / 1000 for k in range(999)]


def test_batches_before_cuda_was_up_have_no_device_time_and_no_cuda_means_none():
    cuda, clock = _Events(), DeviceClock()
    for batch in (3, 4, 5):  # CUDA came up at the fourth batch
        clock.mark(batch, cuda)
    steps = clock.steps(7)  # two more batches after the last mark: unknown
    assert steps is not None and len(steps) == 6
    assert all(math.isnan(s) for s in steps[:3] + steps[5:])
    assert steps[3:5] == [(1 * 1 - 0) / 1000, (2 * 2 - 1) / 1000]  # events 0, 1, 2 at 0, 1 and 4 ms
    assert DeviceClock().steps(10) is None


def test_the_nvml_index_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert (nvml_index(0), nvml_index(1), nvml_index(2)) == (3, 1, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_index(1) == 1
