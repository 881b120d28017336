"""gpufeed.threads.spread: every item once, on the caller's thread and the pool's, an error raised after all stop."""

from __future__ import annotations

import threading

import pytest

from gpufeed.errors import ConfigError
from gpufeed.threads import ThreadChoice, spread


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


# ThreadChoice: torch's intra-op threads for gpufeed's own ops, chosen from constructed timings (seconds per step)


def _run(choice: ThreadChoice, seconds: dict[int, float], steps: int, items: int = 256) -> list[int]:
    """``steps`` steps, each count taking ``seconds[count]``; the counts used, in order."""
    used = []
    for _ in range(steps):
        threads = choice.next()
        used.append(threads)
        choice.record(threads, seconds[threads], items)
    return used


def test_a_team_that_collapses_is_left_after_one_step_of_its_trial():
    choice = ThreadChoice(2)
    seconds = {1: 2**-7, 2: 0.25}  # one thread 7.8 ms a step, two threads 32x that: the team collapses
    used = _run(choice, seconds, 1300)
    assert used[:4] == [1, 1, 1, 2] and choice.chosen == 1  # one thread's probes, then one step of two
    # tried again only once the time spent on one thread is 20x that step's cost: 5 s, 640 steps of 7.8 ms
    assert [i for i, t in enumerate(used) if t == 2] == [3, 3 + 640 + 1, 3 + 2 * (640 + 1)]


def test_tries_of_a_collapsed_team_cost_at_most_about_five_percent():
    choice = ThreadChoice(4)
    seconds = {1: 0.010, 4: 0.500}
    used = _run(choice, seconds, 20_000)
    tried = sum(seconds[t] for t in used if t == 4)
    total = sum(seconds[t] for t in used)
    assert choice.chosen == 1 and 0 < tried / total <= 0.05


def test_more_threads_are_chosen_on_a_quiet_machine_when_clearly_faster():
    choice = ThreadChoice(2)
    used = _run(choice, {1: 0.010, 2: 0.006}, 8)
    assert used[:6] == [1, 1, 1, 2, 2, 2] and choice.chosen == 2 and used[6:] == [2, 2]


def test_within_the_margin_one_thread_stays():
    choice = ThreadChoice(2)
    _run(choice, {1: 0.010, 2: 0.0095}, 6)  # 5% faster: not worth a team that may collapse
    assert choice.chosen == 1


def test_a_machine_that_gets_busy_mid_run_falls_back_to_one_thread_at_the_next_step():
    choice = ThreadChoice(2)
    _run(choice, {1: 0.010, 2: 0.006}, 6)
    assert choice.chosen == 2
    choice.record(choice.next(), 0.120, 256)  # two threads' step 20x slower: other processes took the cores
    used = _run(choice, {1: 0.015, 2: 0.120}, 4)
    assert used == [1, 1, 1, 1] and choice.chosen == 1  # one thread tried at once, against that step, and kept


def test_a_single_slow_step_costs_a_few_steps_of_one_thread():
    choice = ThreadChoice(2)
    _run(choice, {1: 0.010, 2: 0.006}, 6)
    choice.record(choice.next(), 0.030, 256)  # a blip
    used = _run(choice, {1: 0.010, 2: 0.006}, 30)
    assert used[:3] == [1, 1, 1] and 2 in used[3:] and choice.chosen == 2 and used[-1] == 2


def test_it_recovers_more_threads_when_the_machine_is_quiet_again():
    choice = ThreadChoice(2)
    _run(choice, {1: 0.010, 2: 0.100}, 4)
    assert choice.chosen == 1
    used = _run(choice, {1: 0.010, 2: 0.006}, 400)  # quiet again: the next try (after 20 x 0.1 s) wins
    first = used.index(2)
    assert first == 200 and used[first : first + 3] == [2, 2, 2] and choice.chosen == 2 and used[-1] == 2


def test_a_try_of_one_thread_on_a_quiet_machine_ends_at_its_first_slower_step():
    choice = ThreadChoice(2)
    used = _run(choice, {1: 2**-7, 2: 2**-8}, 6 + 50)
    tries = [i for i, t in enumerate(used) if i >= 6 and t == 1]
    assert tries == [6 + 40]  # after 20x 7.8 ms on two threads' steps (3.9 ms: 40 of them), one step of one thread


def test_steps_are_timed_per_sample():
    choice = ThreadChoice(2)
    for threads, seconds, items in [(1, 0.010, 100), (1, 0.010, 100), (1, 0.001, 10), (2, 0.012, 200)]:
        assert choice.next() == threads
        choice.record(threads, seconds, items)
    assert choice.trying == 2  # 60 us a sample against one thread's 100 us: the try goes on


def test_one_core_leaves_nothing_to_choose():
    choice = ThreadChoice(1)
    assert _run(choice, {1: 0.01}, 5) == [1] * 5


def _cpu_loader(n: int = 64, transform=None):
    import torch

    from gpufeed import DeviceLoader

    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return DeviceLoader(images, torch.arange(n), 8, transform=transform, device="cpu", chunk_batches=1, seed=1)


def test_the_count_is_set_for_gpufeed_s_ops_and_the_user_s_setting_is_back_for_theirs(monkeypatch):
    import torch

    from gpufeed import threads as module

    monkeypatch.setattr(module, "usable_cores", lambda: 2)
    seen: list[int] = []
    loader = _cpu_loader(transform=lambda x, generator: seen.append(torch.get_num_threads()) or x)
    monkeypatch.setenv("GPUFEED_THREADS", "auto")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen.clear()
        outside = [torch.get_num_threads() for _ in loader]
        assert outside == [2] * 8 and torch.get_num_threads() == 2  # the loop body runs with the user's setting
        assert seen[:3] == [1, 1, 1] and set(seen) <= {1, 2}  # gpufeed's ops: one thread first
        monkeypatch.setenv("GPUFEED_THREADS", "torch")
        seen.clear()
        list(loader)
        assert seen == [2] * 8
        monkeypatch.setenv("GPUFEED_THREADS", "3")
        seen.clear()
        list(loader)
        assert seen == [3] * 8 and torch.get_num_threads() == 2
        monkeypatch.setenv("GPUFEED_THREADS", "some")
        with pytest.raises(ConfigError, match="GPUFEED_THREADS='some' must be 'auto'"):
            list(loader)
    finally:
        torch.set_num_threads(before)


def test_a_quota_of_one_core_runs_gpufeed_s_ops_on_one_thread_whatever_torch_s_setting(monkeypatch):
    import torch

    from gpufeed import threads as module

    monkeypatch.setattr(module, "usable_cores", lambda: 1)
    monkeypatch.delenv("GPUFEED_THREADS", raising=False)
    seen: list[int] = []
    loader = _cpu_loader(transform=lambda x, generator: seen.append(torch.get_num_threads()) or x)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen.clear()  # the loader's own run of its transform at construction
        list(loader)
        assert seen == [1] * 8 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_chunk_of_one_sample_runs_at_the_most_threads_untimed(monkeypatch):
    import torch

    from gpufeed import threads as module

    monkeypatch.setattr(module, "usable_cores", lambda: 2)
    monkeypatch.delenv("GPUFEED_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        made: list[int] = []
        choice = ThreadChoice(2)
        for _ in choice.steps((made.append(torch.get_num_threads()) for _ in range(3)), iter([5, 1, 5])):
            pass
        assert made == [1, 2, 1] and len(choice.times[1]) == 2 and not choice.times[2]
    finally:
        torch.set_num_threads(before)


def test_the_batches_do_not_depend_on_the_thread_count(monkeypatch):
    import torch

    from gpufeed import augment as A

    monkeypatch.setenv("GPUFEED_COMPILE", "0")  # the eager ops: no compiler in this test
    aug = A.Compose(
        [
            A.RandomResizedCrop(12),
            A.ColorJitter(0.4, 0.4, 0.4, 0.1),
            A.RandomHorizontalFlip(),
            A.Normalize((0.5,) * 3, (0.2,) * 3),
        ]
    )
    loader = _cpu_loader(n=65, transform=aug)  # a last chunk of one sample
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        epochs = {}
        for setting in ("1", "2", "auto"):
            monkeypatch.setenv("GPUFEED_THREADS", setting)
            loader.set_epoch(0)
            epochs[setting] = torch.cat([x for x, _ in loader])
        assert torch.equal(epochs["1"], epochs["2"]) and torch.equal(epochs["1"], epochs["auto"])
    finally:
        torch.set_num_threads(before)


def test_the_batches_of_ops_whose_work_torch_splits_between_threads_do_not_depend_on_the_count(monkeypatch):
    # sizes at which torch parallelises: a sample's gray over 32,768 pixels (torch's grain), batches of 4 whose
    # ColorJitter slots hold one sample as often as not (a reduction with one output: split within the sample), and a
    # float batch (ToTensor first), whose mean gray is no sum of integers
    import torch

    from gpufeed import augment as A

    images = torch.randint(0, 256, (16, 3, 184, 184), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    aug = A.Compose([A.ConvertDtype(torch.float32), A.ColorJitter(0.4, 0.4, 0.4, 0.1)])
    from gpufeed import DeviceLoader

    loader = DeviceLoader(images, torch.arange(16), 4, transform=aug, device="cpu", seed=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        epochs = {}
        for setting in ("1", "2"):
            monkeypatch.setenv("GPUFEED_THREADS", setting)
            loader.set_epoch(0)
            epochs[setting] = torch.cat([x for x, _ in loader])
        assert torch.equal(epochs["1"], epochs["2"])
    finally:
        torch.set_num_threads(before)


def test_a_batch_s_mix_runs_with_the_count_chosen_for_the_loader_s_ops(monkeypatch):
    import torch

    from gpufeed import augment as A

    loader = _cpu_loader()
    loader = type(loader)(loader.store.images, torch.arange(64), 8, device="cpu", mix=A.MixUp(0.2, 64), seed=1)
    seen: list[int] = []
    mix = loader.mix
    loader.mix = lambda x, y, rng: (seen.append(torch.get_num_threads()), mix(x, y, rng))[1]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setenv("GPUFEED_THREADS", "1")
        outside = [torch.get_num_threads() for _ in loader]
        assert seen == [1] * 8 and outside == [2] * 8
    finally:
        torch.set_num_threads(before)


def test_a_cpu_loader_compiles_its_fused_ops_for_each_count_when_built_never_mid_epoch(monkeypatch):
    # dynamo specialises a compiled function on torch's thread count (a guard on it): a loader built at the user's
    # count recompiled at its first chunk on one thread (19 s for ColorJitter on the 2-core machine, the first batch
    # waiting), and again at its first try of the other count where that is not the user's
    import torch
    from torch._dynamo.utils import counters

    from gpufeed import DeviceLoader
    from gpufeed import augment as A
    from gpufeed import threads as module
    from gpufeed.augment import fusion

    monkeypatch.setenv("GPUFEED_COMPILE", "1")  # the rest of the suite runs the eager ops (tests/conftest.py)
    monkeypatch.setattr(fusion, "_FAILED", set())
    monkeypatch.setattr(module, "usable_cores", lambda: 2)
    monkeypatch.delenv("GPUFEED_THREADS", raising=False)
    images = torch.randint(0, 256, (48, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # above the usable cores: the choice's counts are 1 and 2, neither the user's
        loader = DeviceLoader(images, torch.arange(48), 8, transform=A.RandomResizedCrop(16), device="cpu",
                              chunk_batches=1, seed=1)  # fmt: skip
        graphs = counters["stats"]["unique_graphs"]
        used: list[int] = []
        counted = module.torch_threads
        monkeypatch.setattr(module, "torch_threads", lambda threads: used.append(threads) or counted(threads))
        list(loader)
        assert {1, 2} <= set(used)  # one thread's probes, then a try of two
        assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled mid-epoch
    finally:
        torch.set_num_threads(before)
