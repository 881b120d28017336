"""What the hook keeps inside a watched process: one :class:`Watched` per loader and the process's :class:`State`,
which writes itself as a :class:`~gpufeed.watch.record.ProcessRecord`."""

from __future__ import annotations

import ast
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .clock import DeviceClock
from .record import LoaderRecord, ProcessRecord
from .sampler import Sampler, usable_cores

__all__ = ["State", "Watched"]


@dataclass
class Watched:
    """One loader: its record, a weak reference to it (for the side measurement) and its CUDA clock."""

    record: LoaderRecord
    loader: Any  # weakref.ref to the DataLoader
    # what the side measurement reads of a DataLoader (its dataset and settings), kept after the script dropped it
    # (a loader local to main() is gone at exit); not the loader itself, whose persistent workers would live on
    settings: Any = None
    clock: DeviceClock = field(default_factory=DeviceClock)
    trained: int = 0  # batches asked for with autograd on (record.training_batches, counted as they come)


class State:
    """The process's measurement; one instance, made by install()."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pid = os.getpid()
        self.started = time.time()
        self.origin = time.perf_counter()
        self.steps = int(os.environ.get("GPUFEED_WATCH_STEPS", "0") or 0)
        self.side = os.environ.get("GPUFEED_WATCH_SIDE", "0") == "1"
        self.side_seconds = float(os.environ.get("GPUFEED_WATCH_SIDE_SECONDS", "20") or 20)
        # the first process of the watched command; the processes it starts (torchrun's ranks) write a record only
        # when they built a loader, so multiprocessing's helpers and spawned workers write none
        self.root = "GPUFEED_WATCH_ROOT" not in os.environ
        os.environ.setdefault("GPUFEED_WATCH_ROOT", str(self.pid))
        self.watched: list[Watched] = []
        self.notes: list[str] = []
        self.exit: str | None = None
        self.side_result: dict[str, Any] | None = None
        self.side_done = False  # the side measurement at the end was made (or found nothing to do)
        self.paused = False  # True during the side measurement: its loaders are not the script's
        self.cuda = False  # True once the script has initialised CUDA
        self.first_batch = False  # True once a loader of this process served a batch
        self.gpu_index = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self.sampler: Sampler | None = None
        self.torch: Any = None
        self.sources: dict[str, ast.AST | None] = {}
        self.fix_s: dict[str, float] = {}  # what gf.accelerate cost this script once (hook._patch_accelerate)
        # a batch's four entries go in together: another thread's iterator (a prefetching thread, a second loader
        # iterated in a thread) must not interleave its own between them
        self.lock = threading.Lock()

    def note(self, what: str, e: BaseException) -> None:
        if len(self.notes) < 50:
            self.notes.append(f"{what}: {type(e).__name__}: {e}")

    def start_sampler(self) -> None:
        if self.sampler is None:
            self.sampler = Sampler(self.pid, origin=self.origin, gpu_index=lambda: self.gpu_index)
            self.sampler.start()

    def record(self) -> ProcessRecord:
        """This process's record: each loader with its device times, the CPU and GPU samples, how it ended."""
        loaders = []
        for watched in self.watched:
            rec = watched.record
            # NOTE: a signal handler runs this in the main thread, possibly while that thread holds the lock in
            # _batch: waiting on it would hang the script for good; a record without device times is written instead
            if not self.lock.acquire(timeout=0.5):
                self.notes.append(
                    "the CUDA events were not read: a batch was being recorded when the record was written"
                )
                loaders.append(rec)
                continue
            try:
                rec.device_step_s = watched.clock.steps(len(rec.waits))
            except Exception as e:  # noqa: BLE001
                self.note("the CUDA events", e)
            finally:
                self.lock.release()
            loaders.append(rec)
        device = "cpu"
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                device = f"cuda:{torch.cuda.current_device()}"
        except Exception as e:  # noqa: BLE001
            self.note("the device", e)
        sampler = self.sampler
        return ProcessRecord(
            rank=int(os.environ.get("RANK", "0") or 0),
            world_size=int(os.environ.get("WORLD_SIZE", "1") or 1),
            pid=self.pid,
            argv=list(sys.argv),
            device=device,
            started=self.started,
            ended=time.time(),
            exit=self.exit or "finished",
            loaders=loaders,
            cpu=list(sampler.cpu) if sampler else [],
            cores=usable_cores(),
            gpu=list(sampler.gpu) if sampler else [],
            side=self.side_result,
            notes=self.notes + (list(sampler.notes) if sampler else []),
            machine=list(sampler.machine) if sampler else [],
            fix_s=dict(self.fix_s),
        )
