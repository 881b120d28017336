"""Converters of torchvision's colour and per-pixel random ops: ColorJitter, the per-sample coin ops (solarize,
posterize, autocontrast, equalize, invert, sharpness, grayscale), Grayscale and GaussianBlur, read at their place
in the pipeline (:mod:`.state`); entries of :data:`gpufeed.pipeline.translate.CONVERTERS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ... import augment as A
from . import refusals
from .auto import V2_LEVEL_NOTE
from .state import State, is_v2, pil_note

__all__ = ["PIL_BOUNDS", "blur", "color_jitter", "grayscale", "per_sample"]


# The largest difference, in uint8 intensity levels, between torchvision's PIL kernel and the
# tensor kernel gpufeed batches, per ColorJitter adjustment; measured on 4,608 random 32x32 images
# (noise, smooth, dark) with factors over [0, 3] (hue [-0.5, 0.5]); tests/augment/test_color.py
# re-measures them. Brightness agrees exactly; jitter with several adjustments can compound these.
PIL_BOUNDS = {"brightness": 0, "contrast": 3, "saturation": 2, "hue": 18}


def color_jitter(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``ColorJitter``, with notes on where its kernels and gpufeed's differ (measured)."""
    jitter = A.ColorJitter(op.brightness, op.contrast, op.saturation, op.hue)
    if not s.pil and is_v2(op) and any(getattr(jitter, k) is not None for k in ("contrast", "saturation", "hue")):
        s.notes.append(
            "v2's ColorJitter rounds its grayscale and HSV steps differently from v1's kernels, which gpufeed "
            "batches: within 1 intensity level per adjustment (measured; contrast, saturation and hue can add up "
            "to 2)"
        )
    if s.dtype in (torch.float16, torch.bfloat16):
        s.notes.append(
            f"ColorJitter on {s.dtype} images: torchvision computes in that dtype, gpufeed in float32 (up to 3 "
            "levels apart, the half-precision rounding); put the conversion after ColorJitter to match exactly"
        )
    if s.pil:
        enabled = {k: v for k, v in PIL_BOUNDS.items() if getattr(jitter, k) is not None and v > 1}
        if enabled:
            bounds = ", ".join(f"{k} {v}" for k, v in enabled.items())
            s.notes.append(
                "ColorJitter runs on PIL images in your pipeline, through PIL's kernels; gpufeed batches torchvision's "
                f"tensor kernels, which differ from PIL's by up to {bounds} intensity levels (of 255; measured per "
                "adjustment, several can add up). Put ToTensor/PILToTensor before it to train on exactly what "
                "gpufeed computes"
            )
    return jitter


def per_sample(
    cls: Any, *fields: str, check: Callable[[Any, torch.dtype, bool], None] | None = None
) -> Callable[[Any, State], A.BatchTransform]:
    """The converter of a per-sample coin op ``cls`` taking ``p`` and ``fields`` from torchvision's op."""

    def convert(op: Any, s: State) -> A.BatchTransform:
        if check is not None:  # what torchvision refuses at this point of the pipeline (.refusals)
            check(op, s.dtype, s.pil)
        pil_note(op, s)
        if cls is A.RandomAutocontrast and is_v2(op) and not s.pil:
            s.notes.append(V2_LEVEL_NOTE.format(name="RandomAutocontrast"))
        extra = {"pil": s.pil} if cls is A.RandomSolarize else {}  # Pillow's LUT compares levels in Python
        return cls(p=op.p, **{f: getattr(op, f) for f in fields}, **extra)

    return convert


def grayscale(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``Grayscale`` after a random op (before one it is cached)."""
    refusals.check_grayscale(op, s.dtype, s.pil)
    pil_note(op, s)
    return A.Grayscale(op.num_output_channels)


def blur(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``GaussianBlur`` as :class:`gpufeed.augment.GaussianBlur`."""
    pil_note(op, s)
    return A.GaussianBlur(tuple(op.kernel_size), tuple(op.sigma))
