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
