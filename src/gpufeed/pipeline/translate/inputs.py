"""Samples that are numpy arrays or tensors, not PIL images: what torchvision does with them at an op's place before
the first conversion, measured with torchvision 0.29 (tests/augment/test_modes.py re-measures each).

A ``__getitem__`` that returns ``np.asarray(image)`` or a tensor hands the pipeline what PIL-only code never sees:

- torchvision's v1 ops take PIL images or tensors: on an array each raises on every sample it is drawn for
  (``TypeError: img should be PIL Image``); only ``ToTensor`` converts one. On a tensor, ``ToTensor`` and
  ``PILToTensor`` raise (``pic should be PIL Image``);
- torchvision's v2 ops pass an array by unchanged, as they pass any value that is not an image (``ToImage`` and
  ``ToTensor`` convert it); those that need the image's size raise (``No image ... was found in the sample``).

gpufeed stores the array as an image and would run each op on it, so it would serve a flipped or jittered image
where torchvision raises, or where torchvision leaves the array as it is. A refusal of torchvision's is refused here
with its words (no fallback runs it either); an op torchvision passes by is an UnsupportedTransformError (the fallback
runs torchvision's no-op); both name the sample and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError, UnsupportedTransformError
from .state import is_v2

__all__ = ["check_form", "form"]

_CONTAINERS = ("RandomApply", "RandomChoice", "RandomOrder")
# v2's ops that read the image's size (query_size / query_chw) and so raise where they find none
_V2_SIZED = (
    "RandomCrop",
    "RandomResizedCrop",
    "RandomAffine",
    "RandomPerspective",
    "RandomGrayscale",
    "RandomErasing",
    "TrivialAugmentWide",
    "RandAugment",
    "AutoAugment",
    "AugMix",
)
_ARRAY_FIX = (
    "make it an image first: Image.fromarray(array) in __getitem__ (as torchvision's datasets do), or ToTensor() / "
    "v2.ToImage() at the start of the transform"
)


def form(sample: Any) -> str:
    """What a sample is: ``"PIL"``, ``"ndarray"``, ``"tensor"`` or its type's name."""
    import numpy as np
    import torch
    from PIL import Image

    if isinstance(sample, Image.Image):
        return "PIL"
    if isinstance(sample, np.ndarray):
        return "ndarray"
    return "tensor" if isinstance(sample, torch.Tensor) else type(sample).__name__


def _drawn(op: Any) -> bool:
    """A random op with p=0 never runs, so torchvision never raises on it."""
    return float(getattr(op, "p", 1.0)) > 0


def check_form(ops: Sequence[Any], sample_form: str, where: str) -> None:
    """Raise what ``ops`` (the device part of a pipeline, torchvision's ops) meet on samples of ``sample_form``
    (:func:`form`) before their first conversion: the ConfigError torchvision's refusal is, or
    UnsupportedTransformError where torchvision v2 passes an array by unchanged. ``where`` names a sample
    (``MyDataset[0]``). PIL images: :mod:`.modes`."""
    from . import flatten, kind

    if sample_form not in ("ndarray", "tensor"):
        return
    for op in ops:
        name, v2 = kind(op), is_v2(op)
        head = f"{op!r} on {'numpy arrays' if sample_form == 'ndarray' else 'tensors'} ({where} is one)"
        if sample_form == "tensor":
            if name in ("ToTensor", "PILToTensor") and not v2:
                said = "pic should be PIL Image" + (" or ndarray" if name == "ToTensor" else "")
                raise ConfigError(
                    f"{head}: torchvision refuses it (TypeError: '{said}. Got <class 'torch.Tensor'>'); the dataset "
                    "gives tensors already: use ConvertImageDtype(torch.float) (v2.ToDtype(torch.float32, "
                    "scale=True)) for ToTensor's /255, or nothing for PILToTensor"
                )
            if name in ("ToTensor", "PILToTensor", "ToImage", "MaybeToTensor", "MaybePILToTensor"):
                return
            continue
        if name in ("ToImage", "MaybeToTensor") or (name == "ToTensor"):
            return  # converts the array, as it converts a PIL image
        if name in _CONTAINERS and v2:
            check_form([inner for t in op.transforms for inner in flatten(t)], sample_form, where)
            continue
        if name == "Identity" or not _drawn(op):
            continue
        if not v2:
            said = "pic" if name == "PILToTensor" else "img"
            raise ConfigError(
                f"{head}: torchvision refuses it (TypeError: '{said} should be PIL Image. Got <class "
                f"'numpy.ndarray'>' or the like, on every sample it is drawn for: v1's ops take PIL images or "
                f"tensors); {_ARRAY_FIX}"
            )
        if name in _V2_SIZED:
            raise ConfigError(
                f"{head}: torchvision refuses it (TypeError: 'No image, video, mask, bounding box of keypoint was "
                f"found in the sample' or the like: v2 does not take an array for an image); {_ARRAY_FIX}"
            )
        raise UnsupportedTransformError(
            f"{head}: torchvision v2 passes a numpy array by unchanged, so in your pipeline it does nothing (on a "
            f"PIL image or a tensor it would); put v2.ToImage() before it (Image.fromarray(array) in __getitem__ "
            "does the same), or pass fallback='prefetch' to run your pipeline as it is"
        )
