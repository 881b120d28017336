"""Split a torchvision transform into a part computed once (cached) and a part run batched on the device.

The rule: the deterministic ops at the start of the pipeline that change an image's geometry or
content (Resize, CenterCrop, Grayscale, Pad, and Lambda when asked) run once per sample, exactly as
torchvision runs them, and their output is stored -- as uint8 when it is still an image. Everything
after that runs batched on the device as :mod:`gpufeed.augment` ops in the original order:
ToTensor's /255 and Normalize move there too, merged into one ``Normalize``, so a stored uint8
image becomes the same float tensor the original pipeline made. Because the order is kept, fill
and erase values stay in the value space the user wrote them in (a ``RandomCrop`` before
``ToTensor`` pads black in pixel values, one after ``Normalize`` in normalised values).

Each torchvision op is converted by one small function found by class name (``CONVERTERS``);
v1 (``torchvision.transforms``) and v2 (``torchvision.transforms.v2``) differ only in details.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import augment as A
from .errors import ConfigError, UnsupportedTransformError

__all__ = ["CACHEABLE", "CONVERTERS", "Plan", "Split", "build_batched", "split_transform"]

# Deterministic ops that change geometry or content: computed once per sample and cached.
CACHEABLE = ("Resize", "CenterCrop", "Grayscale", "Pad", "Lambda")
# Deterministic per-pixel ops that the device part takes over (no geometry change).
_CONVERSIONS = ("ToTensor", "PILToTensor", "ToImage", "ConvertImageDtype", "ToDtype", "Normalize")


@dataclass
class _State:
    """What the device part knows while converting: value space and image size."""

    dtype: torch.dtype  # dtype of the data at this point (uint8 pixels or floating)
    size: tuple[int, int]  # (height, width) at this point


def _is_v2(op: Any) -> bool:
    return type(op).__module__.startswith("torchvision.transforms.v2")


def _fill(fill: Any) -> float | tuple[float, ...]:
    if isinstance(fill, dict):  # v2: per input type; images use tv_tensors.Image or the default
        from torchvision import tv_tensors

        fill = fill.get(tv_tensors.Image, fill.get(torch.Tensor, fill.get("others", 0)))
    if fill is None:
        return 0.0
    return float(fill) if isinstance(fill, (int, float)) else tuple(float(v) for v in fill)


def _random_crop(op: Any, s: _State) -> A.BatchTransform:
    h, w = op.size
    if _is_v2(op):
        # v2 stores padding as [left, right, top, bottom] and pads once, need included.
        left, right, top, bottom = op.padding or (0, 0, 0, 0)
        if op.pad_if_needed:
            dh = max(0, h - (s.size[0] + top + bottom))
            dw = max(0, w - (s.size[1] + left + right))
            top, bottom, left, right = top + dh, bottom + dh, left + dw, right + dw
        crop = A.RandomCrop((h, w), (left, top, right, bottom), False, _fill(op.fill), op.padding_mode)
    else:
        crop = A.RandomCrop((h, w), op.padding, op.pad_if_needed, _fill(op.fill), op.padding_mode)
    s.size = (h, w)
    return crop


def _erasing(op: Any, s: _State) -> A.BatchTransform:
    value = op.value
    if value is None or value == "random":
        value = "random"
    elif not isinstance(value, (int, float)):
        value = tuple(float(v) for v in value)
        value = value[0] if len(value) == 1 else value
    return A.RandomErasing(op.p, tuple(op.scale), tuple(op.ratio), value)


def _resized_crop(op: Any, s: _State) -> A.BatchTransform:
    mode = getattr(op.interpolation, "value", op.interpolation)
    if mode != "bilinear":
        raise UnsupportedTransformError(
            f"{op!r}: gpufeed batches RandomResizedCrop with bilinear interpolation only, not {mode!r}; "
            "use InterpolationMode.BILINEAR or fallback='prefetch'"
        )
    s.size = tuple(op.size)  # type: ignore[assignment]
    return A.RandomResizedCrop(tuple(op.size), tuple(op.scale), tuple(op.ratio), bool(op.antialias))


def _color_jitter(op: Any, s: _State) -> A.BatchTransform:
    return A.ColorJitter(op.brightness, op.contrast, op.saturation, op.hue)


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
    dtype = op.dtype
    if isinstance(dtype, dict):
        from torchvision import tv_tensors

        dtype = dtype.get(tv_tensors.Image, dtype.get(torch.Tensor, dtype.get("others")))
    if dtype is None or dtype == s.dtype:
        return None
    if dtype == torch.uint8:
        s.dtype = torch.uint8
        return A.ConvertDtype(torch.uint8)
    # v1 ConvertImageDtype divides by 255; v2 ToDtype multiplies by 1/255 (last-bit differences).
    return _to_float(s, dtype, scale=getattr(op, "scale", True), reciprocal=_is_v2(op))


def _normalize(op: Any, s: _State) -> A.BatchTransform:
    if not s.dtype.is_floating_point:
        raise ConfigError(
            f"{op!r} comes before any ToTensor/ToDtype(scale=True): torchvision itself rejects Normalize on uint8 "
            "images; put ToTensor() first"
        )
    return A.Normalize(tuple(op.mean), tuple(op.std), dtype=s.dtype)


# torchvision class name -> converter(op, state) -> gpufeed op (or None for a no-op on the device)
CONVERTERS: dict[str, Callable[[Any, _State], A.BatchTransform | None]] = {
    "RandomCrop": _random_crop,
    "RandomHorizontalFlip": lambda op, s: A.RandomHorizontalFlip(op.p),
    "RandomVerticalFlip": lambda op, s: A.RandomVerticalFlip(op.p),
    "RandomErasing": _erasing,
    "RandomResizedCrop": _resized_crop,
    "ColorJitter": _color_jitter,
    "ToTensor": lambda op, s: _to_float(s),
    "PILToTensor": lambda op, s: None,
    "ToImage": lambda op, s: None,
    "ConvertImageDtype": _to_dtype,
    "ToDtype": _to_dtype,
    "Normalize": _normalize,
}
RANDOM_SUPPORTED = (*(n for n in CONVERTERS if n.startswith("Random")), "ColorJitter")
# Ops whose torchvision PIL kernels differ (by a few levels) from the tensor kernels gpufeed follows.
_PIL_DIFFERS = ("RandomResizedCrop", "ColorJitter")


def flatten(transform: Any) -> list[Any]:
    """The list of ops in a (nested) v1 or v2 ``Compose``, a bare transform, or ``None``."""
    if transform is None:
        return []
    if type(transform).__name__ == "Compose" and hasattr(transform, "transforms"):
        return [op for t in transform.transforms for op in flatten(t)]
    return [transform]


def _name(op: Any) -> str:
    return type(op).__name__


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
        if _name(op) == "Lambda" and not cache_lambda:
            raise UnsupportedTransformError(
                f"{op!r} is opaque: gpufeed cannot tell whether it is deterministic. If it is, pass "
                "cache_lambda=True to compute it once per sample and cache the result"
            )
        if _name(op) not in CACHEABLE and _name(op) not in CONVERTERS:
            raise UnsupportedTransformError(
                f"{_name(op)} cannot be cached or run batched. gpufeed batches {', '.join(RANDOM_SUPPORTED)} and "
                f"caches {', '.join(CACHEABLE)} (with {', '.join(_CONVERSIONS)} on the device); pass "
                "fallback='prefetch' to run the original per-sample pipeline in DataLoader workers instead"
            )
    first_random = next((i for i, op in enumerate(ops) if _name(op) in RANDOM_SUPPORTED), len(ops))
    late = [op for op in ops[first_random:] if _name(op) in CACHEABLE]
    if late:
        raise UnsupportedTransformError(
            f"{late[0]!r} comes after a random op, so it can be neither cached (its input changes every epoch) "
            "nor batched; move it before the random ops or pass fallback='prefetch'"
        )
    last_cached = max((i for i, op in enumerate(ops[:first_random]) if _name(op) in CACHEABLE), default=-1)
    cached, device = ops[: last_cached + 1], ops[last_cached + 1 :]
    notes = []
    if any(_name(op) in _CONVERSIONS for op in cached):
        notes.append("a conversion to float comes before a cached op, so the cache stores float32 (4x uint8)")
    first_tensor = next((i for i, op in enumerate(ops) if _name(op) in _CONVERSIONS), len(ops))
    for op in ops[:first_tensor]:
        if _name(op) in _PIL_DIFFERS:
            notes.append(
                f"{_name(op)} runs on uint8 tensors as torchvision's tensor kernels do; on PIL images torchvision uses "
                "PIL's, which differ by a few intensity levels"
            )
    return Split(tuple(cached), tuple(device), tuple(notes))


def build_batched(
    device_ops: Sequence[Any], stored_dtype: torch.dtype, image_size: tuple[int, int]
) -> A.Compose | None:
    """The gpufeed ops for the device part, for stored images of this dtype and (height, width)."""
    state = _State(stored_dtype, image_size)
    out: list[A.BatchTransform] = []
    inputs: list[torch.dtype] = []  # the dtype each op in ``out`` receives
    for op in device_ops:
        before = state.dtype
        converted = CONVERTERS[_name(op)](op, state)
        if converted is None:
            continue
        prev = out[-1] if out else None
        if isinstance(converted, A.Normalize) and isinstance(prev, A.ConvertDtype) and inputs[-1] == torch.uint8:
            # uint8 -> float then Normalize is exactly gpufeed's Normalize on uint8 (it scales first).
            out[-1] = A.Normalize(converted.mean, converted.std, converted.dtype, prev.reciprocal)
            continue
        out.append(converted)
        inputs.append(before)
    return A.Compose(out) if out else None


@dataclass(frozen=True)
class Plan:
    """What :func:`gpufeed.accelerate` decided, and why; ``print(loader.plan)`` shows it."""

    cached: tuple[str, ...]
    batched: tuple[str, ...]
    storage: str
    stored_shape: tuple[int, ...]
    stored_dtype: str
    bytes: int
    ingest: str
    cache_path: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        gib = self.bytes / 2**30
        size = f"{gib:.2f} GiB" if gib >= 0.1 else f"{self.bytes / 2**20:.1f} MiB"
        lines = [
            f"storage:  {self.storage} ({size}, {self.stored_dtype} {tuple(self.stored_shape)})",
            f"ingest:   {self.ingest}",
            f"cached:   {', '.join(self.cached) or 'nothing (stored as read)'}",
            f"batched:  {', '.join(self.batched) or 'nothing'}",
        ]
        if self.cache_path:
            lines.append(f"cache:    {self.cache_path}")
        lines += [f"note:     {n}" for n in self.notes]
        return "\n".join(lines)
