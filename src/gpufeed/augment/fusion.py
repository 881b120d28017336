"""Fused kernels: an op's pixel arithmetic compiled into a loop or two over the batch, in the background.

An eager op is many full passes over the batch, one per tensor operation, each through memory (ColorJitter on a
batch: about 500 of them). :func:`fused` compiles a function written in the same tensor operations with
``torch.compile`` (Inductor: C++/OpenMP on the CPU, Triton on a GPU), which runs it as one loop per reduction,
the float intermediates kept in registers.

NOTE [ Compiled ops ]
- Exactness: a fused function is written in the eager ops it replaces, in their order, and its result is
  compared with the eager op's bit for bit in the tests (random parameters and sizes). A reduction whose result
  depends on its order (a float sum) is written so that every order gives the same bits, or left to torch. A
  multiply and an add stay two roundings: Inductor's C++ compiles with ``-ffp-contract=off``, and Triton's fused
  multiply-adds are turned off (``emulate_precision_casts``) for these functions; constants a GPU compiler would
  divide by as reciprocals come in as tensors. Every op's eager code is that arithmetic too (the resize's:
  .taps.eager_taps), so compiled or not, a seed's pixels are the same bits on the CPU
  (tests/augment/test_same_pixels.py); a GPU's Triton against the CPU: benchmarks/gpu_check.py.
- When: never while a user waits. The first call of a fused function with a kind of input (its shapes, dtypes,
  static sizes and arguments: :func:`_kind`) queues its compile on one background thread (:mod:`.background`) and
  raises :class:`NotCompiled`: the caller runs its eager code. Once the compiled function has returned for that kind
  in the background, and no compile of the function is in flight, calls of the kind run compiled: the fused kernels
  take over, with the same pixels, whenever that is. A DeviceLoader's first run of its transform (two samples, at
  construction) queues the compile; its plan says when the kernels took over (``loader.compile_note``). Compiling
  takes seconds to minutes (ColorJitter's four adjustments on the 2-core machine: 16-25 s quiet with a cold Inductor
  cache, minutes under load; README), and it is counted apart from the data's one-time costs. accelerate's dry run
  on the CPU does not compile (:func:`eager`), so a GPU loader compiles for its GPU only. :func:`foreground` compiles
  at the call instead (tests, the launch counts); :func:`wait` blocks until the queued compiles are done.
- Sizes equal by chance at the first call are kept apart (no duck shapes), so that the next batch size does not
  recompile.
- What runs the eager code instead (the same pixels): a batch with a dimension of size 0 or 1 (torch.compile
  specialises on those sizes), ``GPUFEED_COMPILE`` off (0/false/no/off, read at each call: :func:`.compiler.setting`)
  or ``TORCH_COMPILE_DISABLE=1``, a block under :func:`eager`, a device whose compiler cannot run (found in
  milliseconds before any compile: :func:`.compiler.missing`; or failed: one warning naming the cause), a function
  compiled for :data:`VERSIONS` kinds of batch already (one warning), and one whose compile failed otherwise (one
  warning, at its next call: never an exception mid-epoch).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import background
from .compiler import missing, setting

__all__ = ["Compile", "NotCompiled", "Watched", "compiling", "eager", "foreground", "fused", "wait", "watch"]

_EAGER = contextvars.ContextVar("gpufeed_eager", default=False)
_FOREGROUND = contextvars.ContextVar("gpufeed_foreground", default=False)
_SEEN: contextvars.ContextVar[Watched | None] = contextvars.ContextVar("gpufeed_fused_seen", default=None)
VERSIONS = 64  # versions of one fused function a process may compile (a kind of batch each), then its eager ops
_FAILED: dict[str, str] = {}  # device type -> why its compiler cannot run: its ops run eager from then on


class NotCompiled(Exception):
    """The fused function does not run here (see NOTE [ Compiled ops ]): the caller runs its eager code."""


@dataclass
class Compile:
    """One kind of input of one fused function, compiled (``time.monotonic`` times; None: not yet)."""

    op: str
    device: str
    queued: float
    started: float | None = None
    finished: float | None = None
    error: str | None = None  # why it failed: the eager ops serve
    args: Any = field(default=None, repr=False)  # the copies it compiles with, dropped once done

    @property
    def seconds(self) -> float | None:
        """Seconds compiling (queued behind another compile not counted); None until done."""
        return None if self.started is None or self.finished is None else self.finished - self.started


def compiling(device: torch.device | None = None) -> bool:
    """Whether fused functions compile (on ``device``): ``GPUFEED_COMPILE`` is not off, no :func:`eager` block is
    open, torch.compile is not disabled (``TORCH_COMPILE_DISABLE``), and the device's compiler can run."""
    if _EAGER.get() or not setting():
        return False
    # TORCH_COMPILE_DISABLE=1: torch.compile would hand back the function, which written for a compiler runs far
    # slower eager than the op's own eager code. Read from dynamo's config where dynamo is imported, else from the
    # variable as it reads it: importing dynamo takes 3-7 s, off the caller's thread (the compile's own).
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo.disable if dynamo is not None else os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1":
        return False
    return device is None or device.type not in _FAILED


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Within this block fused functions raise :class:`NotCompiled` (their ops run eager): a dry run that only
    looks for refusals, on another device than the loader's, compiles nothing."""
    token = _EAGER.set(True)
    try:
        yield
    finally:
        _EAGER.reset(token)


@contextlib.contextmanager
def foreground() -> Iterator[None]:
    """Within this block a fused function compiles at its call, in the calling thread, and runs compiled (the
    behaviour before issue 45): for tests and for counting the kernels a compile generates."""
    token = _FOREGROUND.set(True)
    try:
        yield
    finally:
        _FOREGROUND.reset(token)


def wait(timeout: float | None = None) -> bool:
    """Block until every queued compile is done (compiled or failed); False if ``timeout`` seconds passed first. A
    benchmark of the steady state calls it after its warm-up; a loader never needs it."""
    return background.idle(timeout)


@dataclass
class Watched:
    """What the fused functions called within a :func:`watch` block did (compiling on)."""

    fused: set[_Fused] = field(default_factory=set)
    served: int = 0  # calls that ran compiled
    waited: int = 0  # calls that ran eager while their compile was pending


@contextlib.contextmanager
def watch() -> Iterator[Watched]:
    """The fused functions called within this block, in this thread, and how they ran: a loader's, per chunk."""
    seen = Watched()
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


class _Fused:
    """``fn`` compiled per kind of input in the background (see NOTE [ Compiled ops ])."""

    def __init__(self, fn: Callable[..., Any], op: str, cost: str, static: Mapping[int, tuple[int, ...]]) -> None:
        self.fn, self.op, self.cost, self.static = fn, op, cost, static
        self.compiled: Callable[..., Any] | None = None
        self.kinds: dict[Hashable, Compile] = {}
        self.keep: list[Any] = []  # objects a kind is keyed by identity: kept, so that no other takes their id
        # compiles queued and done: while one is in flight the caller's thread runs none of this function's code
        # (dynamo's cache of the function would change under it)
        self.queued = self.done = 0
        self.full = False  # VERSIONS reached: the eager ops from then on
        self.broken: str | None = None  # a compile failed otherwise: the eager ops from then on
        self.unsaid: list[str] = []  # warnings from the background, said at the next call in the caller's thread
        self.served = 0  # calls that ran compiled
        self.waited = 0  # calls that ran eager while a compile of theirs was pending

    def __call__(self, x: torch.Tensor, *args: Any) -> Any:
        while self.unsaid:
            warnings.warn(self.unsaid.pop(0), stacklevel=2)
        if not compiling(x.device) or min(x.shape, default=0) < 2 or self.full or self.broken:
            raise NotCompiled
        seen = _SEEN.get() or Watched()
        seen.fused.add(self)
        key, objects = _kind((x, *args))
        job = self.kinds.get(key)
        if job is None:
            job = self._start(key, objects, x)
            if _FOREGROUND.get():  # compiled here and now: its first call's output is the batch
                out = self._run(job, (x, *args))
                while self.unsaid:
                    warnings.warn(self.unsaid.pop(0), stacklevel=2)
                if job.error is not None:
                    raise NotCompiled
                self.served += 1
                seen.served += 1
                return out
            self._queue(job, (x, *args))
        if job.finished is None or self.queued > self.done:
            self.waited += 1
            seen.waited += 1
            raise NotCompiled
        if job.error is not None:
            raise NotCompiled
        try:
            with _apart(), _limit_raises():  # in case a kind's key missed what dynamo guards: a compile here
                out = self.compiled(*self._marked((x, *args)))  # type: ignore[misc]  # set by _run
        except Exception as e:
            self._failed(e, x.device)
            while self.unsaid:
                warnings.warn(self.unsaid.pop(0), stacklevel=2)
            raise NotCompiled from e
        self.served += 1
        seen.served += 1
        return out

    def _start(self, key: Hashable, objects: list[Any], x: torch.Tensor) -> Compile:
        """A new kind's record, after the environment's check (milliseconds, once per device type)."""
        if x.device.type not in _FAILED and (reason := _environment(x.device)) is not None:
            _FAILED[x.device.type] = reason
            warnings.warn(self._eager_from_now(x.device, reason), stacklevel=3)
            raise NotCompiled
        job = Compile(self.op, x.device.type, time.monotonic())
        self.kinds[key] = job
        self.keep += objects
        _LOG.append(job)
        return job

    def prepare(self, x: torch.Tensor, *args: Any) -> None:
        """Queue the compile of this kind of input, if new, without running anything: for a function whose input
        another fused function gives (ColorJitter's adjustments after its mean gray), so that both compile at once."""
        if _FOREGROUND.get() or not compiling(x.device) or min(x.shape, default=0) < 2 or self.full or self.broken:
            return
        key, objects = _kind((x, *args))
        if key not in self.kinds:
            try:
                self._queue(self._start(key, objects, x), (x, *args))
            except NotCompiled:  # the environment's check failed (said once)
                return

    def _queue(self, job: Compile, args: tuple) -> None:
        self.queued += 1
        job.args = background.copies(args)
        background.submit(lambda: self._background(job), args[0].device)

    def _background(self, job: Compile) -> None:
        try:
            self._run(job, job.args)
        finally:
            job.args = None
            self.done += 1  # written by the background thread only (queued by the caller's only): no lost update

    def _run(self, job: Compile, given: tuple | background.Copies) -> Any:
        """The compiled function's first call on ``given`` (the caller's arguments in the foreground, else copies):
        dynamo, AOTAutograd and Inductor build it, the sizes of :attr:`static` compiled as constants. Its output, or
        None where it failed (:attr:`Compile.error` says why)."""
        job.started = time.monotonic()
        try:
            if self.compiled is None:  # here, not at the call: the imports take seconds
                self.compiled = torch.compile(self.fn, dynamic=True, options=_options())
            args = given.args if isinstance(given, background.Copies) else given
            with _apart(), _limit_raises():
                return background.run(self.compiled, given, self._marked(args))
        except Exception as e:
            job.error = self._failed(e, torch.device(job.device))
            return None
        finally:
            job.finished = time.monotonic()

    def _marked(self, args: tuple) -> tuple:
        """``args`` with the sizes of :attr:`static` marked on aliases (the caller's tensors keep no mark), at every
        call: dynamo guards the marks too (a call without them compiled again)."""
        marked = list(args)
        for i, dims in self.static.items():
            marked[i] = marked[i].view(marked[i].shape)
            for d in dims:
                torch._dynamo.mark_static(marked[i], d)
        return tuple(marked)

    def _failed(self, e: Exception, device: torch.device) -> str:
        """Why a compile failed, noted for one warning (:attr:`unsaid`): the function, the device's compiler or
        VERSIONS; the eager ops serve from then on."""
        if isinstance(e, _limit_hit()):
            self.full = True
            self.unsaid.append(
                f"gpufeed's fused {self.op} was compiled for {VERSIONS} kinds of batch in this process "
                f"(gpufeed.augment.fusion.VERSIONS); its ops run eager from now on: {self.cost}"
            )
            return f"compiled for {VERSIONS} kinds of batch already"
        cause = e.inner_exception if isinstance(e, torch._dynamo.exc.BackendCompilerFailed) else e
        text = str(cause).strip()
        reason = f"{type(cause).__name__}: {text.splitlines()[0][:200] if text else '-'}"
        if isinstance(e, torch._dynamo.exc.BackendCompilerFailed):  # the device's compiler: no op compiles there
            _FAILED[device.type] = reason
            self.unsaid.append(self._eager_from_now(device, reason))
        else:
            self.broken = reason
            self.unsaid.append(
                f"gpufeed could not compile its fused {self.op} on {device.type} ({reason}); it runs its eager ops "
                f"from now on: {self.cost}. Set GPUFEED_COMPILE=0 to choose the eager ops without this warning"
            )
        return reason

    def _eager_from_now(self, device: torch.device, reason: str) -> str:
        return (
            f"gpufeed could not compile its fused {self.op} on {device.type} ({reason}); its ops run eager from now "
            f"on: {self.cost}. Set GPUFEED_COMPILE=0 to choose the eager ops without this warning"
        )


_LOG: list[Compile] = []  # every compile of this process, in the order queued
_CHECKED: dict[str, str | None] = {}  # device type -> missing()'s answer, checked once


def _environment(device: torch.device) -> str | None:
    if device.type not in _CHECKED:
        _CHECKED[device.type] = missing(device)
    return _CHECKED[device.type]


def compiles() -> list[Compile]:
    """Every compile this process queued, in order (a copy of the list; the records are live)."""
    return list(_LOG)


def _kind(args: tuple) -> tuple[Hashable, list[Any]]:
    """What a compiled version is specialised on, conservatively: each tensor's dtype, device, shape and strides
    (the static sizes are the function's), each plain value, each other object by identity (returned, to be kept
    alive); and the nesting.
    A kind never seen runs eager while it compiles, so the caller's thread never meets a compile."""
    leaves, spec = pytree.tree_flatten(args)
    key: list[Hashable] = [str(spec)]
    objects = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            key.append((v.dtype, v.device, tuple(v.shape), v.stride()))
        elif v is None or isinstance(v, (bool, int, float, str)):
            key.append((type(v), v))
        else:
            key.append((type(v).__qualname__, id(v)))
            objects.append(v)
    return tuple(key), objects


def _limit_raises() -> contextlib.AbstractContextManager[Any]:
    """Up to :data:`VERSIONS` versions of a fused function (dynamo's own limit, 8 a function, counts every tap count,
    channel count and Normalize a process's recipes bring), then an error rather than dynamo's silent eager run."""
    config = torch._dynamo.config
    if not hasattr(config, "fail_on_recompile_limit_hit"):  # torch before 2.5: no such switch
        return contextlib.nullcontext()
    return config.patch(fail_on_recompile_limit_hit=True, recompile_limit=VERSIONS)


def _limit_hit() -> tuple[type[BaseException], ...]:
    error = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None)
    return (error,) if error is not None else ()


def _apart() -> contextlib.AbstractContextManager[Any]:
    """Sizes that happen to be equal at the first call kept apart (no duck shapes): a first batch of 32 images of 32
    pixels would tie the batch to the side, and the next batch size recompile (seconds)."""
    from torch.fx.experimental import _config as shapes

    if not hasattr(shapes, "use_duck_shape"):
        return contextlib.nullcontext()
    return shapes.patch(use_duck_shape=False)  # type: ignore[attr-defined]  # install_config_module adds it


def _options() -> dict[str, Any]:
    """Inductor's options for the fused functions: Triton without fused multiply-adds (``emulate_precision_casts``),
    which would round ``a * b + c`` once where the eager ops round twice; Inductor's C++ compiles with
    ``-ffp-contract=off`` already. Torch releases without the option have no such switch. And C++ kernels that take
    their OpenMP thread count when they run (``cpp.dynamic_threads``), as torch's own ops do: Inductor otherwise
    writes ``torch.get_num_threads()`` at compile time into the kernel whenever it differs from ``os.cpu_count()``
    (a machine with hyperthreads: torch counts physical cores), and gpufeed's choice of threads on a busy machine
    (NOTE [ Torch's threads on a busy machine ] in gpufeed.threads) would not reach them."""
    import torch._inductor.config as inductor

    options: dict[str, Any] = {"emulate_precision_casts": True} if hasattr(inductor, "emulate_precision_casts") else {}
    if hasattr(inductor.cpp, "dynamic_threads"):
        options["cpp.dynamic_threads"] = True
    return options


def fused(
    op: str, cost: str, static: Mapping[int, tuple[int, ...]] | None = None
) -> Callable[[Callable[..., Any]], _Fused]:
    """Decorator: the function runs compiled or raises :class:`NotCompiled` (see NOTE [ Compiled ops ]). ``op``
    names it for a person, ``cost`` says what its eager code gives and costs (for the warning where no compiler
    runs); ``static``: the sizes compiled as constants, ``{argument's position: its dimensions}`` (a count of
    channels or taps: one symbol fewer to guard, loops unrolled)."""
    return lambda fn: _Fused(fn, op, cost, static or {})
