"""The measurement inside each process of a watched script: every ``DataLoader`` it builds and every ``next()``.

``install()`` (called by ``watch/site/sitecustomize.py`` when ``GPUFEED_WATCH_DIR`` is set) imports no torch: it
waits for ``torch.utils.data.dataloader`` to be imported by the script, then patches four methods there:

- ``DataLoader.__init__``: the loader's configuration and the line of the script that built it (a new
  :class:`~gpufeed.watch.record.LoaderRecord`); subclasses (Accelerate's ``DataLoaderShard``, a script's own) call
  it through ``super().__init__``; torchdata's ``StatefulDataLoader``, which does not, gets the same patch when it is
  imported;
- ``_BaseDataLoaderIter.__init__`` and ``._reset`` (persistent workers reuse their iterator): one more epoch; the
  iterator is tagged with its loader's record (a loader of a class that never ran either ``__init__`` gets its
  record here, at the line that first iterated it);
- ``_BaseDataLoaderIter.__next__``: the time of the request and the wait, per batch.

NOTE [ why the iterator is tagged, not wrapped ]: the iterator the script gets is torch's own, so code that checks
its type (Lightning's ``isinstance(it, _BaseDataLoaderIter)``, ``_MultiProcessingDataLoaderIter``) behaves as
without the hook; a subclass whose ``__iter__`` calls ``super().__iter__()`` makes one iterator: one epoch.

NOTE [ results unchanged ]: the hook draws no random numbers, creates no CUDA context (CUDA events only once the
script has initialised CUDA), and returns what ``next()`` returned. Its own errors are caught and noted in the
record, never raised into the script.

The record is written at exit (``atexit``; a crash is read from ``sys.last_value``), on SIGINT/SIGTERM (then the
previous handler runs; a handler installed later that calls ours, as Lightning's graceful SIGTERM does, keeps the
decision to end the process), and at ``GPUFEED_WATCH_STEPS`` training batches of one loader (asked for with autograd on:
an evaluation pass does not count), where the process exits with status 0.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

from .clock import nvml_index
from .found import batch_samples, loader_record, loader_settings, where_built
from .hf import batch_layout, hf_found
from .patching import PatchOnImport
from .record import FIRST_BATCH
from .signals import install_handlers
from .state import State, Watched

__all__ = ["install"]

_DATALOADER_MODULE = "torch.utils.data.dataloader"
_STATEFUL_MODULE = "torchdata.stateful_dataloader.stateful_dataloader"  # StatefulDataLoader skips DataLoader.__init__
_GPUFEED_MODULE = "gpufeed.loading.epochs"  # gpufeed's own loaders: a script already fixed (diagnose --verify)
_ACCELERATE_MODULE = "gpufeed.pipeline.accelerate"  # what gf.accelerate costs such a script once


_state: State | None = None


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
    _state = state = State(directory)
    if state.root:
        state.start_sampler()
    atexit.register(_at_exit)
    install_handlers(_on_signal, _note)
    patches = {
        _DATALOADER_MODULE: _patch,
        _STATEFUL_MODULE: _patch_stateful,
        _GPUFEED_MODULE: _patch_gpufeed,
        _ACCELERATE_MODULE: _patch_accelerate,
    }
    for name in [name for name in patches if name in sys.modules]:
        patches.pop(name)(sys.modules[name], 0.0)  # imported before the hook: its import cost is not the script's
    if patches:
        sys.meta_path.insert(0, PatchOnImport(patches))


def _patch(module: Any, exec_s: float) -> None:
    state = _state
    assert state is not None
    try:
        loader_cls, iter_cls = module.DataLoader, module._BaseDataLoaderIter
        iter_init, reset, next_ = iter_cls.__init__, iter_cls._reset, iter_cls.__next__
    except AttributeError as e:
        state.note("DataLoader not patched", e)
        return
    iter_cls._gpufeed_watch = None  # a class default: the hot path reads an attribute that always exists

    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        iter_init(self, loader, *args, **kwargs)
        _epoch(state, self, loader, sys._getframe(1))

    def _reset(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = reset(self, *args, **kwargs)
        first = kwargs.get("first_iter", args[1] if len(args) > 1 else False)
        if not first and self._gpufeed_watch is not None and not state.paused:  # persistent workers: a new epoch
            self._gpufeed_watch.record.epochs += 1
        return out

    _wrap(loader_cls, "__init__", _init_patch(state, loader_cls.__init__))
    for name, fn in (("__init__", __init__), ("_reset", _reset), ("__next__", _next_patch(state, next_))):
        _wrap(iter_cls, name, fn)


def _next_patch(state: State, next_: Any) -> Any:
    """An iterator's ``__next__`` that times the request of a tagged iterator (``_gpufeed_watch``)."""

    def __next__(self: Any) -> Any:
        watched = self._gpufeed_watch
        if watched is None or state.paused:
            return next_(self)
        grad = state.torch.is_grad_enabled()  # a training loop's request; an evaluation loop runs without autograd
        if state.steps and grad and watched.trained >= state.steps:
            _stop(watched)
        if not state.first_batch:  # once per process, at the request: gpufeed diagnose --time counts from here
            _mark_first_batch(state)
        t0 = time.perf_counter()
        data = next_(self)
        t1 = time.perf_counter()
        try:
            _batch(state, watched, t0, t1, grad, data)
        except Exception as e:  # noqa: BLE001 - the hook's bookkeeping never breaks the script
            state.note("a batch's timing", e)
        return data

    return __next__


def _patch_gpufeed(module: Any, exec_s: float) -> None:
    """gpufeed's loaders (an epoch is an ``_Epoch`` iterator): the script fixed by ``gpufeed diagnose --verify``,
    or one that already uses gpufeed, is measured as a DataLoader is."""
    state = _state
    assert state is not None
    try:
        iter_cls = module._Epoch
        iter_init, next_ = iter_cls.__init__, iter_cls.__next__
    except AttributeError as e:
        state.note("gpufeed's loaders not patched", e)
        return
    iter_cls._gpufeed_watch = None

    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        iter_init(self, loader, *args, **kwargs)
        _epoch(state, self, loader, sys._getframe(1))

    for name, fn in (("__init__", __init__), ("__next__", _next_patch(state, next_))):
        _wrap(iter_cls, name, fn)


def _patch_accelerate(module: Any, exec_s: float) -> None:
    """``gf.accelerate``: the one-time cost of a script that uses it (``diagnose --verify``'s changed copy) is what
    importing it took and what its calls took (reading the data in, caching it), measured as they happen. The side
    measurement's own import and calls (``state.paused``) are not the script's."""
    state = _state
    assert state is not None
    if not state.paused:
        state.fix_s["import_s"] = state.fix_s.get("import_s", 0.0) + exec_s
    try:
        accelerate = module.accelerate
    except AttributeError as e:
        state.note("gf.accelerate not timed", e)
        return

    @functools.wraps(accelerate)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if state.paused:
            return accelerate(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return accelerate(*args, **kwargs)
        finally:
            state.fix_s["accelerate_s"] = state.fix_s.get("accelerate_s", 0.0) + time.perf_counter() - t0

    module.accelerate = timed


def _patch_stateful(module: Any, exec_s: float) -> None:
    """torchdata's ``StatefulDataLoader``: its ``__init__`` does not call ``DataLoader.__init__``."""
    state = _state
    assert state is not None
    try:
        cls = module.StatefulDataLoader
    except AttributeError as e:
        state.note("StatefulDataLoader not patched", e)
        return
    _wrap(cls, "__init__", _init_patch(state, cls.__init__))


def _wrap(cls: type, name: str, fn: Any) -> None:
    fn.__wrapped__ = getattr(cls, name)
    setattr(cls, name, fn)


def _init_patch(state: State, init: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if state.paused or os.getpid() != state.pid:
            return
        try:
            _built(state, self, sys._getframe(1), received=(args, kwargs))
        except Exception as e:  # noqa: BLE001 - the hook's bookkeeping never breaks the script
            state.note("a DataLoader's configuration", e)

    return __init__


def _epoch(state: State, it: Any, loader: Any, frame: FrameType | None) -> None:
    """A new iterator of ``loader``: one more epoch, and the iterator tagged with the loader's record."""
    if state.paused or os.getpid() != state.pid:
        return
    try:
        if "_gpufeed_watched" not in loader.__dict__:  # a loader class that ran neither patched __init__
            _built(state, loader, frame, iterated=True)
        watched = loader.__dict__["_gpufeed_watched"]
        if watched is None:  # gpufeed's own DataLoader, inside a gpufeed loader: not the script's
            return
        watched.record.epochs += 1
        it._gpufeed_watch = watched
    except Exception as e:  # noqa: BLE001
        state.note("a DataLoader's epoch", e)


def _batch(state: State, watched: Watched, t0: float, t1: float, grad: bool, data: Any) -> None:
    """One batch served: requested at ``t0``, returned at ``t1`` (perf_counter)."""
    rec = watched.record
    samples = batch_samples(data, state.torch.Tensor)
    if rec.hf is not None and rec.hf.get("batch") is None:  # what the script's loop reads of a batch
        rec.hf["batch"] = batch_layout(data, state.torch.Tensor)
    with state.lock:
        rec.requested.append(t0 - state.origin)
        rec.waits.append(t1 - t0)
        rec.grad.append(grad)
        rec.samples.append(samples)
        watched.trained += grad
        if state.cuda or _cuda_up(state):
            watched.clock.mark(len(rec.waits) - 1, state.torch.cuda)


def _mark_first_batch(state: State) -> None:
    state.first_batch = True
    try:
        with open(os.path.join(state.directory, FIRST_BATCH), "a"):
            pass
    except OSError as e:  # the mark only starts --time; the script goes on
        state.note("the first-batch mark", e)


def _cuda_up(state: State) -> bool:
    """Whether the script has initialised CUDA (checked per batch until it has; never initialises it)."""
    cuda = state.torch.cuda
    if cuda.is_initialized():
        state.cuda = True
        state.gpu_index = nvml_index(cuda.current_device())
    return state.cuda


def _built(
    state: State, loader: Any, frame: FrameType | None, iterated: bool = False, received: Any = None
) -> Watched | None:
    """A new loader: its record, from its attributes and the frame of the script that built it (or, ``iterated``,
    that first iterated it: the source of that line is not the loader's call). None for a DataLoader that
    gpufeed's own code built (the fallback's workers, inside a gpufeed loader that is measured itself)."""
    if "_gpufeed_watched" in loader.__dict__:
        return loader.__dict__["_gpufeed_watched"]  # a subclass's __init__ that calls DataLoader.__init__ twice
    if state.torch is None:
        state.torch = importlib.import_module("torch")
        atexit.unregister(_at_exit)  # NOTE: registered again so it runs before torch's and multiprocessing's own
        atexit.register(_at_exit)
        _register_side_at_end(state)
        state.start_sampler()
    if _made_by_gpufeed(frame) and hasattr(loader, "num_workers"):
        object.__setattr__(loader, "_gpufeed_watched", None)
        return None
    built = where_built(frame, state.sources, state.notes, loader)
    gpufeed_loader = not hasattr(loader, "num_workers")
    if iterated:
        built.source = None
        if not gpufeed_loader:
            state.notes.append(
                f"a {type(loader).__name__} was built without DataLoader.__init__: its line is where it was first "
                "iterated"
            )
    record = loader_record(loader, len(state.watched), built, received)
    if not gpufeed_loader:
        record.hf = hf_found(loader.dataset, loader.collate_fn, built.frame)
        if record.hf is not None and record.hf["function"] is not None and record.transform is None:
            applies = record.hf["recipe_text"] or "a recipe not found (see the change)"
            record.transform = f"{record.hf['function']} (set by set_transform/with_transform), applying {applies}"
    built.frame = None  # the script's frame is not kept alive by the hook
    watched = Watched(record, weakref.ref(loader), settings=loader_settings(loader))
    state.watched.append(watched)
    object.__setattr__(loader, "_gpufeed_watched", watched)  # DataLoader.__setattr__ guards some attributes
    return watched


def _made_by_gpufeed(frame: FrameType | None) -> bool:
    """Whether gpufeed's own code (not the hook) called the loader's class: the first frame outside torch is
    gpufeed's."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if module not in ("torch", "_gpufeed_watch", "torchdata"):
            return module == "gpufeed"
        frame = frame.f_back
    return False


def _flush() -> None:
    """Write this process's record (again: a later flush replaces an earlier one)."""
    state = _state
    if state is None or os.getpid() != state.pid:
        return  # a forked DataLoader worker: its parent writes
    if not state.watched and (not state.root or _is_launcher()):
        return  # a helper process (multiprocessing's, a spawned worker) or torchrun's launcher
    try:
        os.makedirs(state.directory, exist_ok=True)
        state.record().save(state.directory)
    except Exception as e:  # noqa: BLE001 - the script's exit must not fail because of the record
        print(f"gpufeed diagnose: could not write the record: {type(e).__name__}: {e}", file=sys.stderr)


def _is_launcher() -> bool:
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return name == "torch.distributed.run" or os.path.basename(sys.argv[0] if sys.argv else "") == "torchrun"


def _side(watched: Watched | None) -> None:
    """The side measurement (``GPUFEED_WATCH_SIDE=1``), on the script's loader, after its measured steps."""
    state = _state
    if state is None or not state.side or watched is None:
        return
    if int(os.environ.get("RANK", "0") or 0) != 0:  # the report reads rank 0's; the others would compete for the cores
        return
    loader = watched.loader() or watched.settings
    if loader is None:
        state.notes.append("side measurement not made: the loader no longer exists")
        return
    state.paused = True
    try:
        had = "gpufeed.pipeline.accelerate" in sys.modules  # the script imported gpufeed itself: no cost to add
        t0 = time.perf_counter()
        importlib.import_module("gpufeed")  # what the changed script's `import gpufeed as gf` costs it
        side = importlib.import_module("gpufeed.watch.side")
        importlib.import_module("gpufeed.pipeline.accelerate")
        import_s = 0.0 if had else time.perf_counter() - t0  # part of the fix's one-time cost
        device = "cuda" if state.cuda else "cpu"
        state.side_result = {**side.side_measurement(loader, state.side_seconds, device), "import_s": import_s}
    except Exception as e:  # noqa: BLE001
        state.note("side measurement failed", e)
    finally:
        state.paused = False


def _stop(watched: Watched) -> None:
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


def _ending(state: State) -> None:
    """How the script ended, from the exception Python reports at its end (``sys.last_value``)."""
    last = getattr(sys, "last_value", None)  # set by Python for the exception that ended the script
    if state.exit is None and isinstance(last, KeyboardInterrupt):
        state.exit = "interrupted"
    elif state.exit is None and last is not None:
        state.exit = f"crashed: {type(last).__name__}: {last}"


def _side_at_end() -> None:
    """The side measurement of a script that ended by itself. NOTE [ the side measurement at the end ]: it runs
    from threading's exit hooks, before Python's own ones shut the thread pools down (concurrent.futures refuses
    new work after that, and gpufeed decodes on threads), and before atexit's."""
    state = _state
    if state is None or os.getpid() != state.pid or state.side_done:
        return
    state.side_done = True
    _ending(state)
    if state.exit is None:
        main = max(state.watched, key=lambda w: (w.trained, w.record.batches), default=None)
        _side(main if main is not None and main.record.waits else None)


def _register_side_at_end(state: State) -> None:
    """Register :func:`_side_at_end` with threading's exit hooks (they run in reverse order: concurrent.futures'
    own, registered at its import, which is made first, runs after ours)."""
    if not state.side:
        return
    try:
        for name in ("concurrent.futures.thread", "concurrent.futures.process"):  # process: torch.compile's pool
            importlib.import_module(name)  # imported at shutdown, each would register its own hook: refused then
        threading._register_atexit(_side_at_end)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError, ImportError) as e:  # another Python: atexit's turn will try it
        state.note("the side measurement at the end", e)


def _at_exit() -> None:
    state = _state
    if state is None or os.getpid() != state.pid:
        return
    _side_at_end()  # when threading's hook did not run (os._exit paths aside, a Python without it)
    if state.sampler is not None:
        state.sampler.stop()
    _flush()


def _on_signal() -> None:
    """A SIGINT or SIGTERM reached this process: the script was interrupted; write what was measured."""
    state = _state
    if state is not None and os.getpid() == state.pid:
        if state.exit is None:
            state.exit = "interrupted"
        _flush()


def _note(what: str, e: BaseException) -> None:
    if _state is not None:
        _state.note(what, e)
