"""What one process of a watched script measured: the records `gpufeed diagnose -- CMD` reads back.

Each process of the script (each rank under torchrun) writes one ``record-<rank>-<pid>.json`` in the directory named
by ``GPUFEED_WATCH_DIR``. The loader's worker processes write nothing.

Example:
    >>> rec = ProcessRecord(rank=0, world_size=1, pid=1, argv=["train.py"], device="cpu", started=0.0, ended=1.0,
    ...                     exit="finished", loaders=[], cpu=[(0.1, 95.0, 0.0)], cores=4, gpu=[])
    >>> ProcessRecord.from_json(rec.to_json()) == rec
    True
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FIRST_BATCH", "LoaderRecord", "ProcessRecord", "Timeline", "read_records", "record_name"]

FIRST_BATCH = "first-batch"  # an empty file the first process to ask a loader for a batch creates: --time starts


@dataclass
class LoaderRecord:
    """One ``DataLoader`` the script built, its configuration as found and one entry per batch it served.

    The lists are in the order the batches came back; :meth:`timeline` puts them in the order they were asked for
    and gives the step (compute) time between them: ``requested[k+1] - (requested[k] + waits[k])`` for one
    iterator at a time.
    """

    id: int  # order of creation in the process
    cls: str  # the DataLoader's class name (DataLoader, DataLoaderShard, ...)
    built_at: str | None  # "path/to/train.py:42": the first frame outside torch, lightning, accelerate, gpufeed
    source: str | None  # the source text of that call (the whole Call node), when the file is readable
    dataset: str  # e.g. "CIFAR10", "Subset of ImageFolder"
    transform: str | None  # repr of the dataset's transform on one line (through Subset), None if none
    batch_size: int | None
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    sampler: str  # class name (RandomSampler, SequentialSampler, DistributedSampler, ...)
    drop_last: bool
    epochs: int = 0  # iterations started
    requested: list[float] = field(default_factory=list)  # per batch: when next() was called, s since the start
    waits: list[float] = field(default_factory=list)  # per batch: host seconds inside next()
    samples: list[int] = field(default_factory=list)  # per batch: first dim of the first tensor found; 0 if none
    device_step_s: list[float] | None = None  # per batch on a GPU: CUDA event time between consecutive batches
    # per batch: whether autograd was on when it was asked for (a training loop; an evaluation loop runs under
    # no_grad / inference_mode, Lightning's validation included)
    grad: list[bool] = field(default_factory=list)
    # the class whose __init__ took the call's arguments, "module.QualName": DataLoader's (StatefulDataLoader's are
    # the same), or a subclass's own, whose arguments the code change cannot map to gf.accelerate's
    init_of: str = "torch.utils.data.dataloader.DataLoader"
    # what the run itself passed, whatever the source text says (``sampler=train_sampler`` that was None): whether
    # the order shuffled, a batch sampler's class (None: DataLoader batched by batch_size itself) and a collate
    # function's name (None: torch's default_collate); "?" (and shuffle None): not known, the text decides
    shuffle: bool | None = None
    batch_sampler: str | None = "?"
    collate_fn: str | None = "?"
    # the library function that called the loader's class ("timm.data.loader.create_loader"), None when the
    # script called it itself; and the absolute path of the file of built_at
    built_by: str | None = None
    file: str | None = None
    # a loader over a Hugging Face datasets.Dataset: what gpufeed.watch.hf.HFFound says of it (its set_transform
    # function, the recipe that function applies and its name where the loader is built, the first batch's layout)
    hf: dict[str, Any] | None = None
    # what the call's *args / **kwargs held when it ran (gpufeed.watch.unpacked): one entry per starred argument
    unpacked: list[dict[str, Any]] | None = None

    @property
    def batches(self) -> int:
        """How many batches this loader served."""
        return len(self.waits)

    @property
    def training_batches(self) -> int:
        """How many of them were asked for with autograd on (records without ``grad``: all of them)."""
        return sum(self.grad) if len(self.grad) == len(self.waits) else len(self.waits)

    def timeline(self) -> Timeline:
        """The batches in the order they were asked for, each wait counted once in time.

        One iterator at a time asks for a batch only after the last came back: the waits are the waits, the steps
        the gaps between them. Two iterators at once (one in a thread, or two epochs interleaved) can wait at the
        same time: a wait counts only for its time not already spent waiting for an earlier request, and a step
        is the time from the last return so far to the next request, 0 while a request was pending. The waits
        then sum to the time the script spent with a batch asked for and not yet served, never over the wall.
        """
        order = sorted(range(len(self.waits)), key=self.requested.__getitem__)
        requested: list[float] = []
        waits: list[float] = []
        steps: list[float] = []
        samples: list[int] = []
        served = -math.inf  # when the latest return so far happened
        for k in order:
            start, end = self.requested[k], self.requested[k] + self.waits[k]
            if requested:
                steps.append(max(0.0, start - served))
            requested.append(start)
            waits.append(max(0.0, end - max(start, served)))
            samples.append(self.samples[k] if k < len(self.samples) else 0)
            served = max(served, end)
        return Timeline(requested, waits, steps, samples)

    def steps(self) -> list[float]:
        """The host time between a batch's return and the next request, per consecutive pair (see :meth:`timeline`)."""
        return self.timeline().steps


@dataclass
class Timeline:
    """A loader's batches in request order (:meth:`LoaderRecord.timeline`)."""

    requested: list[float]  # s since the start, ascending
    waits: list[float]  # the time each request added to the time spent waiting
    steps: list[float]  # one fewer: from the latest return to the next request, never negative
    samples: list[int]


@dataclass
class ProcessRecord:
    """One process of the watched script: its loaders, its CPU and GPU samples and how it ended."""

    rank: int
    world_size: int
    pid: int
    argv: list[str]
    device: str  # "cuda:0" when torch.cuda was initialised by the script, else "cpu"
    started: float  # time.time() at install
    ended: float
    exit: str  # "finished" | "stopped" | "interrupted" | "crashed: <Type>: <message>"
    loaders: list[LoaderRecord]
    cpu: list[tuple[float, float, float]]  # (t, main process %, its children's %), % of one core
    cores: int
    gpu: list[tuple[float, float, float]]  # (t, utilisation %, memory MiB); [] without NVML
    side: dict[str, Any] | None = None  # watch/side.py's result
    notes: list[str] = field(default_factory=list)
    # (t, the machine's CPU use in % of all its cores, every process counted; the 1-minute load average)
    machine: list[tuple[float, float, float]] = field(default_factory=list)
    # what gf.accelerate cost a script that calls it, once: "import_s" (importing it), "accelerate_s" (its calls)
    fix_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        """This record as JSON text."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        """The record written by :meth:`to_json`."""
        raw = json.loads(text)
        raw["loaders"] = [LoaderRecord(**loader) for loader in raw["loaders"]]
        raw["cpu"] = [tuple(s) for s in raw["cpu"]]
        raw["gpu"] = [tuple(s) for s in raw["gpu"]]
        raw["machine"] = [tuple(s) for s in raw.get("machine", [])]
        return cls(**raw)

    def save(self, directory: str | Path) -> Path:
        """Write this record as ``directory/record-<rank>-<pid>.json`` (through a temporary file, then renamed)."""
        path = Path(directory) / record_name(self.rank, self.pid)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)  # NOTE: a reader never sees half a record, even when the process is killed mid-write
        return path


def record_name(rank: int, pid: int) -> str:
    """The file name of a process's record."""
    return f"record-{rank}-{pid}.json"


def read_records(directory: str | Path) -> list[ProcessRecord]:
    """Every record in ``directory``, ordered by rank then pid; an unreadable file is skipped."""
    out = []
    for path in Path(directory).glob("record-*.json"):
        try:
            out.append(ProcessRecord.from_json(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return sorted(out, key=lambda r: (r.rank, r.pid))
