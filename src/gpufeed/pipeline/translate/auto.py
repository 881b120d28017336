"""Converter of torchvision's auto-augment family (TrivialAugmentWide, RandAugment, AutoAugment, AugMix),
read at its place in the pipeline (:mod:`.state`); an entry of
:data:`gpufeed.pipeline.translate.CONVERTERS`."""

from __future__ import annotations

from typing import Any

import torch

from ... import augment as A
from ...errors import UnsupportedTransformError
from . import refusals
from .state import State, geometric_fill, interpolation_mode, is_v2

__all__ = ["V2_LEVEL_NOTE", "auto_augment"]


# v2's kernels against v1's (which gpufeed batches) on uint8 tensors: equal for the geometric ops, equalize,
# sharpness, solarize, posterize, grayscale and brightness; within 1 level for autocontrast, contrast and
# saturation (measured on random 20x28 images). v2's auto-augment computes its solarize thresholds as
# 255 x linspace(1, 0): gpufeed takes them the same way for a v2 op (``v2_thresholds``).
V2_LEVEL_NOTE = (
    "v2's {name} computes autocontrast, contrast and saturation with kernels that round differently from v1's, "
    "which gpufeed batches: within 1 intensity level (measured); its solarize thresholds are taken as v2 takes "
    "them (255 x a 0-1 table), so they match"
)


def auto_augment(op: Any, s: State) -> A.BatchTransform:
    """torchvision's TrivialAugmentWide, RandAugment, AutoAugment or AugMix, batched on uint8 images."""
    name = type(op).__name__
    mode = interpolation_mode(op)
    if s.dtype != torch.uint8:
        if is_v2(op):  # v2 runs its ops on float images too (posterize and equalize as floats): not batched here
            raise UnsupportedTransformError(
                f"{op!r} comes after a conversion to {s.dtype}: torchvision v2 runs {name} on float images, gpufeed "
                "batches it on uint8 only; put it before ToDtype, or pass fallback='prefetch'"
            )
        raise refusals.refusal(
            op,
            s.dtype,
            s.pil,
            "'Only torch.uint8 image tensors are supported' on every sample that draws Posterize or Equalize, and "
            "'Threshold should be less than bound of img.' on every Solarize",
            "put it before ToTensor/ConvertImageDtype",
        )
    if name == "RandAugment":
        refusals.check_magnitude(op, s.dtype, s.pil)
    fill = geometric_fill(op, s)
    out: A.BatchTransform
    v2 = is_v2(op)
    # On PIL images torchvision's _apply_op runs PIL's kernels: gpufeed computes those (pil=True), except for
    # AugMix, which turns a PIL image into a tensor and runs tensor kernels.
    pil = s.pil and name != "AugMix"
    if name == "TrivialAugmentWide":
        out = A.TrivialAugmentWide(op.num_magnitude_bins, fill, mode, v2_thresholds=v2, pil=pil)
    elif name == "AugMix":
        out = A.AugMix(op.severity, op.mixture_width, op.chain_depth, float(op.alpha), bool(op.all_ops), fill, mode)
    elif name == "RandAugment":
        out = A.RandAugment(op.num_ops, op.magnitude, op.num_magnitude_bins, fill, mode, v2_thresholds=v2, pil=pil)
    else:
        out = A.AutoAugment(getattr(op.policy, "value", op.policy), fill, mode, v2_thresholds=v2, pil=pil)
    if is_v2(op) and not s.pil:
        s.notes.append(V2_LEVEL_NOTE.format(name=name))
    return out
