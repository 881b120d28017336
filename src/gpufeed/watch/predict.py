"""What the fix is worth to the training loop, predicted from what was measured: the loop's steps and the fix's
own time per batch, not the loader's rate alone.

The hook measured each step of the script's loop as a wait in ``next()`` and the rest (the training step). The side
measurement (:mod:`gpufeed.watch.side`) measured the fix on a part of the same data on the same device. The
prediction:

- ``gf.accelerate``: its batches are made when the loop asks for them (on a GPU, its kernels queue ahead of the
  step's), so a step becomes the rest of the step plus the fix's own time per batch: never faster than the rest
  alone, i.e. the speed-up is bounded by ``1 / (1 - wait fraction)``;
- a tuned ``DataLoader``: its workers load while the step runs, so the wait becomes what loading takes beyond
  the step (overlap assumed; the workers' competition with the step for the cores is not predicted).

Both assume the rest of the step unchanged. Where the script's workers competed with the step for the cores, the
rest may shrink too: the measured gain can then exceed the bound (the report says so). The one-time cost is what
the fix adds before the first batch: importing gpufeed (when the script did not) and reading the dataset in
(caching it), extrapolated linearly from the part measured to the whole dataset; it pays back after
``one_time / (step now - step with the fix)`` steps.

Example:
    >>> side = {"samples": 512, "dataset_samples": 5120, "batch_size": 64, "import_s": 1.0,
    ...         "accelerate": {"img_s": 6400.0, "build_s": 2.0, "memory_bytes": 10, "disk_bytes": 0,
    ...                        "files_bytes": None, "cache_root": "/c", "storage": "device"},
    ...         "script_loader": {"img_s": 640.0}}
    >>> p = predict(wait_s=0.09, rest_s=0.01, side=side, world_size=1)
    >>> round(p.new_step_s, 3), round(p.speedup, 2), round(p.bound, 1), round(p.one_time_s, 1), p.steps_per_epoch
    (0.02, 5.0, 10.0, 21.0, 80)
    >>> round(p.payback_steps, 1)
    262.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Prediction", "bound", "predict", "read_in", "tuned_better"]


@dataclass
class Prediction:
    """The loop with the fix, against the loop as measured; times are seconds per step (one batch)."""

    fix: str  # "accelerate" | "tuned": which fix the figures are for
    step_s: float  # now: the wait plus the rest
    wait_s: float
    rest_s: float
    new_wait_s: float  # with the fix: its own time per batch the loop still waits
    new_step_s: float
    speedup: float  # step_s / new_step_s
    bound: float  # step_s / rest_s: the most any data-side fix gives with the rest unchanged
    steps_per_epoch: int  # on one rank, at the script's batch size
    one_time_s: float | None = None  # importing gpufeed and reading the data in (caching it), whole dataset
    payback_steps: float | None = None  # steps after which the one-time cost is repaid (None: never)
    memory_bytes: int | None = None  # what the fix keeps, whole dataset (device / pinned / memory map)
    disk_bytes: int | None = None  # what a run writes into the cache (0: nothing)
    files_bytes: int | None = None  # the dataset's image files, for comparison
    cache_root: str | None = None
    storage: str | None = None
    device: str = "cpu"
    contended: float = 0.0  # the script's workers' CPU use while the steps ran, in cores (set by the report)
    # where the workers competed with the step for the cores (gpufeed.watch.contention): the step with the fix and
    # the workers' cores given back to the rest of the step, an upper figure (set by the report)
    free_step_s: float | None = None
    free_speedup: float | None = None
    scale: float = 1.0  # dataset samples / samples measured: the extrapolation

    @property
    def payback_epochs(self) -> float | None:
        return None if self.payback_steps is None else self.payback_steps / max(1, self.steps_per_epoch)


def bound(fraction: float) -> float:
    """The most a data-side fix can speed a loop that waits ``fraction`` of its time: ``1 / (1 - fraction)``.

    Example:
        >>> round(bound(0.13), 2), bound(0.0)
        (1.15, 1.0)
    """
    return math.inf if fraction >= 1 else 1 / (1 - max(0.0, fraction))


def predict(wait_s: float, rest_s: float, side: dict[str, Any] | None, world_size: int = 1) -> Prediction | None:
    """The loop's step with the fix the side measurement found (accelerate, else tuned settings better than the
    script's own); None when there is none to predict for. ``wait_s``/``rest_s``: the mean wait and rest of a
    measured step of the script's loop."""
    if side is None or "error" in side or not side.get("batch_size"):
        return None
    batch, step = side["batch_size"], wait_s + rest_s
    n, k = side.get("dataset_samples") or side.get("samples") or 0, side.get("samples") or 0
    scale = n / k if k else 1.0
    per_epoch = math.ceil(n / (batch * max(1, world_size))) if n else 0
    common: dict[str, Any] = {
        "step_s": step,
        "wait_s": wait_s,
        "rest_s": rest_s,
        "bound": step / rest_s if rest_s > 0 else math.inf,
    }
    fast = side.get("accelerate")
    if fast and fast.get("img_s"):
        new_wait = batch / fast["img_s"]
        new_step = rest_s + new_wait
        one_time = side.get("import_s", 0.0) + read_in(fast, n, scale)
        saved = step - new_step
        return Prediction(
            "accelerate", **common, new_wait_s=new_wait, new_step_s=new_step, speedup=step / new_step,
            steps_per_epoch=per_epoch, one_time_s=one_time, payback_steps=one_time / saved if saved > 0 else None,
            memory_bytes=_scaled(fast.get("memory_bytes"), scale), disk_bytes=_scaled(fast.get("disk_bytes"), scale),
            files_bytes=_scaled(fast.get("files_bytes"), scale), cache_root=fast.get("cache_root"),
            storage=fast.get("storage"), device=side.get("device", "cpu"), scale=scale,
        )  # fmt: skip
    tuned = side.get("tuned") or {}
    if tuned_better(side):
        load = batch / tuned["img_s"]
        new_wait = max(0.0, load - rest_s) if tuned.get("kwargs", {}).get("num_workers") else load
        new_step = rest_s + new_wait
        return Prediction(
            "tuned", **common, new_wait_s=new_wait, new_step_s=new_step, speedup=step / new_step,
            steps_per_epoch=per_epoch, one_time_s=0.0, payback_steps=0.0, scale=scale,
        )  # fmt: skip
    return None


def tuned_better(side: dict[str, Any] | None) -> bool:
    """Whether the side measurement found DataLoader settings better than the script's own (by :data:`BETTER`):
    the one test of "the tuned settings are the fix", which every part of the report reads.

    Example:
        >>> tuned_better({"tuned": {"img_s": 1520.0}, "script_loader": {"img_s": 1500.0}})
        False
    """
    tuned, own = (side or {}).get("tuned") or {}, ((side or {}).get("script_loader") or {}).get("img_s")
    return bool(tuned.get("img_s") and own and tuned["img_s"] > own * BETTER)


def read_in(fast: dict[str, Any], n: int, scale: float = 1.0) -> float:
    """Seconds for ``gf.accelerate`` to read ``n`` samples in, as a script's first call: the first read of the side
    measurement (2 samples: the warm-up and the fixed costs) plus ``n - 2`` samples at the cost per sample of the
    part over a quarter of it (see NOTE [ extrapolating the read-in ] in :mod:`gpufeed.watch.side`); without those
    reads (a part that is the whole dataset, or too small to split), the part's read times ``scale`` (n / the part).

    Example:
        >>> reads = {"first": (2, 0.6), "part": (384, 1.0), "quarter": (96, 0.4)}
        >>> round(read_in({"reads": reads, "build_s": 1.0}, 1024), 2)   # 0.6 s, then 1024 - 2 at 1/480 s
        2.73
        >>> read_in({"build_s": 1.0}, 100, scale=1.0)
        1.0
    """
    reads = fast.get("reads")
    if not reads:
        return fast["build_s"] * scale
    (k1, first_s), (k, part_s), (k0, quarter_s) = reads["first"], reads["part"], reads["quarter"]
    per_sample = max(0.0, part_s - quarter_s) / max(1, k - k0)
    return first_s + max(0, n - k1) * per_sample


BETTER = 1.05  # tuned settings must beat the script's own by this much, measured, to be offered as a fix


def _scaled(value: int | None, scale: float) -> int | None:
    return None if value is None else int(value * scale)
