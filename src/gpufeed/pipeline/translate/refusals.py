"""What torchvision does with values at the edge of an image's value space, decided from the pipeline at plan time.

A batched op must compute what torchvision computes, and a pipeline torchvision refuses must be refused with
torchvision's reason -- not run into something else (a solarize threshold of 128 after ToTensor never fires in
a float image: torchvision raises on every sample, a silent batched path would train on unsolarized images).
Whether torchvision refuses depends only on the op and the value space at its place in the pipeline (PIL image,
uint8 tensor, float tensor; v1 or v2), which the planner knows before any data is read: these checks run there,
never on a lucky draw of a few probed samples. Each names the op, torchvision's own words, and the fix.

Values torchvision accepts but turns into something else by a cast (a uint8 fill of 0.5 pads 0; v2's fill
(300, 5, 5) pads (44, 5, 5)) are computed here by the same cast, so the batched op receives what torchvision uses.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import ConfigError

__all__ = [
    "check_equalize",
    "check_erasing",
    "check_grayscale",
    "check_magnitude",
    "check_normalize",
    "check_posterize",
    "check_sharpness",
    "check_solarize",
    "check_to_tensor",
    "crop_fill",
    "is_refusal",
    "normalize_channels",
    "refusal",
]

_PHRASE = "torchvision refuses it"


def _space(dtype: torch.dtype, pil: bool) -> str:
    return "PIL images" if pil else f"{str(dtype).replace('torch.', '')} tensors"


def refusal(op: Any, dtype: torch.dtype, pil: bool, said: str, fix: str) -> ConfigError:
    """The error for an op torchvision raises on, at this place of the pipeline: its words, then the fix."""
    return ConfigError(f"{op!r} on {_space(dtype, pil)}: {_PHRASE} ({said}); {fix}")


def is_refusal(error: Exception) -> bool:
    """Whether ``error`` says torchvision itself refuses the op (no fallback can run it either)."""
    return _PHRASE in str(error)


def _drawn(op: Any) -> bool:
    """A random op with p=0 never runs, so torchvision never raises on it."""
    return float(getattr(op, "p", 1.0)) > 0


def _v2(op: Any) -> bool:
    return type(op).__module__.startswith("torchvision.transforms.v2")


def check_solarize(op: Any, dtype: torch.dtype, pil: bool) -> None:
    """Tensor kernels (v1 and v2) raise for a threshold above the dtype's maximum; PIL's LUT takes any."""
    bound = 255 if dtype == torch.uint8 else 1.0
    if pil or not _drawn(op) or not op.threshold > bound:
        return
    said = (
        f"'Threshold should be less or equal the maximum value of the dtype, but got {op.threshold}'"
        if _v2(op)
        else "'Threshold should be less than bound of img.'"
    )
    fix = f"the image's values go up to {bound}: give a threshold <= {bound}"
    if bound == 1.0:
        fix += f" ({op.threshold / 255:.4g} is {op.threshold} in pixel values), or solarize before the conversion"
    raise refusal(op, dtype, pil, said, fix)


def check_posterize(op: Any, dtype: torch.dtype, pil: bool) -> None:
    """v1 checks bits in [0, 8] and takes uint8 tensors only; v2 takes [0, 8] on tensors (floats too);
    Pillow takes [1, 8]."""
    if not _drawn(op):
        return
    bits, v2 = op.bits, _v2(op)
    if not v2 and not 0 <= bits <= 8:
        said = f"'The number if bits should be between 0 and 8. Got {bits}'"
    elif pil and not 1 <= bits <= 8:
        said = "Pillow's 'bits must be between or equal to 1 and 8'"
    elif v2 and not pil and (not isinstance(bits, int) or not 0 <= bits <= 8):
        said = f"'bits must be a positive integer in the range [0, 8], got {bits} instead.'"
    elif not v2 and not pil and dtype != torch.uint8:
        said = f"'Only torch.uint8 image tensors are supported, but found {dtype}'"
        raise refusal(op, dtype, pil, said, "put it before the conversion to float, or use transforms.v2's")
    else:
        return
    raise refusal(op, dtype, pil, said, "give bits from 1 to 8")


def check_equalize(op: Any, dtype: torch.dtype, pil: bool) -> None:
    """v1's tensor kernel takes uint8 only (v2 equalizes floats through uint8 levels; gpufeed does the same)."""
    if _drawn(op) and not pil and not _v2(op) and dtype != torch.uint8:
        said = f"'Only torch.uint8 image tensors are supported, but found {dtype}'"
        raise refusal(op, dtype, pil, said, "put it before the conversion to float, or use transforms.v2's")


def check_sharpness(op: Any, dtype: torch.dtype, pil: bool) -> None:
    """The tensor kernels refuse a negative factor; PIL's ImageEnhance extrapolates with it."""
    if _drawn(op) and not pil and op.sharpness_factor < 0:
        said = f"'sharpness_factor ({op.sharpness_factor}) is not non-negative.'"
        raise refusal(op, dtype, pil, said, "give sharpness_factor >= 0 (or apply it to PIL images)")


def check_erasing(op: Any, dtype: torch.dtype, pil: bool, channels: int | None) -> None:
    """v1's RandomErasing reads ``img.shape`` (a tensor's); a value sequence needs 1 or C entries."""
    if not _drawn(op):
        return
    if pil and not _v2(op):
        said = "AttributeError: 'Image' object has no attribute 'shape'"
        raise refusal(op, dtype, pil, said, "put ToTensor or PILToTensor before it (v1's erases tensors only)")
    value = op.value
    if channels is not None and isinstance(value, (tuple, list)) and len(value) not in (1, channels):
        said = (
            f"'If value is a sequence, it should have either a single value or {channels} (number of input channels)'"
        )
        raise refusal(op, dtype, pil, said, f"give one value or {channels}")


def check_grayscale(op: Any, dtype: torch.dtype, pil: bool) -> None:
    if op.num_output_channels not in (1, 3):
        said = (
            f"'num_output_channels must be 1 or 3, got {op.num_output_channels}.'"
            if _v2(op)
            else "'num_output_channels should be either 1 or 3'"
        )
        raise refusal(op, dtype, pil, said, "give num_output_channels=1 or 3")


def check_normalize(op: Any, dtype: torch.dtype) -> None:
    """A std that is zero in the image's dtype divides by zero; torchvision checks it on every call."""
    std = torch.as_tensor(op.std, dtype=dtype if dtype.is_floating_point else torch.float32)
    if bool((std == 0).any()):
        said = (
            "'std evaluated to zero, leading to division by zero.'"
            if _v2(op)
            else f"'std evaluated to zero after conversion to {dtype}, leading to division by zero.'"
        )
        raise refusal(op, dtype, False, said, f"std={tuple(op.std)} needs every entry non-zero")


def normalize_channels(op: Any, channels: int) -> tuple[str, str] | None:
    """Normalize's ``mean`` and ``std`` on images of ``channels`` channels: None where torchvision runs it (one value,
    or one per channel); ``("refused", its words)`` where it raises (v1 normalizes in place, so neither may broadcast
    the image; v2 divides in place); ``("differs", why)`` where v2 broadcasts a 1-channel image to more channels."""
    lengths = [len(v) if isinstance(v, (list, tuple)) else 1 for v in (op.mean, op.std)]
    if all(n in (1, channels) for n in lengths):
        return None
    values = next(n for n in lengths if n not in (1, channels))
    if _v2(op) and channels == 1 and lengths[1] in (1, lengths[0]):
        return ("differs", f"v2's Normalize broadcasts each 1-channel image to {lengths[0]} channels")
    if channels == 1 and not _v2(op):
        return (
            "refused",
            f"RuntimeError: 'output with shape [1, H, W] doesn't match the broadcast shape [{values}, H, W]'",
        )
    return (
        "refused",
        f"RuntimeError: 'The size of tensor a ({channels}) must match the size of tensor b ({values}) at "
        "non-singleton dimension 0'",
    )


def check_magnitude(op: Any, dtype: torch.dtype, pil: bool) -> None:
    """RandAugment indexes its table of ``num_magnitude_bins`` magnitudes with ``magnitude``."""
    if op.magnitude >= op.num_magnitude_bins:
        said = f"IndexError: 'index {op.magnitude} is out of bounds for dimension 0 with size {op.num_magnitude_bins}'"
        raise refusal(op, dtype, pil, said, f"give magnitude < num_magnitude_bins={op.num_magnitude_bins}")


def check_to_tensor(op: Any, name: str, dtype: torch.dtype, tensor: bool) -> None:
    """v1's ToTensor takes PIL images and ndarrays, PILToTensor PIL images only: after a conversion the image is a
    tensor, which they refuse (v2's pass a tensor through)."""
    if tensor and not _v2(op):
        said = (
            "TypeError: \"pic should be PIL Image or ndarray. Got <class 'torch.Tensor'>\""
            if name == "ToTensor"
            else "TypeError: \"pic should be PIL Image. Got <class 'torch.Tensor'>\""
        )
        raise refusal(op, dtype, False, said, "the image is already a tensor here: remove this conversion")


def crop_fill(op: Any, fill: Any, dtype: torch.dtype, pil: bool) -> Any:
    """The padding fill torchvision pads with here: on PIL, each value as an int clipped to 0-255 (Pillow); on a uint8
    tensor, a number as torch.nn.functional.pad casts it (truncated; out of range refused), v2's sequence as
    ``torch.tensor(fill).to(uint8)`` casts it (truncated and wrapped), v1 refusing any sequence on a tensor."""
    if fill is None:
        return fill
    seq = isinstance(fill, (tuple, list))
    if pil:  # torchvision's _parse_fill makes ints, Pillow stores them clipped to a level
        clipped = tuple(float(min(255, max(0, int(v)))) for v in (fill if seq else (fill,)))
        return clipped if seq else clipped[0]
    if seq and not _v2(op):
        raise refusal(op, dtype, pil, "TypeError: 'Got inappropriate fill arg'", "give fill as one number")
    if dtype != torch.uint8:
        return fill
    if seq and len(fill) > 1:  # v2 _pad_with_vector_fill: the cast of torch.tensor, on the CPU as the workers run it
        return tuple(float(v) for v in torch.tensor([float(v) for v in fill]).to(torch.uint8).tolist())
    value = float(fill[0] if seq else fill)
    if not 0 <= value < 256:
        said = "RuntimeError: 'value cannot be converted to type uint8_t without overflow'"
        raise refusal(op, dtype, pil, said, f"fill={fill!r} pads a uint8 image: give a value in 0-255")
    return float(int(value))
