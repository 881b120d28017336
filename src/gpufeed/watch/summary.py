"""What ``gpufeed diagnose -- CMD`` found, as data: the loaders, the processes, the report's fields.

The modules that turn it into findings (:mod:`.fixes`), text (:mod:`.text`) and the report itself (:mod:`.analyse`)
all read these records; this module imports none of them, so the flow stays one way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..diagnose import Report

__all__ = ["NO_LOADER", "TOO_FEW", "LoaderSummary", "RankSummary", "ReportData"]

NO_LOADER = "no loader found"
TOO_FEW = "too few batches"


@dataclass
class LoaderSummary:
    """One loader of the script, as found, with what it served (summed over ranks)."""

    id: int
    cls: str
    built_at: str | None
    source: str | None
    dataset: str
    transform: str | None
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    sampler: str
    drop_last: bool
    batches: int
    epochs: int
    wait_fraction: float | None  # over the batches after the first (None: fewer than 3 batches)
    img_s: float | None  # samples per second through the loop, summed over ranks
    main: bool = False
    init_of: str = "torch.utils.data.dataloader.DataLoader"  # whose __init__ took the arguments (LoaderRecord's)
    shuffle: bool | None = None  # what the run passed (LoaderRecord's): the order, a batch sampler, a collate
    batch_sampler: str | None = "?"
    collate_fn: str | None = "?"
    built_by: str | None = None  # the library call that built it (LoaderRecord's)
    file: str | None = None
    first_batch_s: float | None = None  # from the process's start (the hook's install) to the first batch served
    hf: dict[str, Any] | None = None  # a Hugging Face dataset's findings (LoaderRecord's)
    unpacked: list[dict[str, Any]] | None = None  # what the call's *args / **kwargs held (LoaderRecord's)

    @property
    def name(self) -> str:
        """Where it was built (``train.py:42``), else its class and creation order."""
        return self.built_at or f"{self.cls} #{self.id}"


@dataclass
class RankSummary:
    """One process of the script: how it ended and how long its main loader made it wait."""

    rank: int
    pid: int
    exit: str
    batches: int
    wait_s: float | None  # waiting in next() over the measured batches (None: too few)
    wall_s: float | None
    wait_fraction: float | None
    first_wait_s: float | None  # the first batch's wait: worker start-up included


@dataclass
class ReportData:
    """What ``gpufeed diagnose -- CMD`` found, as data (:class:`~gpufeed.watch.analyse.WatchReport` adds its text
    and files)."""

    verdict: str  # data-bound | launch-bound | compute-bound | NO_LOADER | TOO_FEW
    data_wait_fraction: float | None
    exit: str  # how the script ended: the worst of its processes' ends
    command: list[str]
    world_size: int
    device: str
    loaders: list[LoaderSummary] = field(default_factory=list)  # the main one first
    ranks: list[RankSummary] = field(default_factory=list)  # the processes that built the main loader
    slowest_rank: int | None = None  # under torchrun: the rank that waited most (its figures give the verdict)
    diagnosis: Report | None = None  # the main loader's measured steps, as gf.diagnose reports a loop
    cpu: dict[str, float] | None = None  # main %, workers %, cores, saturated (1.0/0.0), over the measured steps
    side: dict[str, Any] | None = None  # gpufeed.watch.side's measurement
    code_change: str | None = None  # gpufeed.watch.advice's diff
    no_change_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    # the change as applied to a file: file, line, old, new, imports, notes (gpufeed.watch.advice.Change)
    change: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None  # gpufeed.watch.predict.Prediction, for the main loader's loop
    machine: dict[str, float] | None = None  # the whole machine's CPU use while the steps ran (every process)
    status: int | None = None  # the command's exit status
    step_s: float | None = None  # the main loader's measured steps: mean wall per step, and its wait
    wait_s: float | None = None
    verify: dict[str, Any] | None = None  # gpufeed.watch.verify's before and after

    @property
    def main(self) -> LoaderSummary | None:
        """The loader the verdict is about."""
        return next((s for s in self.loaders if s.main), None)

    def to_dict(self) -> dict[str, Any]:
        """Everything in the report, JSON-ready."""
        return asdict(self)
