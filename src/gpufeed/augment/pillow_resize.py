"""RandomResizedCrop's boxes resized by Pillow itself on the CPU, as torchvision resizes a PIL image: exact by
definition, on the usable cores (Pillow's resize lets go of the GIL), and, for a Compose, with the flips and the
Normalize after it done to each image while it is in the cache (``fixed_point`` computes the same integers where
Pillow cannot run: on a GPU).

Each box is handed to Pillow as the rows it spans in the channels-last image (no copy of the box first: Pillow copies
the rows into its own image, as it would from any array); the flips are views;
``Normalize``'s arithmetic on the uint8 image (``x / 255``, or ``* (1 / 255)``, then ``- mean`` and ``/ std``, each a
float32 operation rounded once) is numpy's here and torch's in ``functional.normalize``: the same bits.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy
import torch

from ..threads import spread
from .functional import Flips, Normalizing, float_constants

__all__ = ["pillow_resized"]

# an image's box and output pixels together from which the boxes are resized on the pool's threads
_THREADED_PIXELS = 24_000


def pillow_resized(
    crops: Sequence[torch.Tensor],
    size: tuple[int, int],
    mode: str,
    flips: Flips = (),
    normalize: Normalizing | None = None,
) -> torch.Tensor:
    """Each ``(C, h, w)`` uint8 crop (1 or 3 channels, on the CPU) resized to ``size`` by Pillow (``mode``: bilinear or
    bicubic), stacked ``(N, C, *size)``; then, per sample, ``flips`` and ``normalize`` (float32 out). On the usable
    cores: 1.9x one thread at 224 px on 2."""
    c = crops[0].shape[0] if crops else 3
    out = torch.empty((len(crops), c, *size), dtype=torch.float32 if normalize is not None else torch.uint8)
    flipped = [(axis, mask.tolist()) for axis, mask in flips]
    stats = None
    if normalize is not None:
        mean, std, reciprocal = normalize
        m, s = (t.view(-1, 1, 1).numpy() for t in float_constants(mean, std, c))  # checked as Normalize checks them
        stats = (numpy.float32(1 / 255) if reciprocal else None, m, s)

    def each(i: int) -> None:
        pixels = _resized(crops[i], size, mode)  # (H, W, C) uint8
        for axis, mask in flipped:
            if mask[i]:
                pixels = pixels[:, ::-1] if axis == "cols" else pixels[::-1]
        if stats is None:
            numpy.copyto(out[i].numpy(), pixels.transpose(2, 0, 1))
            return
        # in place in the batch: numpy's float32 arithmetic per image, 0.12 ms at 224 px on one core (torch's
        # on the whole batch: 0.2 ms an image on two)
        scale, mean, std = stats
        values = out[i].numpy()
        numpy.copyto(values, pixels.transpose(2, 0, 1))
        if scale is not None:
            values *= scale
        else:
            values /= numpy.float32(255)
        values -= mean
        values /= std

    # numpy's copies and arithmetic on the pool's threads, not torch's: a torch operation large enough to run in
    # parallel gives each calling thread OpenMP threads of its own, which then compete with the loader's (torch's
    # per-image resizes ran 1.9x slower in the process afterwards)
    # on the pool only for images with enough work: below, handing the GIL between the threads at each of an
    # image's Pillow and numpy calls costs more than the second core gives. 256 images on 2 cores, one thread
    # against the pool: 160 px images to 64 px (about 18,000 pixels of box and output) 43 ms against 53; 128 px
    # to 128, 25,000: 84 against 74; photos around 300 x 400 to 32 px, 66,000: 72 against 54; 32 px to 32: 12 against 25
    work = sum(crop.shape[1] * crop.shape[2] for crop in crops) / max(len(crops), 1) + size[0] * size[1]
    spread(each, len(crops), None if work >= _THREADED_PIXELS else 1)
    return out


def _resized(crop: torch.Tensor, size: tuple[int, int], mode: str) -> numpy.ndarray:
    """One crop resized by Pillow: ``(H, W, C)`` uint8."""
    import PIL.Image

    resample = PIL.Image.Resampling.BICUBIC if mode == "bicubic" else PIL.Image.Resampling.BILINEAR
    c, h, w = crop.shape
    hwc = crop.permute(1, 2, 0)
    kind = "L" if c == 1 else "RGB"
    stride = hwc.stride(0)
    room = crop.untyped_storage().nbytes() - crop.storage_offset()  # Pillow wants whole rows of the stride
    rows_packed = hwc.stride(2) == 1 and hwc.stride(1) == c and stride >= w * c  # of a channels-last image
    if rows_packed and h * stride <= room:  # Pillow reads them where they are (copying them into its own image)
        rows = torch.as_strided(hwc, (h * stride,), (1,))
        image = PIL.Image.frombuffer(kind, (w, h), rows.numpy(), "raw", kind, stride, 1)
    else:
        pixels = numpy.ascontiguousarray(hwc.numpy())
        image = PIL.Image.fromarray(pixels[..., 0] if c == 1 else pixels)
    return _pixels(image.resize((size[1], size[0]), resample))[..., :c]


def _pixels(image: Any) -> numpy.ndarray:
    """A Pillow image's pixels where Pillow keeps them, ``(H, W, 4)`` for RGB (the fourth byte unused) or
    ``(H, W, 1)``, read-only, through the Arrow C data interface; ``numpy.array(image)``'s copy where Pillow cannot
    export them as whole rows (before 11.3; an image stored in several blocks; rows padded by ``PILLOW_ALIGNMENT``).
    The copy holds the GIL (33 us a 224 px image, 0.7x on two threads); the view takes 2.6 us."""
    import PIL.Image

    aligned = getattr(PIL.Image.core, "get_alignment", lambda: 1)() == 1  # padded rows: 12.0 still exported them
    export = getattr(image.im, "__arrow_c_array__", None) if aligned and _exports_safely() else None
    try:
        capsule = export() if export is not None else None
    except ValueError:  # "rows are not contiguous in memory": several blocks
        capsule = None
    if capsule is None:
        return numpy.array(image).reshape(image.height, image.width, -1)
    array = _ArrowArray.from_address(_capsule_pointer(capsule, b"arrow_array"))
    if array.n_children:  # RGB: a fixed-size list of 4 bytes a pixel
        values = array.children[0].contents
        bands, start = 4, values.buffers[1] + values.offset + 4 * array.offset
    else:  # L: one byte a pixel
        bands, start = 1, array.buffers[1] + array.offset
    return numpy.asarray(_Exported(capsule, start, (image.height, image.width, bands)))


@functools.cache
def _exports_safely() -> bool:
    """Pillow 11.2's export never released an RGB image (python-pillow/Pillow#8950, fixed in 11.3): a copy there."""
    import PIL

    try:
        return tuple(int(part) for part in PIL.__version__.split(".")[:2]) >= (11, 3)
    except ValueError:  # a version this cannot read: the copy
        return False


class _ArrowArray(ctypes.Structure):
    """The Arrow C data interface's ``struct ArrowArray`` (a stable ABI)."""


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class _Exported:
    """An exported image's bytes as numpy reads them; holds the capsule, whose release (when the last view of
    the pixels goes) lets Pillow free them."""

    def __init__(self, capsule: object, start: int, shape: tuple[int, int, int]) -> None:
        self.capsule = capsule
        self.__array_interface__ = {"version": 3, "data": (start, True), "shape": shape, "typestr": "|u1"}
