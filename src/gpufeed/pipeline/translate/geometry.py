"""Converters of torchvision's geometric and region ops: crops, resized crops, rotations, affine maps,
perspective, and erasing (a box per sample), each read at its place in the pipeline (:mod:`.state`).

Each converter takes the torchvision op and the state and returns the gpufeed op; what torchvision refuses at that
place is refused here (:mod:`gpufeed.pipeline.translate.refusals`). They are entries of
:data:`gpufeed.pipeline.translate.CONVERTERS`.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from ... import augment as A
from ...errors import ConfigError, UnsupportedTransformError
from . import refusals
from .state import (
    State,
    fill_or_none,
    geometric_fill,
    interpolation_mode,
    is_v2,
    nearest_only,
    padding_fill,
    pil_note,
)

__all__ = ["affine", "erasing", "perspective", "random_crop", "resized_crop", "rotation"]


def _check_mirror_padding(op: Any, s: State, pads: tuple[int, int, int, int]) -> None:
    """torch pads tensors by reflection only by less than the image's side, symmetrically by up to it (PIL images
    go through numpy, which repeats the mirror): torchvision raises on every sample beyond, so gpufeed refuses."""
    if s.pil or op.padding_mode not in ("reflect", "symmetric"):
        return
    left, top, right, bottom = pads
    for pad, side, axis in ((max(left, right), s.size[1], "width"), (max(top, bottom), s.size[0], "height")):
        if pad > side or (op.padding_mode == "reflect" and pad == side):
            most = side - 1 if op.padding_mode == "reflect" else side
            raise ConfigError(
                f"{op!r} on tensor images of {s.size[0]}x{s.size[1]}: torchvision refuses it on every sample "
                f"(padding {pad} with padding_mode={op.padding_mode!r} along the {axis} of {side}: torch pads by "
                f"{'less than' if op.padding_mode == 'reflect' else 'at most'} the side); use padding <= {most}, "
                "or padding_mode='constant' or 'edge'"
            )


def random_crop(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``RandomCrop`` (v1's or v2's padding order) as :class:`gpufeed.augment.RandomCrop`."""
    h, w = (op.size, op.size) if isinstance(op.size, int) else op.size
    if op.padding is not None:
        p = [op.padding] if isinstance(op.padding, int) else list(op.padding)
        if is_v2(op):  # v2 stores [left, right, top, bottom]
            left, right, top, bottom = op.padding or (0, 0, 0, 0)
        else:
            p = p * 2 if len(p) == 1 else p
            left, top, right, bottom = (p * 2 if len(p) == 2 else p)[:4]
        _check_mirror_padding(op, s, (left, top, right, bottom))
    if is_v2(op):
        # v2 stores padding as [left, right, top, bottom] and pads once, need included.
        left, right, top, bottom = op.padding or (0, 0, 0, 0)
        if op.pad_if_needed:
            dh = max(0, h - (s.size[0] + top + bottom))
            dw = max(0, w - (s.size[1] + left + right))
            top, bottom, left, right = top + dh, bottom + dh, left + dw, right + dw
        crop = A.RandomCrop((h, w), (left, top, right, bottom), False, _crop_fill(op, s), op.padding_mode)
    else:
        crop = A.RandomCrop((h, w), op.padding, op.pad_if_needed, _crop_fill(op, s), op.padding_mode)
    return crop


def _crop_fill(op: Any, s: State) -> float | tuple[float, ...]:
    """The fill torchvision pads with at this point (refusals.crop_fill: casts, clips, refusals); none is 0."""
    if op.padding_mode != "constant" or not (op.padding or op.pad_if_needed):
        return padding_fill(op.fill, s)  # never padded with it: torchvision never reads it
    value = refusals.crop_fill(op, fill_or_none(op.fill, s), s.dtype, s.pil)
    return 0.0 if value is None else value


def erasing(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``RandomErasing`` as :class:`gpufeed.augment.RandomErasing` (refused as torchvision refuses)."""
    refusals.check_erasing(op, s.dtype, s.pil, s.channels)
    value = op.value
    if value is None or value == "random":
        value = "random"
    elif not isinstance(value, (int, float)):
        value = tuple(float(v) for v in value)
        value = value[0] if len(value) == 1 else value
    if s.dtype == torch.uint8 and op.p > 0:
        _erase_in_uint8(op, value)
    return A.RandomErasing(op.p, tuple(op.scale), tuple(op.ratio), value)


def _erase_in_uint8(op: Any, value: Any) -> None:
    """torchvision writes the erase value into a uint8 image with a cast (0.5 becomes 0, 300 becomes 44, "random"
    normal draws truncate): no error, and no value anyone meant. gpufeed refuses it before reading the data, so the
    fallback (torchvision itself) runs it unchanged if asked."""
    values = () if value == "random" else value if isinstance(value, tuple) else (value,)
    bad = value == "random" or any(not (float(v).is_integer() and 0 <= v <= 255) for v in values)
    if bad:
        raise UnsupportedTransformError(
            f"{op!r} erases uint8 pixels with value={value!r}, which torchvision casts into 0-255 (truncating and "
            "wrapping: 0.5 is 0, 300 is 44, -1 is 255): gpufeed does not batch that; give whole levels in 0-255, "
            "erase after ToTensor/ToDtype (values in the float space), or pass fallback='prefetch'"
        )


def resized_crop(op: Any, s: State) -> A.BatchTransform:
    """torchvision's (or timm's) ``RandomResizedCrop`` with the resize kernel the user's pipeline runs here."""
    given = op.interpolation if isinstance(op.interpolation, (tuple, list)) else (op.interpolation,)
    modes = tuple(str(getattr(m, "value", m)) for m in given)
    if "nearest" in modes and s.pil:
        s.notes.append(
            "RandomResizedCrop(nearest) runs on PIL images in your pipeline: PIL's nearest takes the source pixel "
            "under each output pixel's centre, torchvision's tensor kernel (which gpufeed batches) the one at its "
            "corner, so the sampled grid is shifted by up to one source pixel (on noise nearly every pixel differs; "
            "measured): put PILToTensor before it to train on exactly what gpufeed computes"
        )
    if any(mode not in ("bilinear", "bicubic", "nearest") for mode in modes):
        raise UnsupportedTransformError(
            f"{op!r}: gpufeed batches RandomResizedCrop with bilinear, bicubic or nearest interpolation, not "
            f"{' or '.join(modes)}; "
            "use one of those or fallback='prefetch'"
        )
    # PIL's resize always antialiases, whatever antialias= says; the tensor kernel follows the flag (timm's
    # op passes none: torchvision's default, True).
    antialias = s.pil or bool(getattr(op, "antialias", True))
    size = tuple(op.size) if isinstance(op.size, (tuple, list)) else (op.size, op.size)
    mode = modes[0] if len(modes) == 1 else modes
    kernel = _resize_kernel(op, s, modes)
    return A.RandomResizedCrop(size, tuple(op.scale), tuple(op.ratio), antialias, interpolation=mode, kernel=kernel)


def _resize_kernel(op: Any, s: State, modes: tuple[str, ...]) -> str:
    """How the user's pipeline resamples uint8 images at this point (see gpufeed.augment.fixed_point): Pillow's
    integers on PIL images; v2's on uint8 tensors on the CPU, where DataLoader workers run it; else through float
    (v1, and timm's op, which calls v1's functional)."""
    if s.dtype != torch.uint8:
        return "float"
    if s.pil:
        return "pil"
    if not is_v2(op):
        return "float"
    # torchvision v2 (resize_image, _do_native_uint8_resize_on_cpu): bicubic always takes PyTorch's uint8 kernel
    # on the CPU; bilinear only where the CPU has AVX2/AVX512 or is ARM -- the machine this plan is made on.
    native = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")
    return "float" if modes == ("bilinear",) and not native else "torch"


def _warp_mode(op: Any, s: State) -> str:
    """The interpolation the user's pipeline runs here: Pillow's nearest on palette images, whatever was asked."""
    return "nearest" if s.pil and nearest_only(s.mode) else interpolation_mode(op)


def rotation(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``RandomRotation`` (``expand=False`` only) as :class:`gpufeed.augment.RandomRotation`."""
    if op.expand:
        raise UnsupportedTransformError(
            f"{op!r}: expand=True gives every angle its own output size; gpufeed batches expand=False"
        )
    center = tuple(float(c) for c in op.center) if op.center is not None else None
    fill = geometric_fill(op, s)
    return A.RandomRotation(tuple(op.degrees), _warp_mode(op, s), center, fill, pil=s.pil)  # type: ignore[arg-type]


def affine(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``RandomAffine`` as :class:`gpufeed.augment.RandomAffine`."""
    center = tuple(float(c) for c in op.center) if op.center is not None else None
    shear = tuple(op.shear) if op.shear is not None else None
    return A.RandomAffine(
        tuple(op.degrees),
        tuple(op.translate) if op.translate is not None else None,
        tuple(op.scale) if op.scale is not None else None,
        shear,
        _warp_mode(op, s),
        geometric_fill(op, s),
        center,  # type: ignore[arg-type]
        pil=s.pil,
        v2=is_v2(op),
    )


def perspective(op: Any, s: State) -> A.BatchTransform:
    """torchvision's ``RandomPerspective`` as :class:`gpufeed.augment.RandomPerspective`."""
    mode = _warp_mode(op, s)
    pil_note(op, s, mode)
    return A.RandomPerspective(op.distortion_scale, op.p, mode, geometric_fill(op, s))
