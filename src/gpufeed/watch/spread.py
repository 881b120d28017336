"""The interleaved runs of ``gpufeed diagnose --verify`` as numbers: the order of the original (A) and changed (B)
runs, each side's spread, the gain with its range, whether the prediction agrees, and the runs the machine was busy
in. Pure functions of measured times: :mod:`.verify` runs, :mod:`.verify_text` writes.

NOTE [ interleaving ]: a shared machine's speed drifts while the runs go on (another job starts, the page cache
warms, a turbo budget runs out). All the original runs and then all the changed ones would put that drift into the
gain: one before/after pair measured 1.18x, 1.04x and 1.39x on the same configuration. Pairs alternate their order
(A B, B A, A B, ...): over A B B A a drift linear in time adds as much to one side as to the other, and each pair
gives one gain measured close together in time, so the gain's range says how much the machine moved.

NOTE [ agreeing ]: the prediction is a time per step (the rest of the step plus the fix's own time per batch), so it
is judged as one: it agrees when it lies within the changed runs' range of times per step, widened by the
tolerance. The tolerance is the relative spread of either side's runs (the prediction was made on an original run,
so it carries the original's spread too), at least :data:`AGREE_FLOOR`; with one pair the spread is unknown and the
tolerance is :data:`AGREE_ONE_PAIR`. A range so wide that it holds the original's own time per step as well cannot
tell the fix from no fix: that is "inconclusive", not "agrees". (A ratio of ratios hid this: a verified 1.04x
"agreed" with a predicted 1.37x once the rest of the step was taken out of both.)

Example:
    >>> order(6)
    ['original', 'changed', 'changed', 'original', 'original', 'changed']
    >>> a, b = Spread((0.0100, 0.0102)), Spread((0.0096, 0.0097))
    >>> judge(0.0100 / 1.37, a, b).verdict   # 1.37x predicted, 1.04x measured, a tight spread
    'disagrees'
    >>> judge(0.0095, a, b).verdict
    'agrees'
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AGREE_FLOOR",
    "AGREE_ONE_PAIR",
    "BUSY_SHARE",
    "CHANGED",
    "ORIGINAL",
    "VERIFY_RUNS",
    "VERIFY_S",
    "Agreement",
    "Spread",
    "busy_runs",
    "judge",
    "order",
    "pair_fits",
    "pair_gains",
]

ORIGINAL, CHANGED = "original", "changed"
VERIFY_RUNS = 6  # A B B A A B: three pairs, the drift cancelled over the first four (--verify-runs)
VERIFY_S = 600.0  # the verification's budget: pairs after the first while they fit (--verify-seconds)
AGREE_FLOOR = 0.10  # the least tolerance: runs on a quiet machine still differ by a few percent
AGREE_ONE_PAIR = 0.25  # one pair: the spread is unknown
BUSY_SHARE = 0.25  # other processes using this share of the machine's cores during a run: the machine was busy


def order(runs: int) -> list[str]:
    """The sides of ``runs`` runs interleaved as A B B A A B B A ...: pair ``k`` is A B for even ``k``, B A for
    odd (see NOTE [ interleaving ]); an odd count ends with the next pair's first run.

    Example:
        >>> order(4)
        ['original', 'changed', 'changed', 'original']
    """
    sides = []
    for k in range((runs + 1) // 2):
        sides += [ORIGINAL, CHANGED] if k % 2 == 0 else [CHANGED, ORIGINAL]
    return sides[:runs]


def pair_fits(elapsed_s: float, durations: Sequence[tuple[str, float]], budget_s: float | None) -> bool:
    """Whether one more pair fits in the budget: ``elapsed_s`` plus the latest run of each side (``(side,
    seconds)`` in the order run) is at most ``budget_s``; without a budget, or before a run of each side has set
    the estimate, it fits.

    Example:
        >>> pair_fits(50.0, [("original", 20.0), ("changed", 25.0)], 100.0), pair_fits(60.0, [("original", 20.0),
        ...     ("changed", 25.0)], 100.0)
        (True, False)
    """
    if budget_s is None:
        return True
    last = {side: seconds for side, seconds in durations}
    if ORIGINAL not in last or CHANGED not in last:
        return True
    return elapsed_s + last[ORIGINAL] + last[CHANGED] <= budget_s


@dataclass(frozen=True)
class Spread:
    """The times per step of one side's runs: their median and range (``low``, ``high``)."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def known(self) -> bool:
        """Two runs or more: a spread was measured."""
        return self.n >= 2

    @property
    def relative(self) -> float:
        """``(high - low) / median``: 0 for one run.

        Example:
            >>> round(Spread((0.9, 1.0, 1.2)).relative, 3)
            0.3
        """
        return (self.high - self.low) / self.median if self.n >= 2 and self.median > 0 else 0.0


def pair_gains(runs: Sequence[tuple[str, float | None]]) -> list[float]:
    """The gain of each pair of consecutive runs (runs ``2k`` and ``2k + 1``, ``(side, time per step)``): the
    original's time over the changed one's. A pair with a run that measured no step, or not one of each side, gives
    none.

    Example:
        >>> pair_gains([("original", 0.02), ("changed", 0.01), ("changed", 0.015), ("original", 0.03)])
        [2.0, 2.0]
    """
    gains = []
    for k in range(0, len(runs) - 1, 2):
        pair = dict(runs[k : k + 2])
        a, b = pair.get(ORIGINAL), pair.get(CHANGED)
        if a is not None and b is not None and b > 0:
            gains.append(a / b)
    return gains


@dataclass(frozen=True)
class Agreement:
    """Whether the predicted time per step agrees with the changed runs (see NOTE [ agreeing ])."""

    verdict: str  # "agrees" | "disagrees" | "inconclusive"
    predicted_s: float
    tolerance: float  # relative: the runs' spread, at least AGREE_FLOOR (AGREE_ONE_PAIR with one pair)
    low_s: float  # the range of times per step that agrees: the changed runs' range widened by the tolerance
    high_s: float
    spread_known: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "predicted_s": self.predicted_s,
            "tolerance": self.tolerance,
            "low_s": self.low_s,
            "high_s": self.high_s,
            "spread_known": self.spread_known,
        }


def judge(predicted_s: float, original: Spread, changed: Spread) -> Agreement:
    """Whether the predicted time per step ``predicted_s`` agrees with the changed runs' times per step, the
    original runs' giving the spread and what no fix at all would measure (see NOTE [ agreeing ]).

    Example:
        >>> a, b = Spread((0.010, 0.013)), Spread((0.0075, 0.0105))   # a wide spread: 30% and 33%
        >>> judge(0.008, a, b).verdict, round(judge(0.008, a, b).tolerance, 2)
        ('inconclusive', 0.33)
    """
    known = original.known and changed.known
    tolerance = max(AGREE_FLOOR, original.relative, changed.relative) if known else AGREE_ONE_PAIR
    low, high = changed.low * (1 - tolerance), changed.high * (1 + tolerance)
    if not low <= predicted_s <= high:
        verdict = "disagrees"
    elif low <= original.median <= high and abs(original.median / predicted_s - 1) > tolerance:
        verdict = "inconclusive"  # the range holds no change too, and the prediction was a change
    else:
        verdict = "agrees"
    return Agreement(verdict, predicted_s, tolerance, low, high, known)


def busy_runs(machines: Sequence[dict[str, float] | None], share: float = BUSY_SHARE) -> list[int]:
    """The 1-based numbers of the runs in which other processes used at least ``share`` of the machine's cores
    (``machines[i]["others"]``, a fraction of all cores, from :func:`gpufeed.watch.analyse.report`'s ``machine``;
    None where it was not sampled).

    Example:
        >>> busy_runs([{"others": 0.05}, {"others": 0.45}, None, {"others": 0.3}])
        [2, 4]
    """
    return [i for i, m in enumerate(machines, 1) if m is not None and m.get("others", 0.0) >= share]
