"""What a watched script should change, as ``gf.diagnose``'s findings: each with its fix and its measured gain.

The gains come from the side measurement (:mod:`gpufeed.watch.side`), made in the script's own process on its own
data and device: ``gf.accelerate``'s images per second beside the script's ``DataLoader`` settings', or, when
accelerate refuses the pipeline, ``tune_dataloader``'s settings and theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..findings import Finding

if TYPE_CHECKING:
    from .analyse import LoaderSummary

__all__ = ["fixes"]


def fixes(
    verdict: str,
    fraction: float,
    main: LoaderSummary,
    cpu: dict[str, float] | None,
    side: dict[str, Any] | None,
    has_change: bool,
    cores: int,
) -> list[Finding]:
    """The findings for the main loader of a script with this ``verdict`` and wait ``fraction``.

    Example:
        >>> from gpufeed.watch.analyse import LoaderSummary
        >>> main = LoaderSummary(0, "DataLoader", "t.py:3", None, "CIFAR10", None, 64, 0, False, False, None,
        ...                      "RandomSampler", False, batches=10, epochs=1, wait_fraction=0.6, img_s=100.0)
        >>> [f.kind for f in fixes("data-bound", 0.6, main, None, None, False, cores=2)]
        ['data-bound']
    """
    out = []
    if verdict == "data-bound":
        out.append(_data_bound(fraction, main, side, has_change))
    elif cpu is not None and cpu["saturated"]:
        used = (cpu["main_percent"] + cpu["workers_percent"]) / 100
        out.append(
            Finding(
                "cpu-saturated",
                f"while the steps ran the main process used {cpu['main_percent']:.0f}% and the loader's workers "
                f"{cpu['workers_percent']:.0f}% of one core: {used:.1f} of the {cores} usable cores; the workers may "
                "slow the training step itself (not measured: see the note on CPU contention)",
                "take the per-sample work off the CPU (gf.accelerate(dataset, ...)), or give the loader fewer "
                "workers: gpufeed.tune_dataloader(dataset, batch_size, step_s=...)",
                "unknown: the step was not timed with the loader idle",
            )
        )
    if main.num_workers > cores:
        out.append(
            Finding(
                "too-many-workers",
                f"num_workers={main.num_workers} exceeds the {cores} usable cores: workers compete with each other "
                "and with the training loop",
                f"num_workers <= {cores}; measure with gpufeed.tune_dataloader(dataset, batch_size)",
                "less contention; memory per worker saved",
            )
        )
    return out


def _data_bound(fraction: float, main: LoaderSummary, side: dict[str, Any] | None, has_change: bool) -> Finding:
    waiting = f"the loop waits for {main.name}'s batches {fraction:.0%} of the time"
    if side is None or "error" in side:
        why = "not made (--no-side, or the script did not end normally)" if side is None else f"failed: {side['error']}"
        return Finding(
            "data-bound",
            waiting,
            "gf.accelerate(dataset, batch_size=..., shuffle=...) where it accepts the pipeline, else "
            "DataLoader(dataset, **gpufeed.tune_dataloader(dataset, batch_size).kwargs)",
            f"not measured: the side measurement was {why}",
        )
    where = f"{side.get('samples')} samples on {side.get('device')}"
    script = side.get("script_loader", {}).get("img_s")
    if "accelerate" in side:
        fast = side["accelerate"]["img_s"]
        return Finding(
            "accelerate",
            f"{waiting}; gf.accelerate takes its dataset and transform (its plan below)",
            "the code change below"
            if has_change
            else "loader = gf.accelerate(dataset, batch_size=..., shuffle=...) "
            "(the call cannot be rewritten as it is: see below)",
            f"{fast:.0f} img/s with gf.accelerate against {_rate(script)} with the script's DataLoader settings "
            f"({_times(fast, script)}), measured on {where}",
        )
    refused, tuned = side.get("refused", {}), side.get("tuned") or {}
    kwargs = ", ".join(f"{k}={v!r}" for k, v in tuned.get("kwargs", {}).items())
    return Finding(
        "tuned-dataloader",
        f"{waiting}; gf.accelerate cannot run this pipeline batched ({refused.get('error')}: {refused.get('reason')})",
        f"DataLoader(dataset, batch_size={main.batch_size}, {kwargs})" if kwargs else "no better settings were found",
        f"{_rate(tuned.get('img_s'))} with the tuned settings against {_rate(script)} with the script's "
        f"({_times(tuned.get('img_s'), script)}), measured on {where}",
    )


def _rate(img_s: float | None) -> str:
    return "-" if img_s is None else f"{img_s:.0f} img/s"


def _times(new: float | None, old: float | None) -> str:
    return "-" if not new or not old else f"{new / old:.1f}x"
