"""What a converter knows at an op's place in the user's pipeline, and the readings every converter shares.

The state (value space, image size, PIL or tensor) that :func:`gpufeed.pipeline.translate.build_batched` carries
from op to op; how a fill, an interpolation and torchvision's v2-ness read at that place; and the measured
differences between torchvision's PIL kernels and the tensor kernels gpufeed batches, stated as plan notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import UnsupportedTransformError

__all__ = [
    "NEAREST_MODES",
    "PIL_OP_DIFFERENCE",
    "State",
    "fill_or_none",
    "geometric_fill",
    "interpolation_mode",
    "is_v2",
    "nearest_only",
    "padding_fill",
    "pil_note",
]


@dataclass
class State:
    """What the device part knows while converting: value space, image size, PIL or tensor."""

    dtype: torch.dtype  # dtype of the data at this point (uint8 pixels or floating)
    size: tuple[int, int]  # (height, width) at this point
    pil: bool = False  # the user's pipeline has PIL images at this point
    tv_image: bool = False  # ... or a v2 tv_tensors.Image (after ToImage), which v2's fill dicts key on
    tensor: bool = False  # known to be a tensor (after a conversion; before one it may be a PIL image or an ndarray)
    channels: int | None = None  # the images' channel count, when the caller knows it
    mode: str | None = None  # the PIL images' mode, when the dataset yields PIL images (.modes)
    notes: list[str] = field(default_factory=list)


NEAREST_MODES = ("P", "1")  # PIL modes Pillow resamples by nearest, whatever interpolation it is asked for


def nearest_only(mode: str | None) -> bool:
    """Whether Pillow resamples PIL images of ``mode`` by nearest whatever the interpolation (palette, 1-bit), as a
    rotation, an affine map or a perspective of them then computes (:mod:`.modes`)."""
    return mode in NEAREST_MODES


def is_v2(op: Any) -> bool:
    """Whether ``op`` is one of torchvision v2's transforms (``torchvision.transforms.v2``)."""
    return type(op).__module__.startswith("torchvision.transforms.v2")


def fill_or_none(fill: Any, s: State) -> float | tuple[float, ...] | None:
    """A fill as numbers; v2's dicts go by the image type at this point, else "others"; None (or no entry) stays
    None."""
    if isinstance(fill, dict):
        import PIL.Image
        from torchvision import tv_tensors

        # v2 looks up type(image): PIL.Image.Image for the images PIL's own ops return
        key = tv_tensors.Image if s.tv_image else PIL.Image.Image if s.pil else torch.Tensor
        fill = fill.get(key, fill.get("others"))
    if fill is None:
        return None
    return float(fill) if isinstance(fill, (int, float)) else tuple(float(v) for v in fill)


def padding_fill(fill: Any, s: State) -> float | tuple[float, ...]:
    """A padding fill: none is 0."""
    value = fill_or_none(fill, s)
    return 0.0 if value is None else value


# torchvision's PIL kernels against its tensor kernels (which gpufeed batches) for the per-image random ops,
# measured on 24 noisy, smooth and dark 32x40 images, 3 draws each (levels of 255, share of pixels differing).
# RandomRotation and RandomAffine on PIL images run Pillow's own kernels here (gpufeed.augment.pil): equal.
PIL_OP_DIFFERENCE = {
    "RandomSolarize": None,  # None: equal
    "RandomPosterize": None,
    "RandomEqualize": None,
    "RandomInvert": None,
    "RandomAdjustSharpness": None,
    "GaussianBlur": None,  # torchvision blurs a PIL image as a tensor
    "RandomAutocontrast": "within 1 level (under 2% of the pixels)",
    "RandomGrayscale": "within 1 level (about half the pixels: PIL's conversion rounds, the tensor kernel truncates)",
    "Grayscale": "within 1 level (about half the pixels: PIL's conversion rounds, the tensor kernel truncates)",
    ("RandomPerspective", "nearest"): None,
    (
        "RandomPerspective",
        "bilinear",
    ): "PIL's bilinear samples elsewhere: a third of the pixels differ, by up to 190 levels",
}


def pil_note(op: Any, s: State, mode: str | None = None) -> None:
    """On PIL images the user's pipeline runs PIL's kernels: say what that changes (measured), if anything."""
    if not s.pil:
        return
    name = type(op).__name__
    key: Any = (name, mode) if mode is not None else name
    difference = PIL_OP_DIFFERENCE.get(key, "not measured for this op")
    if difference is None:
        return
    s.notes.append(
        f"{name} runs on PIL images in your pipeline, through PIL's kernels; gpufeed batches torchvision's tensor "
        f"kernels: {difference} (measured). Put PILToTensor before it to train on exactly what gpufeed computes"
    )


def interpolation_mode(op: Any) -> str:
    """``op``'s interpolation as gpufeed's mode name; raise for one gpufeed does not batch."""
    mode = getattr(op.interpolation, "value", op.interpolation)
    if mode not in ("nearest", "bilinear"):
        raise UnsupportedTransformError(
            f"{op!r}: gpufeed batches {type(op).__name__} with nearest or bilinear interpolation, not {mode!r}; "
            "pass fallback='prefetch' to run it per sample"
        )
    return str(mode)


def geometric_fill(op: Any, s: State) -> float | tuple[float, ...] | None:
    """The fill of a rotation, affine map or perspective; None stays None (v2's ``fill=None``: no fill mask, the
    outside is zero-padded before interpolating, which bilinear sampling shows at the border)."""
    return fill_or_none(op.fill, s)
