"""PIL image modes: what torchvision does with an image of each mode at an op's place before the first tensor
conversion, and whether gpufeed's batched op, run on what is stored of that image (``pil_to_tensor``: a palette
image's indices, a CMYK image's four bands), computes the same.

A dataset whose loader returns ``Image.open(f)`` without ``.convert("RGB")`` hands the pipeline images of the file's
mode. On an "L" or "RGB" image every batched op computes what torchvision computes (LA and RGBA:
:mod:`gpufeed.augment.channels` for the colour ops). On other modes the PIL kernels do other things, measured with
torchvision 0.29 and Pillow 12 (tests/augment/test_modes.py re-measures each):

- ops that only move pixels (flips, RandomCrop and its padding, the conversions) move the stored values as PIL moves
  the image's: the same on every mode;
- PIL resamples a palette ("P") image by nearest whatever the interpolation (rotations, affine maps and perspective
  then batch as nearest, exactly; a resize by nearest samples other source pixels than gpufeed's); LA and RGBA by
  premultiplied alpha (``convert("RGBa")``), which gpufeed's kernels do not; the 8-bit bands of CMYK, YCbCr and HSV
  one by one, as RGB's (LAB's a and b bands are signed: resized and filled otherwise);
- a colour op either raises (a palette image has no colours to blend: "image has wrong mode"; ImageOps takes L and
  RGB only) or computes through the mode's own conversions (a palette image's grey is its palette colours' luma; a
  YCbCr image's is its Y band), which the stored values do not hold.

What torchvision refuses is refused here with its words (no fallback runs it either); what it computes and gpufeed
does not batch is an UnsupportedTransformError, the fallback's case; both name the sample, the mode and the fix
(``.convert("RGB")`` in the loader). Nothing is converted silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError, UnsupportedTransformError
from .state import NEAREST_MODES as _NEAREST

__all__ = ["BATCHED_MODES", "check_modes", "mode_bound", "mode_fix", "verdict"]

BATCHED_MODES = ("L", "RGB", "LA", "RGBA")  # every op as gpufeed batches it (alpha by gpufeed.augment.channels)
_ALPHA = ("LA", "RGBA")  # resampled premultiplied by Pillow
_BANDS = ("CMYK", "YCbCr", "HSV")  # 8-bit bands, resampled one by one as RGB's (LAB's a and b are signed)
_NAMES = {"P": "palette", "PA": "palette with alpha", "1": "1-bit", "F": "32-bit float", "I": "32-bit integer"}

# Ops that move pixels without computing new values, and conversions: the same on any mode.
_MOVES = (
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "RandomCrop",
    "ToTensor",
    "PILToTensor",
    "ToImage",
    "MaybeToTensor",
    "MaybePILToTensor",
    "ToPureTensor",
    "Identity",
    "ConvertImageDtype",
    "ToDtype",
    "Normalize",
    "RandomErasing",
    "TimmRandomErasing",
)
_CONTAINERS = ("RandomApply", "RandomChoice", "RandomOrder")
_TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "MaybeToTensor", "MaybePILToTensor")
_RESIZES = ("RandomResizedCrop", "RandomResizedCropAndInterpolation")
_WARPS = ("RandomRotation", "RandomAffine", "RandomPerspective")
_IMAGE_OPS = ("RandomSolarize", "RandomPosterize", "RandomAutocontrast", "RandomEqualize", "RandomInvert")
_AUTO = ("TrivialAugmentWide", "RandAugment", "AutoAugment", "TimmRandAugment", "TimmAutoAugment")
_WRONG_MODE = "ValueError: 'image has wrong mode'"


def _interpolation(op: Any) -> tuple[str, ...]:
    given = getattr(op, "interpolation", "bilinear")
    given = given if isinstance(given, (tuple, list)) else (given,)
    return tuple(str(getattr(m, "value", m)) for m in given)


def _jitters(op: Any) -> bool:
    """A ColorJitter that blends (brightness, contrast or saturation): ImageEnhance, which a palette refuses."""
    return any(getattr(op, k, None) is not None for k in ("brightness", "contrast", "saturation"))


def _fills(op: Any) -> bool:
    """A RandomCrop that pads with its fill (constant padding)."""
    return getattr(op, "padding_mode", "constant") == "constant" and bool(op.padding or op.pad_if_needed)


def _refused(name: str, op: Any, mode: str) -> str | None:
    """torchvision's (or Pillow's) words where it raises for ``op`` on an image of ``mode`` (measured), else None."""
    bands = {"PA": 2, "CMYK": 4}.get(mode)  # counted as channels: torchvision's checks of 1 or 3 take them so
    if name in _AUTO:
        return f"{_WRONG_MODE} or OSError: 'not supported for mode {mode}' on every sample that draws a colour op"
    if bands and name == "RandomGrayscale":
        return "ValueError: 'num_output_channels should be either 1 or 3'"
    if bands and name == "AugMix":
        return f"TypeError: 'Input image tensor permitted channel values are [1, 3], but found {bands}'"
    if mode == "LAB" and name in ("ColorJitter", "Grayscale", "RandomGrayscale", "RandomAdjustSharpness"):
        return "ValueError: 'conversion from LAB to RGB not supported'"
    if name == "ColorJitter" and _jitters(op) and mode in ("P", "PA", "F", "I", "I;16", "1"):
        return _WRONG_MODE
    if name == "RandomAdjustSharpness" and mode in ("P", "PA", "F", "I", "I;16", "1"):
        return "ValueError: 'cannot filter palette images'" if mode == "P" else _WRONG_MODE
    if name in _IMAGE_OPS:
        if mode == "P":
            return "NotImplementedError: 'mode P support coming soon'" if name == "RandomAutocontrast" else None
        if not (mode == "1" and name == "RandomInvert"):
            return f"OSError: 'not supported for mode {mode}' (Pillow's ImageOps)"
    if name == "GaussianBlur" and mode in ("P", "PA", "1", "I;16", "LAB"):
        return f"ValueError: 'Incorrect mode ({mode})' (to_pil_image of the blurred tensor)"
    if name == "AugMix" and mode in ("1", "I", "I;16", "F"):
        return "TypeError: 'Only torch.uint8 image tensors are supported' on every sample that draws Posterize"
    return None


def verdict(name: str | None, op: Any, mode: str) -> tuple[str, str] | None:
    """What happens to ``op`` (torchvision's op named ``name``) on a PIL image of ``mode``: None where gpufeed's batched
    op computes what torchvision computes; ``("refused", words)`` where torchvision raises; ``("differs", why)`` where
    it computes what gpufeed does not batch.

    Example:
        >>> import torchvision.transforms as T
        >>> verdict("ColorJitter", T.ColorJitter(0.4), "P")
        ('refused', "ValueError: 'image has wrong mode'")
        >>> verdict("RandomRotation", T.RandomRotation(10), "P") is None   # nearest, as Pillow resamples P
        True
    """
    if mode == "LAB" and (name in _WARPS or (name == "RandomCrop" and _fills(op))):
        return ("differs", "Pillow fills a LAB image's a and b bands as signed values (a fill of 0 stores 128)")
    if mode in ("L", "RGB") or name in _MOVES or name in _CONTAINERS:
        return None
    if name is None:
        return ("differs", "an op gpufeed does not know")
    if mode in _ALPHA:
        resamples = name in _RESIZES or name in _WARPS
        if resamples and _interpolation(op) != ("nearest",):
            why = (
                f"Pillow resamples {mode} images with premultiplied alpha (convert('{mode[:-1]}a')), gpufeed's kernels "
                "each band alone: up to 120 levels apart at transparent edges (measured)"
            )
            return ("differs", why)
        return None  # the colour ops: gpufeed.augment.channels, by the channel count
    if mode in _NEAREST and name in _WARPS:
        return None  # batched as nearest (nearest_only), exactly
    if mode in _BANDS and (name in _RESIZES or name in _WARPS):
        return None
    if mode == "P" and name == "AugMix":
        return None  # torchvision turns the image into a tensor (its indices) and runs the tensor kernels
    said = _refused(name, op, mode)
    if said is not None:
        return ("refused", said)
    return ("differs", _why(name, mode))


def _why(name: str, mode: str) -> str:
    if mode in _NEAREST and name in _RESIZES:
        return (
            "Pillow resizes a palette image by nearest whatever the interpolation, taking the source pixel under "
            "each output pixel's centre; gpufeed's nearest resize takes another"
        )
    if mode in ("P", "PA"):
        return (
            "Pillow computes it from the palette's colours (or changes the palette and keeps the indices); gpufeed "
            "stores the palette indices, which hold no colours"
        )
    if mode in ("F", "I", "I;16"):
        return f"Pillow computes it in the {mode} image's own arithmetic (and some ops convert it to 8 bits)"
    return f"Pillow computes it through the {mode} image's own conversions (its grey, its hue), not as RGB"


def _describe(mode: str) -> str:
    return f"{mode} ({_NAMES[mode]})" if mode in _NAMES else mode


def mode_fix(mode: str) -> str:
    """How to give gpufeed images of ``mode`` that it batches as torchvision runs them (said in its errors)."""
    if mode in _WIDE:
        return _wide_fix(mode)
    to = "L" if mode == "1" else "RGB"
    return (
        f"convert the images in the dataset's loader (Image.open(f).convert({to!r}), as torchvision's default loader "
        f"does), or start the transform with T.Lambda(lambda im: im.convert({to!r})) and pass cache_lambda=True"
    )


_WIDE = ("F", "I", "I;16")  # values beyond 8 bits: convert("L") would clip them at 255


def _wide_fix(mode: str) -> str:
    """The fix for images of 16-bit, 32-bit or float values (``mode``): keep them, as float tensors, before the
    ops; converting them to "L" clips every value above 255 (a 16-bit scan turns white, floats in [0, 1] black)."""
    scale = " / 65535" if mode == "I;16" else ""  # to [0, 1], as ToTensor scales 8-bit images
    return (
        f"keep their values as a float tensor before the ops: start the transform with T.Lambda(lambda im: "
        f"torch.from_numpy(np.array(im, np.float32))[None]{scale}) and pass cache_lambda=True (then the ops run "
        "on float tensors, as gpufeed batches them); convert('L') would clip every value above 255"
    )


def _flat(ops: Sequence[Any]) -> list[Any]:
    from . import flatten

    return [inner for op in ops for inner in flatten(op)]


def check_modes(ops: Sequence[Any], mode: str | None, where: str) -> None:
    """Raise what ``ops`` (the device part of a pipeline, torchvision's ops) meet on PIL images of ``mode`` before their
    first tensor conversion: the ConfigError torchvision's refusal is, or UnsupportedTransformError for what gpufeed
    does not batch on that mode. ``where`` names a sample of that mode (``MyDataset[0]``). None (not PIL): nothing."""
    from . import kind

    if mode is None:
        return
    for op in ops:
        name = kind(op)
        if name in _CONTAINERS:
            check_modes(_flat(op.transforms), mode, where)  # their ops see the images as they are here
            continue
        found = verdict(name, op, mode)
        if found is not None:
            what, said = found
            head = f"{op!r} on {_describe(mode)} PIL images ({where} is one)"
            if what == "refused":
                raise ConfigError(f"{head}: torchvision refuses it ({said}); {mode_fix(mode)}")
            raise UnsupportedTransformError(
                f"{head}: {said}, so gpufeed does not batch it; {mode_fix(mode)}, or pass fallback='prefetch' to run "
                "your pipeline per sample"
            )
        if name in _TO_TENSOR:
            return


def mode_bound(ops: Sequence[Any]) -> bool:
    """Whether what ``ops`` compute on PIL images depends on their mode: an op before the first tensor conversion that
    does more than move pixels. A dataset of several modes (L and P; RGB and YCbCr) is then refused, unless every
    image has the mode gpufeed built the ops for; images of any mode are moved alike."""
    from . import kind

    for op in ops:
        name = kind(op)
        if name in _CONTAINERS:
            if mode_bound(_flat(op.transforms)):
                return True
            continue
        if name in _TO_TENSOR:
            return False
        if name not in _MOVES:
            return True
    return False
