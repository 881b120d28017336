"""The crops and flips a ``Compose`` collected, and the ``Normalize`` after them, as one compiled gather on the
device's path.

On the device's path (a GPU; :func:`~gpufeed.augment.paths.device_path` on a CPU) the ops' index maps are small
``(N, H)`` tensors built by a few dozen tiny operations, then one gather, a fill, and Normalize's three passes: 29
kernel launches a batch for RandomCrop + flip + Normalize besides the draws. Compiled (:mod:`.fusion`), the maps'
arithmetic, the gather, the fill and the normalising run in one or two loops. The code is the eager ops' own (the
maps, ``functional.remap``, ``Normalize``'s arithmetic), traced: integer indices and the same float32 operations,
so the pixels are the same bits (tests/augment/test_fusion.py). The host's path keeps its cache-sized chunks
(:mod:`.chunks`), faster on a CPU than one loop over the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import functional as F
from . import geometry as G
from .fusion import NotCompiled, compiling, fused

if TYPE_CHECKING:
    from .transforms import GeometricTransform

__all__ = ["Pending", "fused_moves", "moves"]

# the geometric ops not yet applied, in order: each with its parameters and the (height, width) it drew for
Pending = Sequence[tuple["GeometricTransform", dict[str, Any], int, int]]
Normalizing = tuple[Sequence[float], Sequence[float], bool]  # Normalize's mean, std and reciprocal (float32 out)


def moves(x: torch.Tensor, pending: Pending, normalize: Normalizing | None = None) -> torch.Tensor:
    """``x`` through the ``pending`` ops' composed maps (applied in two reads where two paddings' fills differ, as
    ``Compose`` does), then, for uint8 ``x``, ``Normalize``'s arithmetic (float32 out)."""
    m: G.IndexMap | None = None
    for op, params, h, w in pending:
        step = op.index_map(params, h, w)
        both = m.then(step) if m is not None else step
        if both is None:  # two paddings with different fills cannot share one map
            x = F.remap(x, m)  # type: ignore[arg-type]
            both = step
        m = both
    out = F.remap(x, m) if m is not None else x
    if normalize is None:
        return out
    mean, std, reciprocal = normalize  # functional.normalize's arithmetic on a uint8 batch, off the host's path
    y = F.convert_dtype(out, torch.float32, reciprocal)
    return y.sub_(F.constant(mean, y, "mean")).div_(F.constant(std, y, "std"))


_fused_moves = fused("crops, flips and Normalize", "the same pixels, about 29 more kernel launches a batch")(moves)


def fused_moves(x: torch.Tensor, pending: Pending, normalize: Normalizing | None = None) -> torch.Tensor:
    """:func:`moves` compiled, or :class:`NotCompiled` (before any work) where it does not run so."""
    if not compiling(x.device) or min(x.shape) < 2 or (normalize is not None and x.dtype != torch.uint8):
        raise NotCompiled
    torch._dynamo.mark_static(x, 1)  # the channels, a constant of the loader's
    return _fused_moves(x, pending, normalize)
