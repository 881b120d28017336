"""Encoded: images kept as their files' own bytes (JPEG, PNG, ...), decoded each time a chunk is served.

A folder of photos decoded is 5-10x its JPEG size: 75,000 Food101 images are 4.9 GiB of JPEG and about 40 GiB
of pixels. When the pixels do not fit, gpufeed keeps the bytes and decodes each chunk into a
:class:`~gpufeed.store.ragged.Ragged` batch as it is served (each image's decoded size is known from its header,
read by :mod:`gpufeed.read.files`, so RandomResizedCrop can draw its boxes before anything is decoded):

- JPEGs decode with :mod:`gpufeed.store.decoders` (TorchCodec's ``decode_jpeg`` where installed, else
  torchvision's): on the CPU on threads (libjpeg-turbo releases the GIL), on a GPU batched through nvJPEG. PNGs
  and WebPs decode with TorchCodec where installed; other files (and those, without it) decode with PIL on the
  CPU, as the user's loader does, never dropped;
- every image is decoded to RGB, as ``ImageFolder``'s loader (``PIL.Image.open(f).convert("RGB")``) does,
  without EXIF rotation (the loader applies none); a store whose source turns images upright (Hugging Face
  ``datasets`` applies ``PIL.ImageOps.exif_transpose``) carries each image's orientation (``orient``), and those
  images are decoded by PIL and turned as Pillow turns them.

Fidelity: on the CPU libjpeg-turbo (TorchCodec's or torchvision's) gives PIL's pixels bit for bit (baseline,
progressive, grayscale and CMYK JPEGs; tests/test_encoded.py checks it). nvJPEG is not libjpeg-turbo: its
difference is measured by ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy
import torch

from ..device import usable_cores
from ..errors import ConfigError, DataError
from ..threads import spread
from . import decoders
from .base import Store, need
from .ragged import Ragged, check_index, check_ragged, sizes

__all__ = ["Encoded", "decode", "decode_one", "downscaled", "upright"]


@dataclass(frozen=True)
class Encoded(Store):
    """``N`` encoded images in one byte buffer: image ``i`` is ``data[starts[i]:][:lengths[i]]`` and
    decodes to ``shapes[i]`` = (C, H, W); ``jpeg[i]`` says whether it is a JPEG."""

    data: torch.Tensor  # (total,) uint8, on the host (decoders read host memory, nvJPEG included)
    starts: torch.Tensor  # (N,) int64
    lengths: torch.Tensor  # (N,) int64
    shapes: torch.Tensor  # (N, 3) int64: what each decodes to
    jpeg: torch.Tensor  # (N,) bool
    index: torch.Tensor | None = None  # (N,) each image's sample index in the dataset (None: 0..N-1)
    paths: Sequence[str] | None = None  # the dataset's files, by sample index: what errors name
    orient: torch.Tensor | None = None  # (N,) uint8 EXIF orientation to apply once decoded (None: none, as a folder)
    # data is a view of a memory-mapped file (a Hugging Face dataset's Arrow file): pinning it would copy the whole
    # column into page-locked RAM, so nvJPEG reads it where it lies (its copy in is then a pageable one)
    mapped: bool = False
    nvjpeg: bool = False  # placed for a CUDA device: the JPEGs are decoded by nvJPEG

    kind = "jpeg"
    ragged = True
    host_bytes = True

    def __len__(self) -> int:
        return self.starts.shape[0]

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.uint8  # what it decodes to

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.starts.nbytes + self.lengths.nbytes + self.shapes.nbytes + self.jpeg.nbytes

    @property
    def pixel_bytes(self) -> int:
        """What the images take decoded."""
        return int(self.shapes.prod(1).sum())

    @property
    def sample_bytes(self) -> float:
        return self.pixel_bytes / len(self)  # what a chunk takes decoded

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return (len(self), int(self.shapes[0, 0])) if len(self) else (0, 0)

    def file(self, i: int) -> torch.Tensor:
        """The bytes of image ``i`` (a view)."""
        start = int(self.starts[i])
        return self.data[start : start + int(self.lengths[i])]

    def name(self, i: int) -> str:
        """Image ``i`` as an error names it: its sample index in the dataset, and its file when known."""
        sample = int(self.index[i]) if self.index is not None else i
        return f"sample {sample} ({self.paths[sample]})" if self.paths is not None else f"sample {sample}"

    def select(self, idx: torch.Tensor) -> Encoded:
        """The images at ``idx``, as views of the same buffer."""
        idx = idx.cpu()
        pick = lambda t: t.index_select(0, idx)  # noqa: E731
        index = self.index.index_select(0, idx) if self.index is not None else idx.clone()
        orient = pick(self.orient) if self.orient is not None else None
        return replace(self, starts=pick(self.starts), lengths=pick(self.lengths), shapes=pick(self.shapes),
                       jpeg=pick(self.jpeg), index=index, orient=orient)  # fmt: skip

    def compact(self) -> Encoded:
        """A new buffer holding only these images (after :meth:`select`, to free the rest)."""
        packed = _pack([self.file(i) for i in range(len(self))], self.shapes, self.jpeg)
        return replace(packed, index=self.index, paths=self.paths, orient=self.orient)

    def pin_memory(self) -> Encoded:
        return replace(self, data=self.data.pin_memory())

    def placed(self, storage: str, device: torch.device) -> Encoded:
        # whatever the tier: the decoders read host memory; nvJPEG's copies in are faster from pinned memory
        if device.type != "cuda":
            return self
        return replace(self if self.mapped else self.pin_memory(), nvjpeg=True)

    def batch(self, idx: torch.Tensor, device: torch.device) -> Ragged:
        return decode(self.select(idx), device)

    def fingerprint(self, idx: torch.Tensor) -> list[torch.Tensor]:
        # decoded on the CPU, as a pixel store's were: a state saved with one store resumes with the other
        # (store="auto" picks by the memory budget, which differs by machine)
        picked = self.select(idx)
        try:
            pixels = decode(picked, torch.device("cpu"), threads=1)
        except DataError:  # not decodable here: its bytes, then (a store of such files fails when served anyway)
            return [self.shapes, picked.compact().data]
        return [self.shapes, *(pixels.image(i).contiguous() for i in range(len(pixels)))]

    def describe(self) -> str:
        where = "nvJPEG, batched" if self.nvjpeg else f"torchvision on {usable_cores()} CPU thread(s)"
        jpegs = int(self.jpeg.sum())
        others = f", the {len(self) - jpegs:,} others by PIL on the CPU" if jpegs < len(self) else ""
        what = f"encoded files: {len(self):,} images decoding to 3 channels, {sizes(self.shapes)}"
        return f"{what}; {jpegs:,} JPEGs decoded by {where}{others}"

    def arrays(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        fields = {k: getattr(self, k) for k in ("starts", "lengths", "shapes", "jpeg")}
        if self.orient is not None:
            fields["orient"] = self.orient
        return fields | {"bytes": self.data}, {"store": self.kind}

    @classmethod
    def from_arrays(cls, arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> Encoded:
        data, starts, lengths = need(arrays, "bytes"), need(arrays, "starts"), need(arrays, "lengths")
        shapes, jpeg = need(arrays, "shapes"), need(arrays, "jpeg")
        check_index(data, starts, lengths, shapes, len(need(arrays, "labels")))
        return cls(data, starts, lengths, shapes, jpeg, orient=arrays.get("orient"))

    def rotated(self, i: int) -> bool:
        """Whether image ``i`` is turned by its EXIF orientation once decoded."""
        return self.orient is not None and int(self.orient[i]) > 1

    def check(self) -> None:
        check_ragged(len(self), self.dtype, self.shapes)


def _pack(files: Sequence[torch.Tensor], shapes: torch.Tensor, jpeg: torch.Tensor) -> Encoded:
    lengths = torch.tensor([f.numel() for f in files], dtype=torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths
    data = torch.cat(list(files)) if files else torch.empty(0, dtype=torch.uint8)
    return Encoded(data, starts, lengths, shapes.clone(), jpeg.clone())


def decode_one(encoded: Encoded, i: int) -> torch.Tensor:
    """Image ``i`` of ``encoded`` decoded to RGB, as ``(H, W, C)`` (how both decoders lay pixels out)."""
    if encoded.rotated(i):  # PIL's pixels, then Pillow's turn (a decoder may turn some formats itself)
        return upright(_pil_decode(encoded, i), int(encoded.orient[i]))  # type: ignore[index]
    data = encoded.file(i)
    image: torch.Tensor | None = None
    try:
        image = decoders.decode_jpeg(data) if bool(encoded.jpeg[i]) else decoders.decode_still(data)
    except RuntimeError:  # e.g. a truncated file, which PIL may still read (ImageFile.LOAD_TRUNCATED_IMAGES)
        pass
    return image.permute(1, 2, 0) if image is not None else _pil_decode(encoded, i)


def upright(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """An ``(H, W, C)`` image turned as ``PIL.ImageOps.exif_transpose`` turns one of that EXIF orientation
    (2-8; anything else leaves it as it is): pixels moved, never resampled."""
    hw = (0, 1)
    turns = {
        2: lambda t: t.flip(1),  # FLIP_LEFT_RIGHT
        3: lambda t: t.flip(hw),  # ROTATE_180
        4: lambda t: t.flip(0),  # FLIP_TOP_BOTTOM
        5: lambda t: t.transpose(0, 1),  # TRANSPOSE
        6: lambda t: torch.rot90(t, -1, hw),  # ROTATE_270 (counter-clockwise), a quarter turn clockwise
        7: lambda t: t.transpose(0, 1).flip(hw),  # TRANSVERSE
        8: lambda t: torch.rot90(t, 1, hw),  # ROTATE_90 (counter-clockwise)
    }
    turn = turns.get(orientation)
    return turn(image).contiguous() if turn is not None else image


def _pil_decode(encoded: Encoded, i: int) -> torch.Tensor:
    """As the user's loader decodes it: ``PIL.Image.open(f).convert("RGB")``; a file it cannot read is named."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(io.BytesIO(encoded.file(i).numpy().tobytes())) as im:
            return torch.from_numpy(np.asarray(im.convert("RGB")).copy())
    except Exception as e:  # what PIL raises for a damaged file varies (OSError, SyntaxError, ValueError, ...)
        raise DataError(
            f"{encoded.name(i)} cannot be decoded ({type(e).__name__}: {e}); PIL cannot read it either, so a "
            "DataLoader would fail on it too: remove or fix the file"
        ) from e


def downscaled(shapes: torch.Tensor, max_side: int | None) -> torch.Tensor:
    """The ``(C, H, W)`` of each image once its longer side is at most ``max_side``, computed as torchvision's
    ``Resize(size=None, max_size=max_side)`` does; images already within it keep their size."""
    if max_side is None:
        return shapes
    out = shapes.clone()
    h, w = shapes[:, 1], shapes[:, 2]
    long, short = torch.maximum(h, w), torch.minimum(h, w)
    shrink = long > max_side
    # torchvision: int(max_size * short / long), at least 1 pixel (a 1 x 1000 strip stays 1 high)
    new_short = (max_side * short.double() / long.double()).floor().long().clamp(min=1)
    out[:, 1] = torch.where(shrink, torch.where(h >= w, max_side, new_short), h)
    out[:, 2] = torch.where(shrink, torch.where(h >= w, new_short, max_side), w)
    return out


def decode(
    encoded: Encoded,
    device: torch.device,
    threads: int | None = None,
    max_side: int | None = None,
    out: torch.Tensor | None = None,
) -> Ragged:
    """Decode every image into one Ragged batch on ``device``.

    On the CPU the images are spread over ``threads`` threads (default: the usable cores), each
    writing straight into the batch's channels-last buffer. On a GPU the JPEGs go to nvJPEG in one
    batched call and are packed channels-first by one concatenation; other files decode on the CPU
    and are copied in. ``max_side`` (CPU): images whose longer side exceeds it are resized (bilinear,
    antialiased, torchvision's kernel) to :func:`downscaled`'s size as they are decoded. ``out`` (CPU): the
    uint8 buffer to decode into (a part of a larger store, a mapped file), of the decoded size.
    """
    n = len(encoded)
    if device.type == "cuda":
        if max_side is not None:
            raise ConfigError("max_side is applied while a pixel store is built, on the CPU")
        sizes = encoded.shapes.prod(1)
        return _decode_cuda(encoded, device, torch.cumsum(sizes, 0) - sizes)
    target = downscaled(encoded.shapes, max_side)
    sizes = target.prod(1)
    starts = torch.cumsum(sizes, 0) - sizes
    if out is None:
        out = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    elif out.dtype != torch.uint8 or out.numel() != int(sizes.sum()):
        raise ValueError(f"out: {out.numel()} {out.dtype} elements for {int(sizes.sum())} uint8 pixels")
    shapes, targets, offsets = encoded.shapes.tolist(), target.tolist(), starts.tolist()

    from torchvision.transforms.v2.functional import resize

    def each(i: int) -> None:
        image = decode_one(encoded, i)
        c, h, w = shapes[i]
        if tuple(image.shape) != (h, w, c):
            got = tuple(image.shape)
            raise DataError(f"{encoded.name(i)} decoded to {got} (H, W, C), but its header said {(h, w, c)}")
        _, th, tw = targets[i]
        if (th, tw) != (h, w):  # channels-last in, as the uint8 kernel runs fastest
            chw = image.permute(2, 0, 1).unsqueeze(0)
            image = resize(chw, [th, tw], antialias=True)[0].permute(1, 2, 0)
        # numpy's copy on the pool's threads (see gpufeed.augment.pillow_resize: torch's would start OpenMP teams)
        numpy.copyto(out[offsets[i] : offsets[i] + c * th * tw].view(th, tw, c).numpy(), image.numpy())

    spread(each, n, threads)
    return Ragged(out, starts, target)


def _decode_cuda(encoded: Encoded, device: torch.device, starts: torch.Tensor) -> Ragged:
    jpegs = [i for i in encoded.jpeg.nonzero().flatten().tolist() if not encoded.rotated(i)]
    decoded: dict[int, torch.Tensor] = {}
    if jpegs:
        try:
            images = decoders.decode_jpegs([encoded.file(i) for i in jpegs], device)
            decoded.update((i, image) for i, image in zip(jpegs, images, strict=True) if image is not None)
        except RuntimeError as batch_error:  # one file nvJPEG refuses fails the batch: each on its own, PIL after
            for i in jpegs:
                try:
                    image = decoders.decode_jpegs([encoded.file(i)], device)[0]
                except RuntimeError:
                    continue
                if image is not None:
                    decoded[i] = image
            if len(jpegs) > 1 and not decoded:  # not a bad file: the GPU decoder itself fails; say so, once
                decoders.warn_once(
                    "gpu-decoder-fails",
                    f"gpufeed: the GPU JPEG decoder ({decoders.backend()}) refused every JPEG of a chunk "
                    f"({batch_error}); they are decoded by PIL on the CPU instead, far slower. Check that the "
                    "decoder's build matches your torch and CUDA",
                )
    for i in sorted(set(range(len(encoded))) - set(decoded)):
        image = decode_one(encoded, i) if encoded.rotated(i) else _pil_decode(encoded, i)
        decoded[i] = image.permute(2, 0, 1).contiguous().to(device, non_blocking=True)
    for i, image in decoded.items():
        if tuple(image.shape) != tuple(encoded.shapes[i].tolist()):
            shape = tuple(encoded.shapes[i].tolist())
            raise DataError(f"{encoded.name(i)} decoded to {tuple(image.shape)}, but its header said {shape}")
    # nvJPEG gives (C, H, W) images: one concatenation packs them channels-first, which the batched kernel reads.
    data = torch.cat([decoded[i].reshape(-1) for i in range(len(encoded))])
    return Ragged(data, starts, encoded.shapes, hwc=False)
