"""The measurement inside each process of a watched script: every ``DataLoader`` it builds and every ``next()``.

``install()`` (called by ``watch/site/sitecustomize.py`` when ``GPUFEED_WATCH_DIR`` is set) imports no torch: it
waits for ``torch.utils.data.dataloader`` to be imported by the script, then patches three methods there:

- ``DataLoader.__init__``: the loader's configuration and the line of the script that built it (a new
  :class:`~gpufeed.watch.record.LoaderRecord`); subclasses (Accelerate's ``DataLoaderShard``, Lightning's use)
  call it through ``super().__init__``;
- ``DataLoader.__iter__``: one more epoch; the iterator it returns is tagged with its loader's record;
- ``_BaseDataLoaderIter.__next__``: the time of the request and the wait, per batch.

NOTE [ why the iterator is tagged, not wrapped ]: the iterator the script gets is torch's own, so code that checks
its type (Lightning's ``isinstance(it, _BaseDataLoaderIter)``, ``_MultiProcessingDataLoaderIter``) behaves as
without the hook, and a subclass whose ``__iter__`` calls ``super().__iter__()`` is counted once.

NOTE [ results unchanged ]: the hook draws no random numbers, creates no CUDA context (CUDA events only once the
script has initialised CUDA), and returns what ``next()`` returned. Its own errors are caught and noted in the
record, never raised into the script.

The record is written at exit (``atexit``; a crash is read from ``sys.last_value``), on SIGINT/SIGTERM (then the
previous handler runs), and at ``GPUFEED_WATCH_STEPS`` training batches of one loader (asked for with autograd on:
an evaluation pass does not count), where the process exits with status 0.
"""

from __future__ import annotations

import ast
import atexit
import importlib
import importlib.abc
import math
import os
import signal
import sys
import time
import weakref
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .found import dataset_name, transform_text, where_built
from .record import LoaderRecord, ProcessRecord
from .sampler import Sampler, usable_cores

__all__ = ["install"]

_DATALOADER_MODULE = "torch.utils.data.dataloader"


@dataclass
class _Watched:
    """One loader: its record, a weak reference to it (for the side measurement) and its CUDA events per batch."""

    record: LoaderRecord
    loader: Any  # weakref.ref to the DataLoader
    events: list[Any] = field(default_factory=list)  # per batch: a torch.cuda.Event, or None before CUDA was up


class _State:
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
        self.watched: list[_Watched] = []
        self.notes: list[str] = []
        self.exit: str | None = None
        self.side_result: dict[str, Any] | None = None
        self.paused = False  # True during the side measurement: its loaders are not the script's
        self.cuda = False  # True once the script has initialised CUDA
        self.gpu_index = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self.sampler: Sampler | None = None
        self.torch: Any = None
        self.sources: dict[str, ast.AST | None] = {}

    def note(self, what: str, e: BaseException) -> None:
        if len(self.notes) < 50:
            self.notes.append(f"{what}: {type(e).__name__}: {e}")

    def start_sampler(self) -> None:
        if self.sampler is None:
            self.sampler = Sampler(self.pid, origin=self.origin, gpu_index=lambda: self.gpu_index)
            self.sampler.start()


_state: _State | None = None


def _order_sampler(loader: Any) -> Any:
    """The sampler that orders the batches: a ``batch_sampler=`` (Accelerate's shards wrap the script's) is followed
    down to the sampler it batches; a plain loader's is its ``sampler``."""
    batches = loader.batch_sampler
    for _ in range(4):  # a wrapper of a wrapper (BatchSamplerShard over BatchSampler), never a loop
        inner = getattr(batches, "batch_sampler", None)
        if inner is None:
            break
        batches = inner
    return getattr(batches, "sampler", None) or loader.sampler


def install(directory: str | None = None) -> None:
    """Measure this process: patch ``DataLoader`` when torch is imported and write the record at exit.

    Args:
        directory: where the record goes; ``GPUFEED_WATCH_DIR`` when None (and nothing is done when it is unset).

    Example:
        >>> install(None) if "GPUFEED_WATCH_DIR" not in os.environ else None  # nothing to do outside a watch
    """
    global _state
    directory = directory or os.environ.get("GPUFEED_WATCH_DIR")
    if not directory or _state is not None:
        return
    _state = state = _State(directory)
    if state.root:
        state.start_sampler()
    atexit.register(_at_exit)
    _install_signal_handlers()
    if _DATALOADER_MODULE in sys.modules:
        _patch(sys.modules[_DATALOADER_MODULE])
    else:
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport:
    """A meta-path finder that lets torch import its DataLoader module as usual, then patches it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _DATALOADER_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _patch(module: Any) -> None:
    state = _state
    assert state is not None
    try:
        loader_cls, iter_cls = module.DataLoader, module._BaseDataLoaderIter
        init, iter_, next_ = loader_cls.__init__, loader_cls.__iter__, iter_cls.__next__
    except AttributeError as e:
        state.note("DataLoader not patched", e)
        return
    iter_cls._gpufeed_watch = None  # a class default: the hot path reads an attribute that always exists

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if state.paused or os.getpid() != state.pid:
            return
        try:
            _built(state, self, sys._getframe(1))
        except Exception as e:  # noqa: BLE001 - the hook's bookkeeping never breaks the script
            state.note("a DataLoader's configuration", e)

    def __iter__(self: Any) -> Any:
        it = iter_(self)
        try:
            watched = self.__dict__.get("_gpufeed_watched")
            if watched is not None and not state.paused:
                watched.record.epochs += 1
                it._gpufeed_watch = watched
        except Exception as e:  # noqa: BLE001
            state.note("a DataLoader's epoch", e)
        return it

    def __next__(self: Any) -> Any:
        watched = self._gpufeed_watch
        if watched is None or state.paused:
            return next_(self)
        rec = watched.record
        grad = state.torch.is_grad_enabled()  # a training loop's request; an evaluation loop runs without autograd
        if state.steps and grad and rec.training_batches >= state.steps:
            _stop(watched)
        t0 = time.perf_counter()
        data = next_(self)
        t1 = time.perf_counter()
        try:
            rec.requested.append(t0 - state.origin)
            rec.waits.append(t1 - t0)
            rec.grad.append(grad)
            rec.samples.append(_samples(data, state.torch.Tensor))
            if state.cuda or _cuda_up(state):
                event = state.torch.cuda.Event(enable_timing=True)
                event.record()
                watched.events.extend([None] * (len(rec.waits) - 1 - len(watched.events)))
                watched.events.append(event)
        except Exception as e:  # noqa: BLE001
            state.note("a batch's timing", e)
        return data

    patched: list[tuple[type, str, Any]] = [(loader_cls, "__init__", __init__), (loader_cls, "__iter__", __iter__)]
    for cls, name, fn in [*patched, (iter_cls, "__next__", __next__)]:
        fn.__wrapped__ = getattr(cls, name)
        setattr(cls, name, fn)


def _cuda_up(state: _State) -> bool:
    """Whether the script has initialised CUDA (checked per batch until it has; never initialises it)."""
    cuda = state.torch.cuda
    if cuda.is_initialized():
        state.cuda = True
        state.gpu_index = _nvml_index(cuda.current_device())
    return state.cuda


def _nvml_index(device: int) -> int:
    """The NVML index of CUDA device ``device`` of this process (``CUDA_VISIBLE_DEVICES`` renumbers them)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device < len(visible) and visible[device].isdigit():
        return int(visible[device])
    return device


def _samples(data: Any, tensor: Any) -> int:
    """The first dimension of the first tensor in a batch (a tensor, or nested tuples, lists and dicts)."""
    for _ in range(4):
        if isinstance(data, tensor):
            return int(data.shape[0]) if data.dim() else 0
        if isinstance(data, (list, tuple)) and data:
            data = data[0]
        elif isinstance(data, dict) and data:
            data = next(iter(data.values()))
        else:
            return 0
    return 0


def _built(state: _State, loader: Any, frame: FrameType | None) -> None:
    """A new loader: its record, from its attributes and the frame of the script that built it."""
    if "_gpufeed_watched" in loader.__dict__:
        return  # a subclass's __init__ that calls DataLoader.__init__ twice
    if state.torch is None:
        state.torch = importlib.import_module("torch")
        atexit.unregister(_at_exit)  # NOTE: registered again so it runs before torch's and multiprocessing's own
        atexit.register(_at_exit)
        state.start_sampler()
    built_at, source = where_built(frame, state.sources, state.notes)
    dataset = loader.dataset
    sampler = _order_sampler(loader)
    batch_size = loader.batch_size
    if batch_size is None:
        batch_size = getattr(loader.batch_sampler, "batch_size", None)
    record = LoaderRecord(
        id=len(state.watched),
        cls=type(loader).__name__,
        built_at=built_at,
        source=source,
        dataset=dataset_name(dataset),
        transform=transform_text(dataset),
        batch_size=batch_size,
        num_workers=int(loader.num_workers),
        pin_memory=bool(loader.pin_memory),
        persistent_workers=bool(loader.persistent_workers),
        prefetch_factor=loader.prefetch_factor,
        sampler=type(sampler).__name__,
        drop_last=bool(loader.drop_last),
    )
    watched = _Watched(record, weakref.ref(loader))
    state.watched.append(watched)
    object.__setattr__(loader, "_gpufeed_watched", watched)  # DataLoader.__setattr__ guards some attributes


def _record(state: _State) -> ProcessRecord:
    loaders = []
    for watched in state.watched:
        rec = watched.record
        try:
            rec.device_step_s = _device_steps(watched.events, len(rec.waits))
        except Exception as e:  # noqa: BLE001
            state.note("the CUDA events", e)
        loaders.append(rec)
    device = "cpu"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            device = f"cuda:{torch.cuda.current_device()}"
    except Exception as e:  # noqa: BLE001
        state.note("the device", e)
    sampler = state.sampler
    return ProcessRecord(
        rank=int(os.environ.get("RANK", "0") or 0),
        world_size=int(os.environ.get("WORLD_SIZE", "1") or 1),
        pid=state.pid,
        argv=list(sys.argv),
        device=device,
        started=state.started,
        ended=time.time(),
        exit=state.exit or "finished",
        loaders=loaders,
        cpu=list(sampler.cpu) if sampler else [],
        cores=usable_cores(),
        gpu=list(sampler.gpu) if sampler else [],
        side=state.side_result,
        notes=state.notes + (list(sampler.notes) if sampler else []),
    )


def _device_steps(events: list[Any], batches: int) -> list[float] | None:
    """CUDA time between consecutive batches' returns (one per pair, NaN where CUDA was not up yet)."""
    if not any(e is not None for e in events):
        return None
    last = next(e for e in reversed(events) if e is not None)
    last.synchronize()  # NOTE: once, at the flush; never in the script's loop
    events = events + [None] * (batches - len(events))
    out = []
    for a, b in zip(events, events[1:], strict=False):
        out.append(a.elapsed_time(b) / 1000 if a is not None and b is not None else math.nan)
    return out


def _flush() -> None:
    """Write this process's record (again: a later flush replaces an earlier one)."""
    state = _state
    if state is None or os.getpid() != state.pid:
        return  # a forked DataLoader worker: its parent writes
    if not state.watched and (not state.root or _is_launcher()):
        return  # a helper process (multiprocessing's, a spawned worker) or torchrun's launcher
    try:
        os.makedirs(state.directory, exist_ok=True)
        _record(state).save(state.directory)
    except Exception as e:  # noqa: BLE001 - the script's exit must not fail because of the record
        print(f"gpufeed diagnose: could not write the record: {type(e).__name__}: {e}", file=sys.stderr)


def _is_launcher() -> bool:
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return name == "torch.distributed.run" or os.path.basename(sys.argv[0] if sys.argv else "") == "torchrun"


def _side(watched: _Watched | None) -> None:
    """The side measurement (``GPUFEED_WATCH_SIDE=1``), on the script's loader, after its measured steps."""
    state = _state
    if state is None or not state.side or watched is None:
        return
    if int(os.environ.get("RANK", "0") or 0) != 0:  # the report reads rank 0's; the others would compete for the cores
        return
    loader = watched.loader()
    if loader is None:
        state.notes.append("side measurement not made: the loader no longer exists")
        return
    state.paused = True
    try:
        side = importlib.import_module("gpufeed.watch.side")
        device = "cuda" if state.cuda else "cpu"
        state.side_result = side.side_measurement(loader, state.side_seconds, device)
    except Exception as e:  # noqa: BLE001
        state.note("side measurement failed", e)
    finally:
        state.paused = False


def _stop(watched: _Watched) -> None:
    """``GPUFEED_WATCH_STEPS`` batches served: measure on the side, write the record and end the process."""
    state = _state
    assert state is not None
    state.exit = "stopped"
    _side(watched)
    _flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream: nothing left to show
            pass
    os._exit(0)


def _at_exit() -> None:
    state = _state
    if state is None or os.getpid() != state.pid:
        return
    last = getattr(sys, "last_value", None)  # set by Python for the exception that ended the script
    if state.exit is None and isinstance(last, KeyboardInterrupt):
        state.exit = "interrupted"
    elif state.exit is None and last is not None:
        state.exit = f"crashed: {type(last).__name__}: {last}"
    if state.exit is None:
        main = max(state.watched, key=lambda w: (w.record.training_batches, w.record.batches), default=None)
        _side(main if main is not None and main.record.waits else None)
    if state.sampler is not None:
        state.sampler.stop()
    _flush()


def _install_signal_handlers() -> None:
    """On SIGINT and SIGTERM: write the record, then let the previous handler (Python's default) go on."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue
            signal.signal(signum, _handler(previous))
        except (ValueError, OSError) as e:  # not the main thread, or no such signal here
            if _state is not None:
                _state.note("signal handlers", e)


def _handler(previous: Any) -> Any:
    def handle(signum: int, frame: FrameType | None) -> Any:
        state = _state
        if state is not None and os.getpid() == state.pid:
            if state.exit is None:
                state.exit = "interrupted"
            _flush()
        if callable(previous):
            return previous(signum, frame)
        signal.signal(signum, signal.SIG_DFL)  # SIG_DFL: end as the signal would have without the hook
        os.kill(os.getpid(), signum)
        return None

    return handle
