"""Split a torchvision transform into a part computed once (cached) and a part run batched on the device.

The rule: the deterministic ops at the start of the pipeline that change an image's geometry or
content (Resize, CenterCrop, Grayscale, Pad, and Lambda when asked) run once per sample, exactly as
torchvision runs them, and their output is stored -- as uint8 when it is still an image. Everything
after that runs batched on the device as :mod:`gpufeed.augment` ops in the original order:
ToTensor's /255 and Normalize move there too, merged into one ``Normalize``, so a stored uint8
image becomes the same float tensor the original pipeline made. Because the order is kept, fill
and erase values stay in the value space the user wrote them in (a ``RandomCrop`` before
``ToTensor`` pads black in pixel values, one after ``Normalize`` in normalised values).

Each torchvision op is converted by one small function (``CONVERTERS``), found by the op's class:
torchvision's own classes, v1 (``torchvision.transforms``) and v2 (``torchvision.transforms.v2``),
matched by identity, so a look-alike from another library (timm's ``ToTensor`` does not divide by
255) is an unsupported op, never converted by its name. Every gpufeed op reports its output size,
so the planner follows the image size through crops and resizes without classifying ops by hand.

Where the dataset yields PIL images, the ops before the first tensor conversion run on PIL images
in the user's pipeline, through PIL's kernels. The batched ops follow them where they differ in
kind (``RandomResizedCrop`` always antialiases on PIL); where they differ by rounding beyond one
intensity level (``ColorJitter``), the plan states the measured bound (``PIL_BOUNDS``). A resize of uint8
images follows the kernel the user's pipeline runs there: Pillow's integers on PIL images, v2's fixed-point
uint8 kernel on uint8 tensors (on the CPU, where DataLoader workers run it), v1's float one otherwise.

What torchvision itself refuses at an op's place in the pipeline (a solarize threshold above the image's
maximum, v1's posterize on float images, a fill a uint8 tensor cannot hold, ...) is refused here, from the
op and the value space alone, with torchvision's own words (:mod:`gpufeed.pipeline.refusals`): never found by a
lucky draw on a few probed samples, nor run into something else.
"""

from __future__ import annotations

import functools
import math
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import augment as A
from ..augment import random_ops as R
from ..errors import ConfigError, UnsupportedTransformError
from . import refusals

__all__ = ["CACHEABLE", "CONVERTERS", "PIL_BOUNDS", "Split", "build_batched", "kind", "split_transform"]

# Deterministic ops that change geometry or content: computed once per sample and cached.
CACHEABLE = ("Resize", "CenterCrop", "Grayscale", "Pad", "Lambda")
# Deterministic per-pixel ops that the device part takes over (no geometry change).
_CONVERSIONS = ("ToTensor", "PILToTensor", "ToImage", "ConvertImageDtype", "ToDtype", "Normalize")
# Ops after which the image is a tensor (no longer PIL) in the user's pipeline.
_TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "MaybeToTensor", "MaybePILToTensor")

# The largest difference, in uint8 intensity levels, between torchvision's PIL kernel and the
# tensor kernel gpufeed batches, per ColorJitter adjustment; measured on 4,608 random 32x32 images
# (noise, smooth, dark) with factors over [0, 3] (hue [-0.5, 0.5]); tests/augment/test_color.py
# re-measures them. Brightness agrees exactly; jitter with several adjustments can compound these.
PIL_BOUNDS = {"brightness": 0, "contrast": 3, "saturation": 2, "hue": 18}


@dataclass
class _State:
    """What the device part knows while converting: value space, image size, PIL or tensor."""

    dtype: torch.dtype  # dtype of the data at this point (uint8 pixels or floating)
    size: tuple[int, int]  # (height, width) at this point
    pil: bool = False  # the user's pipeline has PIL images at this point
    tv_image: bool = False  # ... or a v2 tv_tensors.Image (after ToImage), which v2's fill dicts key on
    tensor: bool = False  # known to be a tensor (after a conversion; before one it may be a PIL image or an ndarray)
    channels: int | None = None  # the images' channel count, when the caller knows it
    notes: list[str] = field(default_factory=list)


def _is_v2(op: Any) -> bool:
    return type(op).__module__.startswith("torchvision.transforms.v2")


def _fill_or_none(fill: Any, s: _State) -> float | tuple[float, ...] | None:
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


def _fill(fill: Any, s: _State) -> float | tuple[float, ...]:
    """A padding fill: none is 0."""
    value = _fill_or_none(fill, s)
    return 0.0 if value is None else value


def _check_mirror_padding(op: Any, s: _State, pads: tuple[int, int, int, int]) -> None:
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


def _random_crop(op: Any, s: _State) -> A.BatchTransform:
    h, w = (op.size, op.size) if isinstance(op.size, int) else op.size
    if op.padding is not None:
        p = [op.padding] if isinstance(op.padding, int) else list(op.padding)
        if _is_v2(op):  # v2 stores [left, right, top, bottom]
            left, right, top, bottom = op.padding or (0, 0, 0, 0)
        else:
            p = p * 2 if len(p) == 1 else p
            left, top, right, bottom = (p * 2 if len(p) == 2 else p)[:4]
        _check_mirror_padding(op, s, (left, top, right, bottom))
    if _is_v2(op):
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


def _crop_fill(op: Any, s: _State) -> float | tuple[float, ...]:
    """The fill torchvision pads with at this point (refusals.crop_fill: casts, clips, refusals); none is 0."""
    if op.padding_mode != "constant" or not (op.padding or op.pad_if_needed):
        return _fill(op.fill, s)  # never padded with it: torchvision never reads it
    value = refusals.crop_fill(op, _fill_or_none(op.fill, s), s.dtype, s.pil)
    return 0.0 if value is None else value


def _erasing(op: Any, s: _State) -> A.BatchTransform:
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


def _resized_crop(op: Any, s: _State) -> A.BatchTransform:
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


def _resize_kernel(op: Any, s: _State, modes: tuple[str, ...]) -> str:
    """How the user's pipeline resamples uint8 images at this point (see gpufeed.augment.fixed_point): Pillow's
    integers on PIL images; v2's on uint8 tensors on the CPU, where DataLoader workers run it; else through float
    (v1, and timm's op, which calls v1's functional)."""
    if s.dtype != torch.uint8:
        return "float"
    if s.pil:
        return "pil"
    if not _is_v2(op):
        return "float"
    # torchvision v2 (resize_image, _do_native_uint8_resize_on_cpu): bicubic always takes PyTorch's uint8 kernel
    # on the CPU; bilinear only where the CPU has AVX2/AVX512 or is ARM -- the machine this plan is made on.
    native = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")
    return "float" if modes == ("bilinear",) and not native else "torch"


def _color_jitter(op: Any, s: _State) -> A.BatchTransform:
    jitter = A.ColorJitter(op.brightness, op.contrast, op.saturation, op.hue)
    if not s.pil and _is_v2(op) and any(getattr(jitter, k) is not None for k in ("contrast", "saturation", "hue")):
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


# v2's kernels against v1's (which gpufeed batches) on uint8 tensors: equal for the geometric ops, equalize,
# sharpness, solarize, posterize, grayscale and brightness; within 1 level for autocontrast, contrast and
# saturation (measured on random 20x28 images). v2's auto-augment computes its solarize thresholds as
# 255 x linspace(1, 0): gpufeed takes them the same way for a v2 op (``v2_thresholds``).
V2_LEVEL_NOTE = (
    "v2's {name} computes autocontrast, contrast and saturation with kernels that round differently from v1's, "
    "which gpufeed batches: within 1 intensity level (measured); its solarize thresholds are taken as v2 takes "
    "them (255 x a 0-1 table), so they match"
)


def _auto_augment(op: Any, s: _State) -> A.BatchTransform:
    name = type(op).__name__
    mode = _interpolation(op)
    if s.dtype != torch.uint8:
        if _is_v2(op):  # v2 runs its ops on float images too (posterize and equalize as floats): not batched here
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
    fill = _geometric_fill(op, s)
    out: A.BatchTransform
    v2 = _is_v2(op)
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
    if _is_v2(op) and not s.pil:
        s.notes.append(V2_LEVEL_NOTE.format(name=name))
    return out


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


def _pil_note(op: Any, s: _State, mode: str | None = None) -> None:
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


def _interpolation(op: Any) -> str:
    mode = getattr(op.interpolation, "value", op.interpolation)
    if mode not in ("nearest", "bilinear"):
        raise UnsupportedTransformError(
            f"{op!r}: gpufeed batches {type(op).__name__} with nearest or bilinear interpolation, not {mode!r}; "
            "pass fallback='prefetch' to run it per sample"
        )
    return str(mode)


def _geometric_fill(op: Any, s: _State) -> float | tuple[float, ...] | None:
    """The fill of a rotation, affine map or perspective; None stays None (v2's ``fill=None``: no fill mask, the
    outside is zero-padded before interpolating, which bilinear sampling shows at the border)."""
    return _fill_or_none(op.fill, s)


def _rotation(op: Any, s: _State) -> A.BatchTransform:
    if op.expand:
        raise UnsupportedTransformError(
            f"{op!r}: expand=True gives every angle its own output size; gpufeed batches expand=False"
        )
    center = tuple(float(c) for c in op.center) if op.center is not None else None
    fill = _geometric_fill(op, s)
    return R.RandomRotation(tuple(op.degrees), _interpolation(op), center, fill, pil=s.pil)  # type: ignore[arg-type]


def _affine(op: Any, s: _State) -> A.BatchTransform:
    center = tuple(float(c) for c in op.center) if op.center is not None else None
    shear = tuple(op.shear) if op.shear is not None else None
    return R.RandomAffine(
        tuple(op.degrees),
        tuple(op.translate) if op.translate is not None else None,
        tuple(op.scale) if op.scale is not None else None,
        shear,
        _interpolation(op),
        _geometric_fill(op, s),
        center,  # type: ignore[arg-type]
        pil=s.pil,
        v2=_is_v2(op),
    )


def _perspective(op: Any, s: _State) -> A.BatchTransform:
    _pil_note(op, s, _interpolation(op))
    return R.RandomPerspective(op.distortion_scale, op.p, _interpolation(op), _geometric_fill(op, s))


def _timm_erasing(op: Any, s: _State) -> A.BatchTransform:
    from ..augment.timm_ops import TimmRandomErasing

    if op.num_splits > 1:
        raise UnsupportedTransformError(
            f"{op!r}: num_splits={op.num_splits} leaves a share of each batch unerased (timm's augmentation "
            "splits); gpufeed batches num_splits=0 or 1"
        )
    aspect = (math.exp(op.log_aspect_ratio[0]), math.exp(op.log_aspect_ratio[1]))
    return TimmRandomErasing(
        op.probability, op.min_area, op.max_area, aspect[0], aspect[1], op.mode or "const", op.min_count, op.max_count
    )


# Pillow's resampling filter numbers (Image.Resampling) that Image.transform takes.
_PIL_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def _timm_auto(op: Any, s: _State) -> A.BatchTransform:
    """timm's ``RandAugment`` / ``AutoAugment`` (``timm.data.auto_augment``): its ``AugmentOp`` list read back
    into :class:`~gpufeed.augment.timm_auto.TimmOp` s; the hyper-parameters all its ops share."""
    from ..augment import timm_auto as TA

    name = type(op).__name__
    if not s.pil or s.dtype != torch.uint8:
        raise UnsupportedTransformError(
            f"timm's {name} runs PIL kernels (ImageOps, ImageEnhance) and needs PIL images, but the pipeline gives it "
            "a tensor here; put it before ToTensor/MaybeToTensor, as timm's create_transform does"
        )
    if name == "RandAugment":
        augment_ops = list(op.ops)
    else:
        augment_ops = list({id(a): a for sub in op.policy for a in sub}.values())
    ops, hparams = [], set()
    for a in augment_ops:
        if a.name not in TA.NAMES:
            raise UnsupportedTransformError(
                f"timm's {name} holds {a.name}, which gpufeed does not batch (it batches {', '.join(TA.NAMES)}); "
                "pass fallback='prefetch' to run it per sample"
            )
        resample = a.kwargs.get("resample", 3)
        filters = tuple(resample) if isinstance(resample, (list, tuple)) else (resample,)
        if any(int(f) not in _PIL_FILTERS for f in filters):
            raise UnsupportedTransformError(f"timm's {name}: resample={resample!r} is not one Image.transform takes")
        fill = a.kwargs.get("fillcolor", (128, 128, 128))
        hparams.add(
            (
                tuple(fill) if isinstance(fill, (list, tuple)) else (fill,),
                tuple(_PIL_FILTERS[int(f)] for f in filters),
                float(a.hparams.get("translate_const", 250)),
                float(a.hparams.get("translate_pct", 0.45)),
            )
        )
        prob = min(1.0, max(0.0, float(a.prob)))  # timm applies an op of prob >= 1 always, of prob <= 0 never
        ops.append(TA.TimmOp(a.name, prob, float(a.magnitude), float(a.magnitude_std), a.magnitude_max))
    if len(hparams) != 1:
        raise UnsupportedTransformError(f"timm's {name}: its ops have different fills or interpolations ({hparams})")
    hp = TA._Hparams.make(*hparams.pop())
    if any(o.name in ("Posterize", "PosterizeIncreasing") for o in ops):
        s.notes.append(TIMM_POSTERIZE_NOTE)
    if name == "RandAugment":
        weights = op.choice_weights
        return TA.TimmRandAugment(
            tuple(ops), int(op.num_layers), tuple(float(w) for w in weights) if weights is not None else None, hp
        )
    index = {id(a): i for i, a in enumerate(augment_ops)}
    return TA.TimmAutoAugment(tuple(ops), tuple(tuple(index[id(a)] for a in sub) for sub in op.policy), hp)


TIMM_POSTERIZE_NOTE = (
    "timm's posterize can draw 0 bits or fewer (PosterizeIncreasing at magnitude 10 or above, Posterize below "
    "2.5), which Pillow 13 refuses (ValueError in the per-sample pipeline); gpufeed keeps no bits there (a black "
    "image), as Pillow before 13 computed"
)


def _inner(op: Any, s: _State) -> tuple[A.BatchTransform, ...]:
    """A container's ops, converted in the state they run in; each keeps its place (an op with nothing to do
    on the device stays as Identity, so that ``RandomChoice``'s weights still line up). They may not change
    the image's size: the samples a container picks and the others would differ."""
    out: list[A.BatchTransform] = []
    for inner in op.transforms:
        name = kind(inner)
        if name not in CONVERTERS:
            raise UnsupportedTransformError(
                f"{type(op).__name__} holds {inner!r}, which gpufeed does not batch; pass fallback='prefetch'"
            )
        converted = CONVERTERS[name](inner, s)
        if converted is not None and converted.output_size(*s.size) != tuple(s.size):
            raise UnsupportedTransformError(
                f"{type(op).__name__} holds {inner!r}, which changes the image size: the samples it picks and the "
                "others would differ in size; pass fallback='prefetch' to run it per sample"
            )
        out.append(converted if converted is not None else R.Identity())
    return tuple(out)


def _container(make: Callable[[Any, _State], A.BatchTransform]) -> Callable[[Any, _State], A.BatchTransform]:
    def convert(op: Any, s: _State) -> A.BatchTransform:
        try:
            return make(op, s)
        except ConfigError as e:  # what gpufeed's container refuses, the fallback can still run
            if refusals.is_refusal(e):  # ... unless torchvision refuses the inner op itself
                raise
            raise UnsupportedTransformError(f"{op!r}: {e}") from e

    return convert


def _per_sample(
    cls: Any, *fields: str, check: Callable[[Any, torch.dtype, bool], None] | None = None
) -> Callable[[Any, _State], A.BatchTransform]:
    def convert(op: Any, s: _State) -> A.BatchTransform:
        if check is not None:  # what torchvision refuses at this point of the pipeline (gpufeed.pipeline.refusals)
            check(op, s.dtype, s.pil)
        _pil_note(op, s)
        if cls is R.RandomAutocontrast and _is_v2(op) and not s.pil:
            s.notes.append(V2_LEVEL_NOTE.format(name="RandomAutocontrast"))
        extra = {"pil": s.pil} if cls is R.RandomSolarize else {}  # Pillow's LUT compares levels in Python
        return cls(p=op.p, **{f: getattr(op, f) for f in fields}, **extra)

    return convert


def _grayscale(op: Any, s: _State) -> A.BatchTransform:
    refusals.check_grayscale(op, s.dtype, s.pil)
    _pil_note(op, s)
    return R.Grayscale(op.num_output_channels)


def _blur(op: Any, s: _State) -> A.BatchTransform:
    _pil_note(op, s)
    return R.GaussianBlur(tuple(op.kernel_size), tuple(op.sigma))


def _to_float(
    s: _State, dtype: torch.dtype = torch.float32, scale: bool = True, reciprocal: bool = False
) -> A.BatchTransform | None:
    if not scale:
        raise UnsupportedTransformError(
            "ToDtype(..., scale=False) keeps 0-255 values in a float tensor, which gpufeed does not batch; "
            "use ToDtype(torch.float32, scale=True) (ToTensor's /255)"
        )
    if s.dtype == dtype:
        return None
    was_uint8, s.dtype = s.dtype == torch.uint8, dtype
    return A.ConvertDtype(dtype, reciprocal=reciprocal and was_uint8)


def _to_dtype(op: Any, s: _State) -> A.BatchTransform | None:
    if s.pil:  # a PIL image here: v1's refuses it, v2's passes it through unchanged (no scaling)
        if not _is_v2(op):
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
    return _to_float(s, dtype, scale=getattr(op, "scale", True), reciprocal=_is_v2(op))


def _to_tensor(op: Any, s: _State, name: str) -> A.BatchTransform | None:
    refusals.check_to_tensor(op, name, s.dtype, s.tensor)  # v1's take PIL images (and ndarrays), not tensors
    if name == "PILToTensor" or s.dtype.is_floating_point or s.tensor:  # v2's pass a tensor through; float arrays
        return None  # stay as they are
    return _to_float(s)


def _normalize(op: Any, s: _State) -> A.BatchTransform:
    if s.pil:
        said = (
            "TypeError: 'Normalize() does not support PIL images.'"
            if _is_v2(op)
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


# torchvision op name -> converter(op, state) -> gpufeed op (or None for a no-op on the device)
CONVERTERS: dict[str, Callable[[Any, _State], A.BatchTransform | None]] = {
    "RandomCrop": _random_crop,
    "RandomHorizontalFlip": lambda op, s: A.RandomHorizontalFlip(op.p),
    "RandomVerticalFlip": lambda op, s: A.RandomVerticalFlip(op.p),
    "RandomErasing": _erasing,
    "RandomResizedCrop": _resized_crop,
    # timm's: the same box distribution (its own copy of torchvision's get_params); "random" draws the
    # interpolation per sample; MaybeToTensor is ToTensor on PIL images and passes tensors through.
    "RandomResizedCropAndInterpolation": _resized_crop,
    "MaybeToTensor": lambda op, s: _to_float(s) if s.pil else None,
    "MaybePILToTensor": lambda op, s: None,
    "TimmRandomErasing": _timm_erasing,
    "TimmRandAugment": _container(_timm_auto),
    "TimmAutoAugment": _container(_timm_auto),
    "ColorJitter": _color_jitter,
    "RandomSolarize": _per_sample(R.RandomSolarize, "threshold", check=refusals.check_solarize),
    "RandomPosterize": _per_sample(R.RandomPosterize, "bits", check=refusals.check_posterize),
    "RandomAutocontrast": _per_sample(R.RandomAutocontrast),
    "RandomEqualize": _per_sample(R.RandomEqualize, check=refusals.check_equalize),
    "RandomInvert": _per_sample(R.RandomInvert),
    "RandomAdjustSharpness": _per_sample(R.RandomAdjustSharpness, "sharpness_factor", check=refusals.check_sharpness),
    "RandomGrayscale": _per_sample(R.RandomGrayscale),
    "Grayscale": _grayscale,  # after a random op; before one it is cached
    "GaussianBlur": _blur,
    "RandomRotation": _rotation,
    "RandomPerspective": _perspective,
    "RandomAffine": _affine,
    "RandomApply": _container(lambda op, s: R.RandomApply(_inner(op, s), op.p)),
    "RandomChoice": _container(lambda op, s: R.RandomChoice(_inner(op, s), tuple(op.p) if op.p is not None else None)),
    "RandomOrder": _container(lambda op, s: R.RandomOrder(_inner(op, s))),
    "TrivialAugmentWide": _auto_augment,
    "RandAugment": _auto_augment,
    "AutoAugment": _auto_augment,
    "AugMix": _auto_augment,
    "ToTensor": lambda op, s: _to_tensor(op, s, "ToTensor"),
    "PILToTensor": lambda op, s: _to_tensor(op, s, "PILToTensor"),
    "ToImage": lambda op, s: None,
    "ConvertImageDtype": _to_dtype,
    "ToDtype": _to_dtype,
    "Normalize": _normalize,
    "ToPureTensor": lambda op, s: None,  # v2: unwraps tv_tensors; the pixels do not change
    "Identity": lambda op, s: None,
}
RANDOM_SUPPORTED = (
    *(n for n in CONVERTERS if n.startswith("Random")),
    "ColorJitter",
    "GaussianBlur",
    "TrivialAugmentWide",
    "RandAugment",
    "AutoAugment",
    "AugMix",
    "TimmRandomErasing",
    "TimmRandAugment",
    "TimmAutoAugment",
)


@functools.cache
def _torchvision_classes() -> dict[type, str]:
    """torchvision's own transform classes (v1 and v2) -> their name, for the ops gpufeed knows."""
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    table: dict[type, str] = {}
    for module in (v1, v2):
        for name in (*CACHEABLE, *CONVERTERS, "Compose"):
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                table[cls] = name
    return table


def _timm_classes() -> dict[type, str]:
    """timm's transforms gpufeed converts, by class identity, when timm is in use (it is never imported here)."""
    import sys

    table: dict[type, str] = {}
    for module_name, names in (
        ("timm.data.transforms", ("RandomResizedCropAndInterpolation", "MaybeToTensor", "MaybePILToTensor")),
        ("timm.data.random_erasing", ("RandomErasing",)),
        ("timm.data.auto_augment", ("RandAugment", "AutoAugment")),
    ):
        module = sys.modules.get(module_name)
        for name in names if module is not None else ():
            if isinstance(cls := getattr(module, name, None), type):
                table[cls] = name if module_name == "timm.data.transforms" else f"Timm{name}"
    return table


def kind(op: Any) -> str | None:
    """The name of the torchvision op ``op`` is an instance of (by class identity), or ``None``.

    A subclass or a look-alike of the same name from another library is ``None``: it may compute
    something else (timm's ``ToTensor`` keeps 0-255).

    Example:
        >>> import torchvision.transforms as T
        >>> kind(T.RandomCrop(8)), kind(type("RandomCrop", (), {})())
        ('RandomCrop', None)
    """
    cls = type(op)
    return _torchvision_classes().get(cls) or _timm_classes().get(cls)


def _expand_preset(op: Any) -> list[Any] | None:
    """torchvision's weights presets (``ResNet50_Weights.DEFAULT.transforms()``) as the ops they run."""
    from torchvision.transforms import _presets

    if type(op) is not _presets.ImageClassification:
        return None
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    # forward(): resize, centre crop, PIL -> uint8 tensor (tensors pass), convert_image_dtype, normalize.
    return [
        T.Resize(op.resize_size, interpolation=op.interpolation, antialias=op.antialias),
        T.CenterCrop(op.crop_size),
        v2.ToImage(),
        T.ConvertImageDtype(torch.float),
        T.Normalize(op.mean, op.std),
    ]


def flatten(transform: Any) -> list[Any]:
    """The list of ops in a (nested) torchvision v1 or v2 ``Compose``, a bare transform, or ``None``."""
    if transform is None:
        return []
    if kind(transform) == "Compose":
        return [op for t in transform.transforms for op in flatten(t)]
    return _expand_preset(transform) or [transform]


def _describe(op: Any) -> str:
    cls = type(op)
    return cls.__name__ if cls.__module__.startswith("torchvision.") else f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Split:
    """The torchvision ops run once per sample (``cached``) and those run batched (``device``)."""

    cached: tuple[Any, ...]
    device: tuple[Any, ...]
    notes: tuple[str, ...] = ()

    def cached_transform(self) -> Callable[[Any], Any] | None:
        """The cached part as one callable, as torchvision would run it; ``None`` when empty."""
        if not self.cached:
            return None
        if len(self.cached) == 1:
            return self.cached[0]
        import torchvision.transforms as T

        return T.Compose(list(self.cached))


def split_transform(transform: Any, cache_lambda: bool = False) -> Split:
    """Split ``transform`` into what is cached and what runs batched; raise if a part fits neither.

    Example:
        >>> import torchvision.transforms as T
        >>> s = split_transform(T.Compose([T.Resize(36), T.RandomCrop(32), T.ToTensor()]))
        >>> [type(op).__name__ for op in s.cached], [type(op).__name__ for op in s.device]
        (['Resize'], ['RandomCrop', 'ToTensor'])
    """
    ops = flatten(transform)
    for op in ops:
        if kind(op) == "Lambda" and not cache_lambda:
            raise UnsupportedTransformError(
                f"{op!r} is opaque: gpufeed cannot tell whether it is deterministic. If it is, pass "
                "cache_lambda=True to compute it once per sample and cache the result"
            )
        if kind(op) is None:
            look_alike = type(op).__name__ in (*CACHEABLE, *CONVERTERS)
            why = (
                f" (gpufeed converts torchvision's own {type(op).__name__}, v1 or v2; this one may compute "
                "something else)"
                if look_alike
                else ""
            )
            raise UnsupportedTransformError(
                f"{_describe(op)} cannot be cached or run batched{why}. gpufeed batches "
                f"{', '.join(RANDOM_SUPPORTED)} and caches {', '.join(CACHEABLE)} (with {', '.join(_CONVERSIONS)} on "
                "the device); pass fallback='prefetch' to run the original per-sample pipeline in DataLoader "
                "workers instead"
            )
    first_random = next((i for i, op in enumerate(ops) if kind(op) in RANDOM_SUPPORTED), len(ops))
    late = [op for op in ops[first_random:] if kind(op) in CACHEABLE and kind(op) not in CONVERTERS]
    if late:
        raise UnsupportedTransformError(
            f"{late[0]!r} comes after a random op, so it can be neither cached (its input changes every epoch) "
            "nor batched; move it before the random ops or pass fallback='prefetch'"
        )
    last_cached = max((i for i, op in enumerate(ops[:first_random]) if kind(op) in CACHEABLE), default=-1)
    cached, device = ops[: last_cached + 1], ops[last_cached + 1 :]
    notes = []
    if any(kind(op) in _CONVERSIONS and kind(op) not in ("PILToTensor", "ToImage") for op in cached):
        notes.append("a conversion to float comes before a cached op, so the cache stores float32 (4x uint8)")
    return Split(tuple(cached), tuple(device), tuple(notes))


def build_batched(
    device_ops: Sequence[Any],
    stored_dtype: torch.dtype,
    image_size: tuple[int, int],
    pil: bool = False,
    notes: list[str] | None = None,
    channels: int | None = None,
) -> A.Compose | None:
    """The gpufeed ops for the device part, for stored images of this dtype and (height, width).

    ``pil``: the dataset yields PIL images, so in the user's pipeline the ops before the first
    tensor conversion ran PIL's kernels; what that changes is appended to ``notes``. ``channels``:
    the images' channel count, if known, for the checks that depend on it (an erase value per channel).
    What torchvision itself refuses at an op's place in the pipeline raises ConfigError here, before
    any data is read (:mod:`gpufeed.pipeline.refusals`).
    """
    state = _State(stored_dtype, image_size, pil, channels=channels)
    out: list[A.BatchTransform] = []
    inputs: list[torch.dtype] = []  # the dtype each op in ``out`` receives
    for op in device_ops:
        before = state.dtype
        converted = CONVERTERS[kind(op)](op, state)  # type: ignore[index]
        state.pil = state.pil and kind(op) not in _TO_TENSOR
        state.tensor = state.tensor or kind(op) in _TO_TENSOR
        if kind(op) in _TO_TENSOR or kind(op) == "ToPureTensor":
            state.tv_image = kind(op) == "ToImage" and _is_v2(op)
        if converted is None:
            continue
        state.size = converted.output_size(*state.size)
        prev = out[-1] if out else None
        if (
            isinstance(converted, A.Normalize)
            and isinstance(prev, A.ConvertDtype)
            and inputs[-1] == torch.uint8
            and converted.dtype == torch.float32
        ):
            # uint8 -> float32 then Normalize is exactly gpufeed's Normalize on uint8 (it scales first, in
            # float32); to another float dtype the two stay apart, so Normalize computes in that dtype.
            out[-1] = A.Normalize(converted.mean, converted.std, converted.dtype, prev.reciprocal)
            continue
        out.append(converted)
        inputs.append(before)
    if notes is not None:
        notes.extend(state.notes)
    return A.Compose(out) if out else None
