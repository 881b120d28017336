"""The threads of gpufeed's CPU work: one pool for the process, and torch's intra-op threads for its batched ops.

The pool is for work that releases the GIL: decoding files (libjpeg-turbo), resizing boxes with Pillow. Threads
start as work needs them; a forked child makes its own pool (it inherits the pool but not its threads, and work
handed to it would wait forever).

NOTE [ Torch's threads on a busy machine ]
Torch runs an op on the CPU with a team of OpenMP threads (libgomp here), ``torch.get_num_threads()`` of them, by
default one per core the machine has, whatever the process may use. The team meets at a barrier at the end of each
op, its threads spinning there (``GOMP_SPINCOUNT``: 300,000 turns) before they sleep. With other processes on the
cores, one thread of the team is descheduled while the others spin for it, and each op waits a time slice:
DeviceLoader's 32 px epoch (10,000 images, crop + flip + normalise, 2 cores) took 0.16 s with 2 threads and 0.19 s
with 1 on a quiet machine, and with two busy processes beside it 0.4-23 s with 2 threads against 0.3-1.9 s with 1
(the other engineers' load varying beneath; ``OMP_WAIT_POLICY=active`` 3.5-15 s, ``GOMP_SPINCOUNT=0`` 0.25-0.9 s:
the spinning is the cost, but those variables are read once, when libgomp loads, which is before gpufeed runs).
Under a cgroup quota the spinning threads spend the quota too. So gpufeed's own batched CPU ops (a loader's gather,
transform and conversion of a chunk) run under :class:`ThreadChoice`: 1 thread or ``most`` (torch's setting, at most
the cores the process may use, :func:`gpufeed.device.usable_cores`), whichever its timings of those ops show to be
faster now, re-checked as it goes (the choice below). The count is set around gpufeed's own ops only, with
``torch.set_num_threads``, and set back before a batch is handed out: the user's own ops (the training step) run as
the user set them. ``torch.set_num_threads`` sets the calling thread's OpenMP count and the default of threads
started meanwhile; a thread of the user's started during one of gpufeed's ops would take that count.
``GPUFEED_THREADS``: ``auto`` (the default), ``torch`` (leave torch's setting as it is) or a number (that many).
The pixels do not depend on the count: gpufeed's fused reductions are exact sums (``augment/jitter.py``), and torch
splits a reduction with several outputs by output (sample), but one with a single output within it, where the float
sum's order follows the count: so one sample's mean runs on one thread (``augment/color.py``'s ``_mean``: the host
path hands an adjustment the samples its slot picks, often one), and a chunk of one sample runs at ``most``, outside
the choice. A transform of the user's own that reduces a whole chunk to one value (a batch mean) would follow it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import torch

from .device import usable_cores
from .errors import ConfigError

__all__ = ["ThreadChoice", "pool", "spread", "torch_threads"]

T = TypeVar("T")

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """The process's pool."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(64, thread_name_prefix="gpufeed-work")
        return _POOL


def _forget_pool() -> None:
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def spread(each: Callable[[int], None], items: int, threads: int | None = None) -> None:
    """``each(i)`` for every ``i`` below ``items``, on ``threads`` workers (default the usable cores, at most
    ``items``): this thread and the pool's, each taking the next item as it finishes one (images of different
    sizes take different times: items dealt in turn left one worker idle at the end of each batch). An error stops
    the workers taking more and is raised here once every worker has stopped: this thread's own first (an item's,
    or a signal's: Ctrl-C), else a pool worker's."""
    workers = min(usable_cores() if threads is None else threads, items)
    if workers <= 1:
        for i in range(items):
            each(i)
        return
    order, lock = iter(range(items)), threading.Lock()
    stop = threading.Event()  # set: take no more items

    def work() -> None:
        while not stop.is_set():
            with lock:
                i = next(order, None)
            if i is None:
                return
            try:
                each(i)
            except BaseException:
                stop.set()
                raise

    others: list[Future[None]] = []
    try:
        for _ in range(workers - 1):
            others.append(pool().submit(work))
        work()
        for f in others:
            f.result()
    except BaseException:  # an item's error (this thread's first), a worker's, or a signal's (Ctrl-C)
        stop.set()
        wait(others)  # the items they hold finish; their errors give way to this one
        raise


def _setting() -> str | int:
    """``GPUFEED_THREADS``: ``"auto"``, ``"torch"`` or a positive thread count (read at each step: a change
    applies from the next chunk)."""
    text = os.environ.get("GPUFEED_THREADS", "auto").strip().lower() or "auto"
    if text in ("auto", "torch"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError(
        f"GPUFEED_THREADS={text!r} must be 'auto' (choose 1 thread or torch's setting by measurement), 'torch' "
        "(leave torch's setting as it is) or a positive number of threads"
    )


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Torch's intra-op thread count set to ``threads`` within the block, and set back after it (see NOTE [ Torch's
    threads on a busy machine ]); nothing is called when it is that already."""
    before = torch.get_num_threads()
    if threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ThreadChoice:
    """Torch's intra-op threads for gpufeed's own batched CPU ops: 1 or ``most``, whichever runs them faster now.

    NOTE [ Torch's threads on a busy machine ] says why. The choice, from the seconds each step took per sample:
    one thread runs the first :attr:`PROBES` steps; then the other count is tried, and again whenever the time spent
    since its last try is 1 / :attr:`OVERHEAD` times what its last step cost, so that the tries cost at most 5% of
    the time however slow the other count is (a team that collapsed, 30x slower, is tried rarely), and at once when a
    step of ``most`` threads takes :attr:`SPIKE` times its median (the machine got busy; one thread is cheap to
    try). A try ends at its first step slower than the chosen count's median (by :attr:`MARGIN`); one that is not
    goes on for :attr:`PROBES` steps, and the medians decide: ``most`` only when it is :attr:`MARGIN` faster (one
    thread leaves the other cores to the training step, and never collapses).

    Example:
        >>> choice = ThreadChoice(2)
        >>> for _ in range(4):  # one thread 10 ms a step, two threads 30 ms: the team collapses
        ...     threads = choice.next()
        ...     choice.record(threads, 0.010 if threads == 1 else 0.030, items=256)
        >>> choice.chosen, choice.next()
        (1, 1)
    """

    PROBES = 3
    MARGIN = 0.9
    OVERHEAD = 0.05
    SPIKE = 2.0

    def __init__(self, most: int | None = None, device: torch.device | None = None) -> None:
        self.on_cpu = device is None or device.type == "cpu"
        self._reset(min(torch.get_num_threads(), usable_cores()) if most is None else most)

    def _reset(self, most: int) -> None:
        self.most = max(1, most)
        self.times: dict[int, deque[float]] = {c: deque(maxlen=self.PROBES) for c in {1, self.most}}
        self.cost: dict[int, float] = {}  # seconds the last step of each count took (what trying it again costs)
        self.chosen = 1
        self.trying: int | None = None  # the other count, on trial
        self.tried = 0  # steps of the trial so far
        self.since = 0.0  # seconds spent on the chosen count since the other was last tried

    def next(self) -> int:
        """The thread count for the next step."""
        if self.trying is not None or self.most == 1:
            return self.trying or 1
        other = self._other()
        ready = len(self.times[self.chosen]) >= self.PROBES or self.since == float("inf")  # probed, or a spike
        if ready and self.since >= self.cost.get(other, 0.0) / self.OVERHEAD:
            self.trying, self.tried = other, 0
            self.times[other].clear()  # its old steps ran in other conditions
            return other
        return self.chosen

    def record(self, threads: int, seconds: float, items: int = 1) -> None:
        """``threads`` ran a step of ``items`` samples in ``seconds``."""
        if threads not in self.times:
            return
        per = seconds / max(1, items)
        self.cost[threads] = seconds
        if threads == self.trying:
            self.times[threads].append(per)
            self.tried += 1
            slower = per > statistics.median(self.times[self.chosen]) / self.MARGIN
            if slower or self.tried >= self.PROBES:
                self.trying, self.since = None, 0.0
                if not slower:
                    self._decide()
            return
        before = statistics.median(self.times[threads]) if self.times[threads] else per
        self.times[threads].append(per)
        self.since += seconds
        if threads > 1 and per > self.SPIKE * before:  # the machine got busy: try one thread now, against this step
            self.times[threads] = deque([per], maxlen=self.PROBES)
            self.since = float("inf")
            # and, should one thread be chosen, this count tried again soon: a single slow step (a blip) is no
            # collapse; a collapse shows itself at that try, whose cost then spaces the next
            self.cost[threads] = before * max(1, items)

    def _other(self) -> int:
        return 1 if self.chosen == self.most else self.most

    def _decide(self) -> None:
        one, most = statistics.median(self.times[1]), statistics.median(self.times[self.most])
        self.chosen = self.most if most < self.MARGIN * one else 1

    @contextlib.contextmanager
    def step(self, size: int, timed: bool = True) -> Iterator[int]:
        """The block (one step of gpufeed's ops on ``size`` samples) run under the chosen count, timed; yields the
        count. Torch's setting is back after it (the consumer's own ops run as it set them). A step of one sample
        runs with ``most`` threads, untimed (NOTE [ Torch's threads on a busy machine ]: the pixels do not depend on
        the choice). ``timed=False``: other work than the steps the choice is made on (a batch's MixUp after its
        chunk), run with the count chosen, never a try, and not timed. Off the CPU (``device``), the block runs as it
        is: the ops run on the device."""
        if not self.on_cpu:
            yield torch.get_num_threads()
            return
        setting = _setting()
        if setting == "torch":
            threads = torch.get_num_threads()
        elif isinstance(setting, int):
            threads = setting
        else:
            self._follow()
            threads = self.most if size <= 1 else self.next() if timed else self.chosen
        start = time.perf_counter()
        with torch_threads(threads):
            yield threads
        if setting == "auto" and size > 1 and timed:
            self.record(threads, time.perf_counter() - start, size)

    def _follow(self) -> None:
        most = min(torch.get_num_threads(), usable_cores())
        if most != self.most:  # torch's setting or the usable cores changed: choose again
            self._reset(most)

    def counts(self) -> tuple[int, ...]:
        """The thread counts :meth:`step` may run gpufeed's ops with under the present setting (torch's own off the
        CPU). Dynamo compiles a fused op once per thread count it meets (it guards torch's count), so a loader runs
        its transform's first call under each: none compiles mid-epoch (NOTE [ Compiled ops ] in
        gpufeed.augment.fusion)."""
        setting = _setting() if self.on_cpu else "torch"
        if setting == "torch":
            return (torch.get_num_threads(),)
        if isinstance(setting, int):
            return (setting,)
        self._follow()
        return tuple(sorted({1, self.most}))

    def steps(self, work: Iterator[T], sizes: Iterable[int]) -> Iterator[T]:
        """``work``'s items, each made (its ``next``) in a :meth:`step`; ``sizes``: each coming item's samples, in
        order (the items are handed out outside the steps)."""
        for size in sizes:
            with self.step(size):
                item = next(work, _END)
            if item is _END:
                return
            yield item  # type: ignore[misc]


_END = object()
