"""Fused kernels: an op's pixel arithmetic compiled once into a loop or two over the batch.

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
  divide by as reciprocals come in as tensors. One exception, said where it is: the resize's eager code is other
  arithmetic (matrices; .resample), one level apart on a pixel in 10**4; so the resize runs a batch of one as two,
  compiled, and a sample's pixels do not depend on its batch.
- When: on first use per device type. Compiling takes seconds (the compiler's first start on the 2-core machine:
  about 15-25 s for ColorJitter's four adjustments; Inductor keeps its output on disk, so a later process takes a
  second or two). A DeviceLoader makes that first call at construction (its transform's run on two samples),
  never mid-epoch; accelerate's dry run on the CPU does not compile (:func:`eager`), so a GPU loader compiles
  for its GPU only. Sizes equal by chance at that first call are kept apart (no duck shapes), so that the next
  batch size does not recompile.
- What runs instead: a batch with a dimension of size 0 or 1 (torch.compile specialises on those sizes: a last
  batch of one sample would recompile mid-epoch for one sample's work), ``GPUFEED_COMPILE=0`` (read at each
  call) or ``TORCH_COMPILE_DISABLE=1``, a block under :func:`eager`, and a device whose compiler failed (no C++
  compiler, no Triton: one warning naming the cost), and a function compiled for :data:`VERSIONS` kinds of
  batch already (one warning) raise :class:`NotCompiled`, and the op runs its eager code: the same pixels (the
  resize: see above).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["NotCompiled", "compile_times", "compiled_since", "compiling", "eager", "fused"]

_EAGER = contextvars.ContextVar("gpufeed_eager", default=False)
VERSIONS = 64  # versions of one fused function a process may compile (a kind of batch each), then its eager ops
_FAILED: set[str] = set()  # device types whose compiler failed: their ops run eager from then on
_SECONDS: dict[tuple[str, str], float] = {}  # (op, device type) -> seconds its first calls took, compiling


def compile_times() -> dict[tuple[str, str], float]:
    """Seconds each fused op's first calls took, compiling, per (op, device type): a mark for :func:`compiled_since`."""
    return dict(_SECONDS)


def compiled_since(mark: dict[tuple[str, str], float]) -> str | None:
    """What compiled since ``mark`` (:func:`compile_times` taken before), said for a plan; None if nothing."""
    new = {k: v - mark.get(k, 0.0) for k, v in _SECONDS.items() if v > mark.get(k, 0.0)}
    if not new:
        return None
    done = ", ".join(f"{op} for {kind} in {t:.1f} s" for (op, kind), t in new.items())
    return (
        f"fused kernels compiled: {done} (once per process; Inductor's disk cache makes the next one take a second "
        "or two; GPUFEED_COMPILE=0 runs the eager ops instead)"
    )


class NotCompiled(Exception):
    """The fused function does not run here (see NOTE [ Compiled ops ]): the caller runs its eager code."""


def compiling(device: torch.device | None = None) -> bool:
    """Whether fused functions compile (on ``device``): ``GPUFEED_COMPILE`` is not ``0``, no :func:`eager` block
    is open, torch.compile is not disabled (``TORCH_COMPILE_DISABLE``), and the device's compiler has not
    failed."""
    if _EAGER.get() or os.environ.get("GPUFEED_COMPILE", "1").strip() == "0":
        return False
    if torch._dynamo.config.disable:  # TORCH_COMPILE_DISABLE=1: torch.compile would hand back the function, which
        return False  # written for a compiler runs far slower eager than the op's own eager code
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


class _Fused:
    """``fn`` compiled on first use (see NOTE [ Compiled ops ])."""

    def __init__(self, fn: Callable[..., Any], op: str, cost: str) -> None:
        self.fn, self.op, self.cost = fn, op, cost
        self.compiled: Callable[..., Any] | None = None
        self.full = False  # torch.compile's limit of versions reached: the eager ops from then on

    def __call__(self, x: torch.Tensor, *args: Any) -> Any:
        if not compiling(x.device) or min(x.shape, default=0) < 2 or self.full:
            raise NotCompiled
        first = self.compiled is None
        if first:
            self.compiled = torch.compile(self.fn, dynamic=True, options=_options())
        try:
            start = time.perf_counter()
            # past dynamo's limit of versions of a function it would run the function eager, written for a
            # compiler and far slower than the op's own eager code, without a word: an error here instead
            with _apart(), _limit_raises():
                out = self.compiled(x, *args)  # type: ignore[misc]  # set above
            if first:
                key = (self.op, x.device.type)
                _SECONDS[key] = _SECONDS.get(key, 0.0) + time.perf_counter() - start
            return out
        except _limit_hit() as e:
            self.full = True
            warnings.warn(
                f"gpufeed's fused {self.op} was compiled for {VERSIONS} kinds of batch in this process "
                f"(gpufeed.augment.fusion.VERSIONS); its ops run eager from now on: {self.cost}",
                stacklevel=2,
            )
            raise NotCompiled from e
        except torch._dynamo.exc.BackendCompilerFailed as e:  # no C++ compiler, no Triton
            _FAILED.add(x.device.type)
            cause = e.inner_exception
            warnings.warn(
                f"gpufeed could not compile its fused {self.op} on {x.device.type} ({type(cause).__name__}: "
                f"{str(cause).strip().splitlines()[0][:200] if str(cause).strip() else '-'}); its ops run eager "
                f"from now on: {self.cost}. Install a C++ compiler (CPU) or Triton (GPU), or set "
                "GPUFEED_COMPILE=0 to choose the eager ops without this warning",
                stacklevel=2,
            )
            raise NotCompiled from e


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


def fused(op: str, cost: str) -> Callable[[Callable[..., Any]], _Fused]:
    """Decorator: the function runs compiled or raises :class:`NotCompiled` (see NOTE [ Compiled ops ]). ``op``
    names it for a person, ``cost`` says what its eager code gives and costs (for the warning where no compiler
    runs)."""
    return lambda fn: _Fused(fn, op, cost)
