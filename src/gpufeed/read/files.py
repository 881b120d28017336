"""Encoded images (the files' own JPEG bytes) as one store, decoded each epoch into a Ragged batch.

A folder of photos decoded is 5-10x its JPEG size: 75,000 Food101 images are 4.9 GiB of JPEG and
about 40 GiB of pixels. When the pixels do not fit, gpufeed keeps the bytes and decodes each
chunk as it is served:

- reading the folder never decodes: each file's bytes are copied as they are, and the size it
  decodes to comes from its header (PIL reads only the header), so RandomResizedCrop can draw its
  boxes before anything is decoded. A header is checked against Pillow's decompression-bomb limit
  and against the file's size (NOTE [ Header sizes against file sizes ]) before anything is
  allocated for its pixels; every file that fails a check is found, not only the first;
- JPEGs decode with :mod:`gpufeed.store.decoders` (TorchCodec's ``decode_jpeg`` where installed, else
  torchvision's): on the CPU on threads (libjpeg-turbo releases the GIL), on a GPU batched through
  nvJPEG. PNGs and WebPs decode with TorchCodec where installed; other files (and those, without it)
  decode with PIL on the CPU, as the user's loader does, never dropped;
- every image is decoded to RGB, as ``ImageFolder``'s loader (``PIL.Image.open(f).convert("RGB")``)
  does, without EXIF rotation (the loader applies none).

Fidelity: on the CPU libjpeg-turbo (TorchCodec's or torchvision's) gives PIL's pixels bit for bit (baseline,
progressive, grayscale and CMYK JPEGs; tests/test_encoded.py checks it). nvJPEG is not
libjpeg-turbo: its difference is measured by ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..device import usable_cores
from ..errors import ConfigError, DataError
from ..store import decoders
from ..store.ragged import Ragged
from ..validate import label_tensor

__all__ = [
    "Encoded",
    "bad_files_error",
    "decode",
    "downscaled",
    "file_samples",
    "header_shapes",
    "read_files",
    "read_folder",
    "scan_headers",
    "undecodable",
]

_JPEG_MAGIC = b"\xff\xd8\xff"


@dataclass(frozen=True)
class Encoded:
    """``N`` encoded images in one byte buffer: image ``i`` is ``data[starts[i]:][:lengths[i]]`` and
    decodes to ``shapes[i]`` = (C, H, W); ``jpeg[i]`` says whether it is a JPEG."""

    data: torch.Tensor  # (total,) uint8, on the host (decoders read host memory, nvJPEG included)
    starts: torch.Tensor  # (N,) int64
    lengths: torch.Tensor  # (N,) int64
    shapes: torch.Tensor  # (N, 3) int64: what each decodes to
    jpeg: torch.Tensor  # (N,) bool
    index: torch.Tensor | None = None  # (N,) each image's sample index in the dataset (None: 0..N-1)
    paths: Sequence[str] | None = None  # the dataset's files, by sample index: what errors name

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
        return replace(self, starts=pick(self.starts), lengths=pick(self.lengths), shapes=pick(self.shapes),
                       jpeg=pick(self.jpeg), index=index)  # fmt: skip

    def compact(self) -> Encoded:
        """A new buffer holding only these images (after :meth:`select`, to free the rest)."""
        packed = _pack([self.file(i) for i in range(len(self))], self.shapes, self.jpeg)
        return replace(packed, index=self.index, paths=self.paths)

    def pin_memory(self) -> Encoded:
        return replace(self, data=self.data.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> Encoded:
        """Encoded bytes stay on the host whatever the device: the decoders read them there."""
        return self


def _pack(files: Sequence[torch.Tensor], shapes: torch.Tensor, jpeg: torch.Tensor) -> Encoded:
    lengths = torch.tensor([f.numel() for f in files], dtype=torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths
    data = torch.cat(list(files)) if files else torch.empty(0, dtype=torch.uint8)
    return Encoded(data, starts, lengths, shapes.clone(), jpeg.clone())


def _is_pil_rgb_loader(loader: Any) -> bool:
    """torchvision's own file loader: ``PIL.Image.open(f).convert("RGB")`` (what the bytes decode to here)."""
    from torchvision.datasets.folder import default_loader, pil_loader

    if loader is pil_loader:
        return True
    if loader is default_loader:
        import torchvision

        return torchvision.get_image_backend() == "PIL"
    return False


def file_samples(dataset: Any) -> list[tuple[str, Any]] | None:
    """``(path, target)`` for every sample of a file-backed dataset whose images are the files decoded to RGB
    by torchvision's PIL loader (``ImageFolder``, ``DatasetFolder`` with the default loader, ``Food101``);
    ``None`` for any other dataset (a custom ``__getitem__`` or loader may do anything to the file)."""
    from torchvision.datasets import DatasetFolder, Food101

    from .fingerprint import standard_getitem

    if not standard_getitem(dataset):
        return None
    if isinstance(dataset, DatasetFolder) and _is_pil_rgb_loader(getattr(dataset, "loader", None)):
        return [(str(p), t) for p, t in dataset.samples]
    if isinstance(dataset, Food101):
        loader = getattr(dataset, "loader", None)  # torchvision >= 0.23; before, PIL's open + convert("RGB")
        if loader is None or _is_pil_rgb_loader(loader):
            return [(str(p), t) for p, t in zip(dataset._image_files, dataset._labels, strict=True)]
    return None


def _size(source: Any, path: str) -> tuple[int, int, int]:
    """The ``(C, H, W)`` an image decodes to as RGB, from its header (PIL reads no pixels to tell), checked
    against Pillow's decompression-bomb limit and against the file's size (:func:`_check_room`)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as im:
            width, height = im.size
            kind = im.format or ""
    except Image.DecompressionBombError as e:  # what the user's loader would raise too
        raise DataError(
            f"{path}: {e} If you trust the file, raise PIL.Image.MAX_IMAGE_PIXELS (your DataLoader refuses it too)"
        ) from e
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as e:  # PIL raises all of these for bad headers
        raise DataError(f"{path}: cannot be read as an image ({type(e).__name__}: {e}); remove it or fix it") from e
    _check_room(path, kind, width, height)
    return 3, height, width


# NOTE [ Header sizes against file sizes ]
# A header can claim any size: a 69-byte PNG that says 9000 x 9000 made a pixel-store build reserve 232 MiB
# before the decode failed. Pillow's bomb limit (an error over 2 * MAX_IMAGE_PIXELS) lets 81 M pixels through,
# so each format's least possible encoding of the claimed size is checked too. These are lower bounds no valid
# file can beat, so no real image is refused:
# - PNG: the filtered rows hold at least 1 bit per pixel plus a filter byte per row, and deflate compresses at
#   most 1032:1 (its longest match, 258 bytes, in 2 bits);
# - JPEG with Huffman coding (SOF0/1/2): every MCU codes at least its first block's DC difference, >= 1 bit.
# Arithmetic-coded and other formats have no such bound; Pillow's limit alone applies to them.
_DEFLATE_MAX_RATIO = 1032


def _check_room(path: str, kind: str, width: int, height: int) -> None:
    """Refuse a file too small to hold the image its header claims (NOTE [ Header sizes against file sizes ])."""
    try:
        size = os.stat(path).st_size
    except (OSError, TypeError):  # not a path (a buffer): nothing to compare
        return
    least = 0
    if kind == "PNG":
        least = height * (1 + -(-width // 8)) // _DEFLATE_MAX_RATIO
    elif kind in ("JPEG", "MPO"):
        mcus = _jpeg_mcus(path)
        least = -(-mcus // 8) if mcus is not None else 0
    if size < least:
        raise DataError(
            f"{path}: its header says {width} x {height} pixels, but {size:,} bytes cannot hold them (a {kind} of that "
            f"size takes at least {least:,} bytes): the file is truncated, damaged or crafted; remove it or fix it"
        )


_HUFFMAN_FRAMES = (0xC0, 0xC1, 0xC2)  # baseline, extended, progressive; 0xC9-0xCB are arithmetic-coded


def _jpeg_mcus(path: str) -> int | None:
    """The MCUs of a Huffman-coded JPEG's frame, from its SOF segment (markers walked by their lengths, a few
    reads); ``None`` for another coding or a header this walk cannot follow (the decoder will judge it)."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\xff\xd8":
                return None
            while True:
                head = f.read(4)
                if len(head) < 4 or head[0] != 0xFF:
                    return None
                marker, length = head[1], int.from_bytes(head[2:4], "big")
                if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame header (SOFn)
                    if marker not in _HUFFMAN_FRAMES:
                        return None
                    body = f.read(max(0, length - 2))
                    if len(body) < 6 or len(body) < 6 + 3 * body[5]:
                        return None
                    height, width = int.from_bytes(body[1:3], "big"), int.from_bytes(body[3:5], "big")
                    factors = [body[7 + 3 * c] for c in range(body[5])]
                    hmax = max((b >> 4 for b in factors), default=1) or 1
                    vmax = max((b & 15 for b in factors), default=1) or 1
                    return -(-width // (8 * hmax)) * -(-height // (8 * vmax))
                if marker == 0xDA:  # scan data before any frame header: not a JPEG this walk follows
                    return None
                f.seek(length - 2, 1)
    except OSError:
        return None


def _read_into(path: str, out: torch.Tensor) -> tuple[tuple[int, int, int], bool]:
    """Read a file straight into ``out`` (its size, from ``stat``); the (C, H, W) it decodes to as RGB (from
    its header), and whether it is a JPEG."""
    try:
        with open(path, "rb") as f:
            got = f.readinto(out.numpy().data)
            more = f.read(1)
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from e
    if got != out.numel() or more:
        raise DataError(f"{path} changed size while gpufeed read it; read the folder again once it is written")
    return _size(path, path), bytes(out[:3].numpy()) == _JPEG_MAGIC


def _header(path: str) -> tuple[int, int, int]:
    return _size(path, path)  # a few KB read, not the file


def _caught(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning its DataError instead of raising it: every bad file is found, not the first one."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except DataError as e:
            return e

    return call


def _run(fn: Callable[..., Any], args: list[Sequence[Any]], threads: int, what: str, progress: bool) -> list[Any]:
    """``fn`` over ``zip(*args)`` on ``threads`` threads with a progress bar; a DataError is a result, not a raise."""
    from tqdm.auto import tqdm

    n = len(args[0])
    with ThreadPoolExecutor(threads) as pool, tqdm(total=n, desc=what, unit="file", disable=not progress) as bar:
        out = []
        for item in pool.map(_caught(fn), *args):
            out.append(item)
            bar.update()
    return out


def bad_files_error(bad: dict[int, str], total: int, what: str) -> DataError:
    """One error for every bad file of a folder (``bad``: sample index -> why), with both fixes."""
    lines = "\n".join(f"  {why}" for _, why in sorted(bad.items()))
    return DataError(
        f"{len(bad):,} of {total:,} files of {what} cannot be used:\n{lines}\nremove or fix them, or pass "
        "on_error='skip' to leave them out (one warning lists them; labels stay with their images)"
    )


def scan_headers(
    dataset: Any, num_workers: int | None = None, progress: bool = True
) -> tuple[torch.Tensor, dict[int, str]]:
    """The ``(C, H, W)`` each file of a file-backed dataset decodes to, from the headers alone (a few KB read
    per file), and the files whose header is unusable (sample index -> why; their shape is ``(3, 0, 0)``)."""
    samples = file_samples(dataset)
    if samples is None:
        raise DataError(f"{type(dataset).__name__} is not a folder of image files read by torchvision's PIL loader")
    threads = max(1, usable_cores() if num_workers is None else num_workers)
    got = _run(_header, [[p for p, _ in samples]], threads, "gpufeed: reading headers", progress)
    bad = {i: str(r) for i, r in enumerate(got) if isinstance(r, DataError)}
    shapes = [(3, 0, 0) if isinstance(r, DataError) else r for r in got]
    return torch.tensor(shapes, dtype=torch.int64).view(-1, 3), bad


def header_shapes(dataset: Any, num_workers: int | None = None, progress: bool = True) -> torch.Tensor:
    """The ``(C, H, W)`` each file of a file-backed dataset decodes to, from the headers alone (a few KB
    read per file): what a store of them would take is known before anything is read in full. Every file
    whose header is unusable is named in one DataError."""
    shapes, bad = scan_headers(dataset, num_workers, progress)
    if bad:
        raise bad_files_error(bad, len(shapes), type(dataset).__name__)
    return shapes


def read_folder(
    dataset: Any, num_workers: int | None = None, progress: bool = True
) -> tuple[Encoded, torch.Tensor, dict[int, str]] | None:
    """The files of a file-backed dataset (see :func:`file_samples`) as an :class:`Encoded` store, its labels
    (``target_transform`` applied) and the files that cannot be used (sample index -> why: unreadable, or a
    header that is not an image's or claims more than the file can hold); ``None`` if the dataset is not one.
    Nothing is decoded. A bad file keeps its place (shape ``(3, 0, 0)``): leave it out with ``select``."""
    samples = file_samples(dataset)
    if samples is None:
        return None
    if not samples:
        raise DataError(f"the dataset ({type(dataset).__name__}) is empty (len 0); nothing to load")
    paths = [p for p, _ in samples]
    sizes, bad = [], {}
    for i, p in enumerate(paths):
        try:
            sizes.append(Path(p).stat().st_size)
        except OSError as e:
            sizes.append(0)
            bad[i] = f"{p}: cannot be read ({e.strerror or e})"
    lengths = torch.tensor(sizes, dtype=torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths
    data = torch.empty(int(lengths.sum()), dtype=torch.uint8)  # one buffer, each file read into its part
    views = [data[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
    threads = max(1, usable_cores() if num_workers is None else num_workers)
    todo = [i for i in range(len(paths)) if i not in bad]
    got = dict(zip(todo, _run(_read_into, [[paths[i] for i in todo], [views[i] for i in todo]], threads,
                              "gpufeed: reading files", progress), strict=True))  # fmt: skip
    bad |= {i: str(r) for i, r in got.items() if isinstance(r, DataError)}
    read = [((3, 0, 0), False) if i in bad else got[i] for i in range(len(paths))]
    shapes = torch.tensor([shape for shape, _ in read], dtype=torch.int64)
    jpeg = torch.tensor([is_jpeg for _, is_jpeg in read], dtype=torch.bool)
    target_transform = getattr(dataset, "target_transform", None)
    targets = [target_transform(t) if target_transform is not None else t for _, t in samples]
    encoded = Encoded(data, starts, lengths, shapes, jpeg, paths=paths)
    return encoded, label_tensor(targets, f"{type(dataset).__name__} targets"), dict(sorted(bad.items()))


def read_files(
    dataset: Any, num_workers: int | None = None, progress: bool = True
) -> tuple[Encoded, torch.Tensor] | None:
    """The files of a file-backed dataset (see :func:`file_samples`) as an :class:`Encoded` store and its
    labels (``target_transform`` applied); ``None`` if the dataset is not one. Nothing is decoded. Every
    file that cannot be used is named in one DataError (:func:`read_folder` returns them instead)."""
    read = read_folder(dataset, num_workers, progress)
    if read is None:
        return None
    encoded, labels, bad = read
    if bad:
        raise bad_files_error(bad, len(encoded), type(dataset).__name__)
    return encoded, labels


def undecodable(encoded: Encoded, threads: int, progress: bool = True) -> dict[int, str]:
    """The images of ``encoded`` that do not decode (by the decoders each batch would use) to their header's
    size: position -> why. A full decode of every file, on ``threads`` threads, nothing kept."""

    def check(i: int) -> None:
        image = _decode_one(encoded, i)
        c, h, w = encoded.shapes[i].tolist()
        if tuple(image.shape) != (h, w, c):
            got = tuple(image.shape)
            raise DataError(f"{encoded.name(i)} decoded to {got} (H, W, C), but its header said {(h, w, c)}")

    got = _run(check, [list(range(len(encoded)))], threads, "gpufeed: checking that the files decode", progress)
    return {i: str(r) for i, r in enumerate(got) if isinstance(r, DataError)}


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The decoders' threads: one pool for the process, threads started as work needs them."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(64, thread_name_prefix="gpufeed-decode")
        return _POOL


def _forget_pool() -> None:
    # A forked child inherits the pool but not its threads: work handed to it would wait forever.
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _decode_one(encoded: Encoded, i: int) -> torch.Tensor:
    """Image ``i`` decoded to RGB, as ``(H, W, C)`` (how both decoders lay pixels out)."""
    data = encoded.file(i)
    image: torch.Tensor | None = None
    try:
        image = decoders.decode_jpeg(data) if bool(encoded.jpeg[i]) else decoders.decode_still(data)
    except RuntimeError:  # e.g. a truncated file, which PIL may still read (ImageFile.LOAD_TRUNCATED_IMAGES)
        pass
    return image.permute(1, 2, 0) if image is not None else _pil_decode(encoded, i)


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

    def part(first: int, step: int) -> None:
        from torchvision.transforms.v2.functional import resize

        for i in range(first, n, step):
            image = _decode_one(encoded, i)
            c, h, w = shapes[i]
            if tuple(image.shape) != (h, w, c):
                got = tuple(image.shape)
                raise DataError(f"{encoded.name(i)} decoded to {got} (H, W, C), but its header said {(h, w, c)}")
            _, th, tw = targets[i]
            if (th, tw) != (h, w):  # channels-last in, as the uint8 kernel runs fastest
                chw = image.permute(2, 0, 1).unsqueeze(0)
                image = resize(chw, [th, tw], antialias=True)[0].permute(1, 2, 0)
            out[offsets[i] : offsets[i] + c * th * tw].view(th, tw, c).copy_(image)

    workers = min(usable_cores() if threads is None else threads, n)
    if workers > 1:
        list(_pool().map(part, range(workers), [workers] * workers))
    else:
        part(0, 1)
    return Ragged(out, starts, target)


def _decode_cuda(encoded: Encoded, device: torch.device, starts: torch.Tensor) -> Ragged:
    jpegs = encoded.jpeg.nonzero().flatten().tolist()
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
        decoded[i] = _pil_decode(encoded, i).permute(2, 0, 1).contiguous().to(device, non_blocking=True)
    for i, image in decoded.items():
        if tuple(image.shape) != tuple(encoded.shapes[i].tolist()):
            shape = tuple(encoded.shapes[i].tolist())
            raise DataError(f"{encoded.name(i)} decoded to {tuple(image.shape)}, but its header said {shape}")
    # nvJPEG gives (C, H, W) images: one concatenation packs them channels-first, which the batched kernel reads.
    data = torch.cat([decoded[i].reshape(-1) for i in range(len(encoded))])
    return Ragged(data, starts, encoded.shapes, hwc=False)
