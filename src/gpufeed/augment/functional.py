"""Batched image ops with per-sample parameters, as pure functions.

Input is ``(N, C, H, W)``, uint8 or floating, on any device; every parameter tensor has a leading
``N``. No op loops over samples in Python or reads a device value on the host, so on a GPU a
whole batch costs a handful of kernel launches and no synchronisation.

Each op equals the corresponding ``torchvision.transforms.functional`` op applied sample by
sample with the same parameters (the tests check this pixel for pixel).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from ..errors import ConfigError, DataError
from . import chunks as C
from . import geometry as G
from .geometry import PADDING_MODES, Padding
from .paths import host_path

__all__ = [
    "PADDING_MODES",
    "check_batch",
    "constant",
    "convert_dtype",
    "crop",
    "erase",
    "float_constants",
    "hflip",
    "normalize",
    "remap",
    "vflip",
]


def check_batch(x: object, name: str = "batch") -> torch.Tensor:
    """Raise a typed error unless ``x`` is an ``(N, C, H, W)`` uint8 or floating tensor."""
    if not isinstance(x, torch.Tensor):
        raise DataError(f"{name} must be a torch.Tensor of shape (N, C, H, W), got {type(x).__name__}")
    if x.dim() != 4:
        fix = " (add the channel axis: x.unsqueeze(1))" if x.dim() == 3 else ""
        raise DataError(f"{name} must have 4 dims (N, C, H, W), got shape {tuple(x.shape)}{fix}")
    if x.dtype != torch.uint8 and not x.dtype.is_floating_point:
        raise DataError(f"{name} must be uint8 or floating, got dtype={x.dtype}; convert with x.to(torch.uint8)")
    return x


@lru_cache(maxsize=128)
def _cached_constant(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).view(1, -1, 1, 1).to(device)


# What a resize runs after it in one go (RandomResizedCrop.apply_tail): the flips, each an axis ("cols", "rows") and a
# mask per sample, in order; and Normalize's mean, std and reciprocal (float32 out).
Flips = Sequence[tuple[str, torch.Tensor]]
Normalizing = tuple[Sequence[float], Sequence[float], bool]


def constant(values: float | Sequence[float], x: torch.Tensor, name: str = "value") -> torch.Tensor:
    """A per-channel constant shaped ``(1, C, 1, 1)`` on ``x``'s device and dtype, made once.

    Building ``torch.tensor(...)`` on a GPU copies from pageable host memory and synchronises
    the stream; caching keeps that out of the per-batch path. Treat the result as read-only.
    """
    vals = (values,) if isinstance(values, (int, float)) else tuple(values)
    channels = x.shape[1]
    if len(vals) not in (1, channels):
        raise ConfigError(f"{name}={values!r} must be a number or have {channels} values (one per channel)")
    if x.dtype == torch.uint8 and not all(float(v).is_integer() and 0 <= v <= 255 for v in vals):
        raise ConfigError(f"{name}={values!r} must be integers in [0, 255] for uint8 images (pixel values)")
    if torch.compiler.is_compiling():  # in a fused function (.moves): a constant of its graph, no cache to trace
        return torch.tensor([float(v) for v in vals], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return _cached_constant(tuple(float(v) for v in vals), x.device, x.dtype)


def float_constants(
    mean: Sequence[float], std: Sequence[float], channels: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalize's mean and std as float32 constants for uint8 images of ``channels`` on ``device`` (None: the CPU;
    made once)."""
    like = torch.empty((0, channels), dtype=torch.float32, device=device)  # the constants' dtype, device, channels
    return constant(mean, like, "mean"), constant(std, like, "std")


def crop(
    x: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    size: tuple[int, int],
    padding: Padding | Sequence[Padding] = (0, 0, 0, 0),
    fill: float | Sequence[float] = 0,
    padding_mode: str = "constant",
) -> torch.Tensor:
    """Pad each image by ``padding`` (left, top, right, bottom), then crop ``size`` at (top, left).

    ``top`` and ``left`` are per-sample offsets into the *padded* image, as torchvision's
    ``F.crop(F.pad(img, padding, fill, padding_mode), top, left, *size)``. ``padding`` may also be
    a list of such 4-tuples applied one after the other. The padded image is never materialised:
    one gather reads the source through an index map.
    """
    return remap(x, G.crop_map(top, left, size, (x.shape[2], x.shape[3]), padding, padding_mode, fill))


def remap(x: torch.Tensor, m: G.IndexMap) -> torch.Tensor:
    """Read ``x`` through the index map ``m`` (crops and flips, see :mod:`gpufeed.augment.geometry`)."""
    return G.remap(x, m, constant(m.fill, x, "fill") if m.fill is not None else None)


def hflip(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror the width axis of the samples where ``mask`` (bool, shape ``(N,)``) is true."""
    return remap(x, G.flip_map(mask, x.shape[3], "cols"))


def vflip(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror the height axis of the samples where ``mask`` (bool, shape ``(N,)``) is true."""
    return remap(x, G.flip_map(mask, x.shape[2], "rows"))


def convert_dtype(x: torch.Tensor, dtype: torch.dtype, reciprocal: bool = False) -> torch.Tensor:
    """Change dtype with torchvision's ``convert_image_dtype`` scaling.

    uint8 -> float divides by 255 (``reciprocal=True`` multiplies by ``1/255`` instead, as
    ``transforms.v2.ToDtype`` does: the two differ in the last bit for some values); float ->
    uint8 multiplies by ``256 - 1e-3`` and truncates (torchvision's rule); float -> float casts.
    """
    if x.dtype == dtype:
        return x
    if x.dtype == torch.uint8 and dtype.is_floating_point:
        return x.to(dtype).mul_(1.0 / 255) if reciprocal else x.to(dtype).div_(255)
    if x.dtype.is_floating_point and dtype == torch.uint8:
        return x.mul(255 + 1.0 - 1e-3).to(dtype)
    if x.dtype.is_floating_point and dtype.is_floating_point:
        return x.to(dtype)
    raise ConfigError(f"dtype={dtype} is not supported from {x.dtype}; use torch.uint8 or a floating dtype")


def normalize(
    x: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    dtype: torch.dtype = torch.float32,
    reciprocal: bool = False,
) -> torch.Tensor:
    """``(x - mean) / std`` per channel; uint8 input is first divided by 255, as ``ToTensor`` does.

    ``reciprocal``: scale uint8 by ``* (1/255)`` as ``transforms.v2.ToDtype`` does (see :func:`convert_dtype`).

    The arithmetic runs in torchvision's order: in the input's dtype for float input (as
    torchvision's Normalize does, half precision included), in float32 for uint8, so the result
    equals ``F.normalize(F.to_tensor(img), mean, std)`` bit for bit before the final cast.
    """
    work = x.dtype if x.dtype.is_floating_point else torch.float32
    if host_path(x) and x.dtype == torch.uint8:  # a chunk at a time in the cache (gpufeed.augment.chunks)
        return C.normalize_chunked(x, *float_constants(mean, std, x.shape[1]), reciprocal, dtype)
    y = convert_dtype(x, work, reciprocal)
    m, s = constant(tuple(mean), y, "mean"), constant(tuple(std), y, "std")
    # In place on the converted copy (a new tensor of a batch's size costs as much as the arithmetic), never
    # on the caller's tensor.
    y = y.sub_(m) if y is not x else y.sub(m)
    return y.div_(s).to(dtype)


def erase(
    x: torch.Tensor,
    mask: torch.Tensor,
    top: torch.Tensor,
    left: torch.Tensor,
    height: torch.Tensor,
    width: torch.Tensor,
    value: torch.Tensor,
) -> torch.Tensor:
    """Set the box ``[top, top+height) x [left, left+width)`` to ``value`` where ``mask`` is true.

    All box tensors have shape ``(N,)``. ``value`` broadcasts against ``(N, C, H, W)``: a scalar,
    ``(1, C, 1, 1)`` per channel (see :func:`constant`), or a full tensor for random values.
    """
    n, _, h, w = x.shape
    r = torch.arange(h, device=x.device).view(1, h)
    q = torch.arange(w, device=x.device).view(1, w)
    in_rows = (r >= top.view(n, 1)) & (r < (top + height).view(n, 1))
    in_cols = (q >= left.view(n, 1)) & (q < (left + width).view(n, 1))
    box = in_rows.view(n, 1, h, 1) & in_cols.view(n, 1, 1, w) & mask.view(n, 1, 1, 1)
    return torch.where(box, value.to(x.dtype), x)
