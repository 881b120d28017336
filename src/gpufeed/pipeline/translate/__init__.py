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
op and the value space alone, with torchvision's own words (:mod:`.refusals`): never found by a lucky draw on
a few probed samples, nor run into something else.

The converters live beside it by kind: :mod:`.geometry`, :mod:`.color`, :mod:`.auto`, :mod:`.dtype`,
:mod:`.from_timm`; :mod:`.state` follows the image (dtype, size, PIL or tensor) through the pipeline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ... import augment as A
from ...augment.containers import Identity
from ...errors import ConfigError, UnsupportedTransformError
from . import refusals
from .auto import auto_augment
from .color import PIL_BOUNDS, blur, color_jitter, grayscale, per_sample
from .dtype import normalize, to_dtype, to_float, to_tensor
from .from_timm import timm_auto, timm_erasing
from .geometry import affine, erasing, perspective, random_crop, resized_crop, rotation
from .state import State, is_v2
from .wrapped import held, why_not

__all__ = [
    "CACHEABLE",
    "CONVERTERS",
    "PIL_BOUNDS",
    "RANDOM_SUPPORTED",
    "Split",
    "build_batched",
    "flatten",
    "kind",
    "split_transform",
]


# Deterministic ops that change geometry or content: computed once per sample and cached.
CACHEABLE = ("Resize", "CenterCrop", "Grayscale", "Pad", "Lambda")
# Deterministic per-pixel ops that the device part takes over (no geometry change).
_CONVERSIONS = ("ToTensor", "PILToTensor", "ToImage", "ConvertImageDtype", "ToDtype", "Normalize")
# Ops after which the image is a tensor (no longer PIL) in the user's pipeline.
_TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "MaybeToTensor", "MaybePILToTensor")


def _inner(op: Any, s: State) -> tuple[A.BatchTransform, ...]:
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
        out.append(converted if converted is not None else Identity())
    return tuple(out)


def _container(make: Callable[[Any, State], A.BatchTransform]) -> Callable[[Any, State], A.BatchTransform]:
    def convert(op: Any, s: State) -> A.BatchTransform:
        try:
            return make(op, s)
        except ConfigError as e:  # what gpufeed's container refuses, the fallback can still run
            if refusals.is_refusal(e):  # ... unless torchvision refuses the inner op itself
                raise
            raise UnsupportedTransformError(f"{op!r}: {e}") from e

    return convert


# torchvision op name -> converter(op, state) -> gpufeed op (or None for a no-op on the device)
CONVERTERS: dict[str, Callable[[Any, State], A.BatchTransform | None]] = {
    "RandomCrop": random_crop,
    "RandomHorizontalFlip": lambda op, s: A.RandomHorizontalFlip(op.p),
    "RandomVerticalFlip": lambda op, s: A.RandomVerticalFlip(op.p),
    "RandomErasing": erasing,
    "RandomResizedCrop": resized_crop,
    # timm's: the same box distribution (its own copy of torchvision's get_params); "random" draws the
    # interpolation per sample; MaybeToTensor is ToTensor on PIL images and passes tensors through.
    "RandomResizedCropAndInterpolation": resized_crop,
    "MaybeToTensor": lambda op, s: to_float(s) if s.pil else None,
    "MaybePILToTensor": lambda op, s: None,
    "TimmRandomErasing": timm_erasing,
    "TimmRandAugment": _container(timm_auto),
    "TimmAutoAugment": _container(timm_auto),
    "ColorJitter": color_jitter,
    "RandomSolarize": per_sample(A.RandomSolarize, "threshold", check=refusals.check_solarize),
    "RandomPosterize": per_sample(A.RandomPosterize, "bits", check=refusals.check_posterize),
    "RandomAutocontrast": per_sample(A.RandomAutocontrast),
    "RandomEqualize": per_sample(A.RandomEqualize, check=refusals.check_equalize),
    "RandomInvert": per_sample(A.RandomInvert),
    "RandomAdjustSharpness": per_sample(A.RandomAdjustSharpness, "sharpness_factor", check=refusals.check_sharpness),
    "RandomGrayscale": per_sample(A.RandomGrayscale),
    "Grayscale": grayscale,  # after a random op; before one it is cached
    "GaussianBlur": blur,
    "RandomRotation": rotation,
    "RandomPerspective": perspective,
    "RandomAffine": affine,
    "RandomApply": _container(lambda op, s: A.RandomApply(_inner(op, s), op.p)),
    "RandomChoice": _container(lambda op, s: A.RandomChoice(_inner(op, s), tuple(op.p) if op.p is not None else None)),
    "RandomOrder": _container(lambda op, s: A.RandomOrder(_inner(op, s))),
    "TrivialAugmentWide": auto_augment,
    "RandAugment": auto_augment,
    "AutoAugment": auto_augment,
    "AugMix": auto_augment,
    "ToTensor": lambda op, s: to_tensor(op, s, "ToTensor"),
    "PILToTensor": lambda op, s: to_tensor(op, s, "PILToTensor"),
    "ToImage": lambda op, s: None,
    "ConvertImageDtype": to_dtype,
    "ToDtype": to_dtype,
    "Normalize": normalize,
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
    inner = held(transform)  # an object of the script's own that only applies the recipe it holds (wrapped.py)
    if inner is not None:
        return [op for t in inner for op in flatten(t)]
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
                else f" ({wrapper})"
                if (wrapper := why_not(op))
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
    mode: str | None = None,
) -> A.Compose | None:
    """The gpufeed ops for the device part, for stored images of this dtype and (height, width).

    ``pil``: the dataset yields PIL images, so in the user's pipeline the ops before the first
    tensor conversion ran PIL's kernels; what that changes is appended to ``notes``. ``channels``:
    the images' channel count, if known, for the checks that depend on it (an erase value per channel). ``mode``:
    the PIL images' mode, if ``pil`` (Pillow resamples a palette image by nearest: :mod:`.modes`, which the probe
    checks first). What torchvision itself refuses at an op's place in the pipeline raises ConfigError here, before
    any data is read (:mod:`gpufeed.pipeline.translate.refusals`).
    """
    state = State(stored_dtype, image_size, pil, channels=channels, mode=mode if pil else None)
    out: list[A.BatchTransform] = []
    inputs: list[torch.dtype] = []  # the dtype each op in ``out`` receives
    for op in device_ops:
        before = state.dtype
        converted = CONVERTERS[kind(op)](op, state)  # type: ignore[index]
        state.pil = state.pil and kind(op) not in _TO_TENSOR
        state.tensor = state.tensor or kind(op) in _TO_TENSOR
        if kind(op) in _TO_TENSOR or kind(op) == "ToPureTensor":
            state.tv_image = kind(op) == "ToImage" and is_v2(op)
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
