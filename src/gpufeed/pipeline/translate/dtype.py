"""Converters of torchvision's conversions: ToTensor, PILToTensor, ConvertImageDtype, ToDtype and Normalize,
which move to the device (a stored uint8 image becomes the float tensor the original pipeline made); entries of
:data:`gpufeed.pipeline.translate.CONVERTERS`."""

from __future__ import annotations

from typing import Any

import torch

from ... import augment as A
from ...errors import ConfigError, UnsupportedTransformError
from . import refusals
from .state import State, is_v2

__all__ = ["normalize", "to_dtype", "to_float", "to_tensor"]


def to_float(
    s: State, dtype: torch.dtype = torch.float32, scale: bool = True, reciprocal: bool = False
) -> A.BatchTransform | None:
    """A conversion to float ``dtype`` scaled by 1/255 from uint8 (``reciprocal``: v2's ``* (1/255)``), or None."""
    if not scale:
        raise UnsupportedTransformError(
            "ToDtype(..., scale=False) keeps 0-255 values in a float tensor, which gpufeed does not batch; "
            "use ToDtype(torch.float32, scale=True) (ToTensor's /255)"
        )
    if s.dtype == dtype:
        return None
    was_uint8, s.dtype = s.dtype == torch.uint8, dtype
    return A.ConvertDtype(dtype, reciprocal=reciprocal and was_uint8)


def to_dtype(op: Any, s: State) -> A.BatchTransform | None:
    """torchvision's ``ConvertImageDtype`` / ``ToDtype``: a conversion on the device, or None if none."""
    if s.pil:  # a PIL image here: v1's refuses it, v2's passes it through unchanged (no scaling)
        if not is_v2(op):
            raise refusals.refusal(
                op, s.dtype, s.pil, "TypeError: 'Input img should be Tensor Image'", "put PILToTensor before it"
            )
        return None
    dtype = op.dtype
    if isinstance(dtype, dict):
        from torchvision import tv_tensors

        dtype = dtype.get(tv_tensors.Image, dtype.get(torch.Tensor, dtype.get("others")))
    if dtype is None or dtype == s.dtype:
        return None
    if dtype == torch.uint8:
        if not getattr(op, "scale", True):
            raise UnsupportedTransformError(
                f"{op!r}: a cast to uint8 without scaling (scale=False) is not batched; use scale=True or "
                "fallback='prefetch'"
            )
        s.dtype = torch.uint8
        return A.ConvertDtype(torch.uint8)
    # v1 ConvertImageDtype divides by 255; v2 ToDtype multiplies by 1/255 (last-bit differences).
    return to_float(s, dtype, scale=getattr(op, "scale", True), reciprocal=is_v2(op))


def to_tensor(op: Any, s: State, name: str) -> A.BatchTransform | None:
    """torchvision's ``ToTensor`` / ``PILToTensor`` (``name``): ToTensor's /255 on the device, or None."""
    refusals.check_to_tensor(op, name, s.dtype, s.tensor)  # v1's take PIL images (and ndarrays), not tensors
    if name == "PILToTensor" or s.dtype.is_floating_point or s.tensor:  # v2's pass a tensor through; float arrays
        return None  # stay as they are
    return to_float(s)


def normalize(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``Normalize`` as :class:`gpufeed.augment.Normalize`, in the dtype at this point."""
    if s.pil:
        said = (
            "TypeError: 'Normalize() does not support PIL images.'"
            if is_v2(op)
            else "TypeError: \"img should be Tensor Image. Got <class 'PIL.Image.Image'>\""
        )
        raise refusals.refusal(op, s.dtype, s.pil, said, "put ToTensor (or PILToTensor and ToDtype) before it")
    if not s.dtype.is_floating_point:
        raise ConfigError(
            f"{op!r} comes before any ToTensor/ToDtype(scale=True): torchvision itself rejects Normalize on uint8 "
            "images; put ToTensor() first"
        )
    refusals.check_normalize(op, s.dtype)
    return A.Normalize(tuple(op.mean), tuple(op.std), dtype=s.dtype)
