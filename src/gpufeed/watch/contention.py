"""The loader's workers competing with the training step for the cores, and what the step may gain without them.

A ``DataLoader``'s workers are processes: on a CPU-only or small machine, ``num_workers`` workers and the main
process are more than the cores when ``num_workers + 1 > cores``, and while the cores are saturated the step gets
only what the workers leave it. The wait for data can then be small (the verdict compute-bound) while the change
to ``gf.accelerate`` (no worker processes) still speeds the loop up: a verified 1.63x beside "the step itself is the
cost" on two cores with two workers. This predicts it from the CPU shares sampled while the steps ran: without the
workers the step can use what the main process used plus what they took, up to what it can use at all (every
usable core on the CPU, where torch's intra-op threads spread the step; the one thread that launches kernels on a
GPU), so its rest of the step shrinks at most by ``main cores / those cores``. An upper figure: the step may not
spread over every core, and nothing here measured it.

Example:
    >>> c = contention({"main_percent": 110.0, "workers_percent": 90.0, "cores": 2.0, "saturated": 1.0}, 2, "cpu")
    >>> round(c.rest_factor, 2), c.workers, c.cores
    (0.55, 2, 2.0)
    >>> contention({"main_percent": 110.0, "workers_percent": 90.0, "cores": 8.0, "saturated": 0.0}, 2, "cpu") is None
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["MIN_STEP_CORES", "MIN_WORKER_CORES", "SMALL_MACHINE", "Contention", "contention"]

MIN_WORKER_CORES = 0.25  # workers that used less than this while the steps ran took nothing worth predicting
MIN_STEP_CORES = 0.5  # a main process using less than this is not CPU-bound: it waits for something else
SMALL_MACHINE = 4  # on a GPU, workers compete with the launching thread only on a machine this small
_NO_GAIN = 0.95  # a rest factor over this: the main process already had what it can use


@dataclass(frozen=True)
class Contention:
    """The workers took cores the step could use: the step's rest may take ``rest_factor`` of its time without
    them (an upper figure)."""

    workers: int  # num_workers
    cores: float  # usable cores
    workers_cores: float  # what the workers used while the steps ran
    main_cores: float  # what the main process (the step) used
    free_cores: float  # what the step could use without them
    rest_factor: float  # the rest of the step without the workers, over the rest with them (< 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def contention(cpu: dict[str, float] | None, num_workers: int, device: str) -> Contention | None:
    """Whether the loader's ``num_workers`` workers competed with the step for the cores (``cpu``: the report's CPU
    use while the steps ran, :func:`gpufeed.watch.analyse.report`'s), and how much of its time the rest of the step
    may take without them; None where they did not (fewer workers than cores, cores not saturated, idle workers,
    a step that is not CPU-bound, or a large machine with a GPU)."""
    if cpu is None or num_workers < 1:
        return None
    cores = cpu["cores"]
    workers, main = cpu["workers_percent"] / 100, cpu["main_percent"] / 100
    on_cpu = not device.startswith("cuda")
    if num_workers + 1 <= cores or not cpu["saturated"] or workers < MIN_WORKER_CORES or main < MIN_STEP_CORES:
        return None
    if not on_cpu and cores > SMALL_MACHINE:
        return None
    free = cores if on_cpu else 1.0  # torch spreads a CPU step over the cores; a GPU's host side is one thread
    factor = min(1.0, main / free) if free > 0 else 1.0
    if factor > _NO_GAIN:
        return None
    return Contention(num_workers, cores, workers, main, free, factor)
