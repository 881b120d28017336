"""The crops and flips a ``Compose`` collected, and the ``Normalize`` after them, as one compiled gather on the
device's path.

On the device's path (a GPU; :func:`~gpufeed.augment.paths.device_path` on a CPU) the ops' index maps are small
``(N, H)`` tensors built by a few dozen tiny operations, then one gather, a fill, and Normalize's three passes: 29
kernel launches a batch for RandomCrop + flip + Normalize besides the draws. Compiled (:mod:`.fusion`), the maps'
arithmetic, the gather, the fill and the normalising run in one or two loops. The code is the eager ops' own (the
maps, ``functional.remap``, ``Normalize``'s arithmetic), traced: integer indices and the same float32 operations
(the mean and std come in as tensors: a one-value constant inside the graph would be a scalar, whose division a GPU
compiler turns into a multiplication), so the pixels are the same bits on the CPU (tests/augment/test_fusion.py; on a
GPU, benchmarks/gpu_check.py compares them). The host's path keeps its cache-sized chunks (:mod:`.chunks`), faster
on a CPU than one loop over the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from . import functional as F
from . import geometry as G
from .fusion import NotCompiled, compiling, fused

__all__ = ["Pending", "compose", "fused_moves", "moves"]


class _Move(Protocol):  # a crop or a flip (transforms.GeometricTransform)
    def index_map(self, params: dict[str, Any], height: int, width: int) -> G.IndexMap: ...


# the geometric ops not yet applied, in order: each with its parameters and the (height, width) it drew for
Pending = Sequence[tuple[_Move, dict[str, Any], int, int]]


def compose(
    x: torch.Tensor, pending: Pending, remap: Callable[[torch.Tensor, G.IndexMap], torch.Tensor]
) -> tuple[torch.Tensor, G.IndexMap]:
    """The ``pending`` ops' maps composed into one, and ``x``: read through the maps composed so far (by ``remap``)
    where two paddings' fills differ and cannot share one map, else as it is."""
    m: G.IndexMap | None = None
    for op, params, h, w in pending:
        step = op.index_map(params, h, w)
        both = m.then(step) if m is not None else step
        if both is None:
            x = remap(x, m)  # type: ignore[arg-type]
            both = step
        m = both
    assert m is not None, "nothing pending"
    return x, m


def moves(
    x: torch.Tensor, pending: Pending, mean: torch.Tensor | None = None, std: torch.Tensor | None = None,
    reciprocal: bool = False,
) -> torch.Tensor:  # fmt: skip
    """``x`` through the ``pending`` ops (:func:`compose`, ``functional.remap``), then, given Normalize's ``mean`` and
    ``std`` (``(1, C, 1, 1)`` float32), its arithmetic on the uint8 result (float32 out)."""
    x, m = compose(x, pending, F.remap)
    out = F.remap(x, m)
    if mean is None or std is None:
        return out
    return F.convert_dtype(out, torch.float32, reciprocal).sub_(mean).div_(std)  # functional.normalize's, off the host


# the channels a constant of the loader's
_fused_moves = fused(
    "crops, flips and Normalize", "the same pixels, about 29 more kernel launches a batch", static={0: (1,)}
)(moves)


def fused_moves(x: torch.Tensor, pending: Pending, normalize: F.Normalizing | None = None) -> torch.Tensor:
    """:func:`moves` compiled, or :class:`NotCompiled` (before any work) where it does not run so."""
    if not compiling(x.device) or min(x.shape) < 2 or (normalize is not None and x.dtype != torch.uint8):
        raise NotCompiled
    if normalize is None:
        return _fused_moves(x, pending)
    mean, std, reciprocal = normalize
    return _fused_moves(x, pending, *F.float_constants(mean, std, x.shape[1], x.device), reciprocal)
