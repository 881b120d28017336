"""The thread that compiles the fused functions (:mod:`.fusion`) while the eager ops serve.

NOTE [ Compiling in the background ]
- One daemon thread, started at the first compile, runs the queued compiles one after another (dynamo compiles one
  frame at a time in a process anyway: its ``compile_lock``). A daemon, so that a script that ends while a compile
  runs is not held up by it (Inductor writes its cache by renaming finished files: nothing half-written is read).
- Each compile runs in a copy of the context of the call that queued it (``contextvars.copy_context``): torch's
  config overrides are per thread (ContextVars, torch 2.14), so the settings of the caller's thread (the user's
  Inductor options, gpufeed's threads) hold for the compile too.
- It runs on copies of the call's tensors, made in the caller's thread: a loader reuses a chunk's buffers for the
  next chunk (.hostmem), which would change the values under the compile. The marks dynamo reads (static sizes) are
  copied with them.
- Priority: Inductor compiles in this one thread (``compile_threads=1``: no pool of compile processes beside the
  serving). Its nice value is raised by :data:`NICE` (on Linux a thread's own; the C++ compiler it starts inherits
  it), 0 since measured: dynamo and Inductor are Python and need the GIL, which the serving thread takes back every
  few milliseconds, so a niced compile thread starved. ColorJitter's recipe on the 2-core machine
  (benchmarks/compile_wait.py), cold: niced by 10, no takeover after 900 s (1,080 batches served eager, load 7.5);
  not niced, the fused kernels took over after 189 s (195 batches eager, load 3.9-6.3), the first batch at 1.4 s.
- CUDA: the copies are made on the caller's stream; the compile's own stream waits on an event recorded after them,
  and the thread waits for its stream before it drops the copies (their memory would go back to the caller's
  stream while the compiled kernels still read it).
- Exit: a daemon thread that Python stops at its exit inside torch's C++ code aborts the process ("terminate
  called without an active exception", status 134: the thread's stack is unwound through a ``noexcept`` frame). So
  at exit (``atexit``, before Python stops daemon threads) a compile in flight is interrupted by an exception raised
  in its thread, which unwinds it as any Python exception would; the exit waits for that, at most
  :data:`EXIT_WAIT_S` (the exception lands at the thread's next Python instruction: after the C++ compile of one
  kernel at most).
- A process forked while a compile is queued (DataLoader workers) starts with no thread and nothing queued; a
  function whose compile was in flight at the fork runs its eager ops in the child (the same pixels).
"""

from __future__ import annotations

import atexit
import contextvars
import ctypes
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["NICE", "copies", "idle", "run", "submit"]

NICE = 0  # added to the compile thread's nice value (0-19): see the NOTE for why not more

_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_state = threading.Condition()
_pending = 0
_thread: threading.Thread | None = None
EXIT_WAIT_S = 60.0  # the longest an exit waits for a compile in flight to stop
_running = False  # a compile is running in the thread
_forks_reset = False  # the fork handler registered (once per process, at the first compile: not at import)


class Copies:
    """A call's arguments copied for the compile, and on CUDA the event after the copies (see the NOTE)."""

    def __init__(self, args: tuple) -> None:
        self.args = pytree.tree_map_only(torch.Tensor, _copy, args)
        cuda = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor) and t.is_cuda]
        self.event: torch.cuda.Event | None = None
        self.device = cuda[0].device if cuda else None
        if cuda:
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(self.device))


def copies(args: tuple) -> Copies:
    """``args`` with every tensor copied (see NOTE [ Compiling in the background ])."""
    return Copies(args)


def _copy(t: torch.Tensor) -> torch.Tensor:
    out = t.clone()
    for name, value in vars(t).items():  # the marks dynamo reads: _dynamo_static_indices and the like
        if name.startswith("_dynamo"):
            setattr(out, name, value)
    return out


def run(fn: Callable[..., Any], given: Copies | tuple, args: tuple) -> Any:
    """``fn(*args)``: in the foreground (``given`` the caller's arguments) as it is; in the compile thread (``given``
    the :class:`Copies` that ``args`` are made of) with Inductor in this thread, and on CUDA on its own stream."""
    if not isinstance(given, Copies):
        return fn(*args)
    import torch._inductor.config as inductor

    with inductor.patch(compile_threads=1):
        if given.event is None:
            return fn(*args)
        stream = torch.cuda.Stream(given.device)
        stream.wait_event(given.event)
        with torch.cuda.stream(stream):
            out = fn(*args)
        stream.synchronize()
        return out


def submit(job: Callable[[], None], device: torch.device) -> None:
    """Queue ``job`` for the compile thread, to run in a copy of the caller's context."""
    global _pending, _thread, _forks_reset
    context = contextvars.copy_context()
    with _state:
        _pending += 1
        if _thread is None or not _thread.is_alive():
            if not _forks_reset:
                if hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=_after_fork)
                atexit.register(_stop)
                _forks_reset = True
            _thread = threading.Thread(target=_loop, name="gpufeed-compile", daemon=True)
            _thread.start()
    _jobs.put(lambda: context.run(job))


def idle(timeout: float | None = None) -> bool:
    """Wait until no compile is queued or running; False if ``timeout`` seconds passed first."""
    with _state:
        return _state.wait_for(lambda: _pending == 0, timeout)


class _Exiting(BaseException):
    """Raised in the compile thread at the interpreter's exit (see the NOTE): no ``except Exception`` stops it."""


def _loop() -> None:
    global _pending, _running
    _lower_priority()
    while True:
        job = _jobs.get()
        _running = True
        try:
            job()  # a compile's own errors are its record's (.fusion): nothing reaches here but a bug, or the exit
        except _Exiting:
            return
        finally:
            _running = False
            with _state:
                _pending -= 1
                _state.notify_all()


def _stop() -> None:
    """At exit: a compile in flight interrupted (see NOTE [ Compiling in the background ])."""
    thread = _thread
    if thread is None or not thread.is_alive() or not _running or thread.ident is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Exiting))
    thread.join(EXIT_WAIT_S)


def _lower_priority() -> None:
    if not hasattr(os, "setpriority"):  # not on Windows
        return
    me = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + NICE))
    except OSError:  # a sandbox that refuses it: the compile runs at the caller's priority
        pass


def _after_fork() -> None:
    global _jobs, _state, _pending, _thread
    _jobs, _state, _pending, _thread = queue.SimpleQueue(), threading.Condition(), 0, None
