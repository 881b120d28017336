"""gpufeed.threads.spread: every item once, on the caller's thread and the pool's, an error raised after all stop."""

from __future__ import annotations

import threading

import pytest

from gpufeed.threads import spread


def test_every_item_runs_once_on_the_workers_asked_for_the_caller_among_them():
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()

    def each(i: int) -> None:
        with lock:
            seen.append((i, threading.current_thread().name))

    spread(each, 200, threads=3)
    assert sorted(i for i, _ in seen) == list(range(200))
    others = {name for _, name in seen} - {threading.current_thread().name}  # the caller works too
    assert len(others) <= 2 and all(name.startswith("gpufeed-work") for name in others)
    seen.clear()
    spread(each, 5, threads=1)  # one worker: this thread, in order
    assert seen == [(i, threading.current_thread().name) for i in range(5)]
    spread(each, 0)
    assert len(seen) == 5


def test_an_error_stops_the_workers_taking_more_and_is_raised_once_all_stopped():
    started: list[int] = []
    running = threading.Event()

    def each(i: int) -> None:
        started.append(i)
        if i == 3:
            raise ValueError(f"item {i}")
        running.wait(0.001)

    with pytest.raises(ValueError, match="item 3"):
        spread(each, 1000, threads=2)
    assert 3 in started and len(started) < 1000  # the rest were not taken


def test_a_signal_in_the_calling_thread_is_raised_not_lost():
    # the calling thread works too: Ctrl-C's KeyboardInterrupt arrives in it between items and must reach the caller
    calls = []
    interrupted = threading.Event()

    def each(i: int) -> None:
        calls.append(i)
        if threading.current_thread() is threading.main_thread():
            interrupted.set()
            raise KeyboardInterrupt  # as a signal handler raises it in the main thread
        interrupted.wait(30)  # the pool's worker takes no more than its first item before it

    with pytest.raises(KeyboardInterrupt):
        spread(each, 10_000, threads=2)
    assert len(calls) < 10_000  # the pool's worker stopped taking items


def test_a_pool_workers_error_is_raised_after_the_caller_stops():
    failed = threading.Event()

    def each(i: int) -> None:
        if threading.current_thread() is threading.main_thread():
            failed.wait(30)  # until the pool's worker has failed on an item of its own
            return
        failed.set()
        raise OSError("a worker's file")

    with pytest.raises(OSError, match="a worker's file"):
        spread(each, 10_000, threads=2)
