"""A folder's image files (``ImageFolder``, ``Food101``): their bytes and headers, read as an Encoded store.

Reading a folder never decodes: each file's bytes are copied as they are into one
:class:`~gpufeed.store.encoded.Encoded` store, and the size it decodes to comes from its header (PIL reads only
the header), so RandomResizedCrop can draw its boxes before anything is decoded. A header is checked against
Pillow's decompression-bomb limit and against the file's size (NOTE [ Header sizes against file sizes ]) before
anything is allocated for its pixels; every file that fails a check is found, not only the first. Decoding the
store lives beside it, in :mod:`gpufeed.store.encoded`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ..device import fmt_bytes, usable_cores
from ..errors import DataError
from ..store import encoded as encoded_store
from ..store.encoded import Encoded
from .samples import stored_labels

__all__ = [
    "FolderFiles",
    "ImageFiles",
    "bad_files_error",
    "file_samples",
    "has_image_files",
    "header_shape",
    "image_files",
    "read_files",
    "read_folder",
    "run_caught",
    "scan_headers",
    "undecodable",
]

_JPEG_MAGIC = b"\xff\xd8\xff"


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


def header_shape(source: Any, path: str) -> tuple[int, int, int]:
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
    return header_shape(path, path), bytes(out[:3].numpy()) == _JPEG_MAGIC


def _header(path: str) -> tuple[int, int, int]:
    return header_shape(path, path)  # a few KB read, not the file


def _caught(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning its DataError instead of raising it: every bad file is found, not the first one."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except DataError as e:
            return e

    return call


def run_caught(fn: Callable[..., Any], args: list[Sequence[Any]], threads: int, what: str, progress: bool) -> list[Any]:
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


class ImageFiles:
    """A source of encoded images, read as a folder's files are: each image's size from its header before any
    pixel is decoded, then its bytes as one :class:`Encoded` store; a bad image is a result (sample index -> why),
    not a raise, so that every one is found. The folder route (:mod:`gpufeed.pipeline.folder_store`) builds its
    pixel or JPEG store from any of them: an image folder (:class:`FolderFiles`), a Hugging Face dataset's Arrow
    column (:class:`gpufeed.read.hf.ArrowFiles`). A dataset offers one by an ``image_files()`` method."""

    what: str  # the data, as a message names it
    root: str  # what a build's progress records as its data
    names: Sequence[str]  # per sample, what an error names
    records = True  # the entry records each file's name and hash (gpufeed cache verify --data DIR compares them)

    def headers(self, threads: int, progress: bool) -> tuple[torch.Tensor, dict[int, str]]:
        """``(N, 3)`` shapes each image decodes to (``(3, 0, 0)`` for a bad one) and the bad ones."""
        raise NotImplementedError

    def read(self, threads: int, progress: bool) -> tuple[Encoded, torch.Tensor, dict[int, str]]:
        """The images as an :class:`Encoded` store (a bad one keeps its place), their labels, the bad ones."""
        raise NotImplementedError

    def describe(self, encoded: Encoded, then: str = "") -> str:
        """What the plan says the read was (``then``: what followed it, e.g. the decode)."""
        raise NotImplementedError


class FolderFiles(ImageFiles):
    """A file-backed dataset's files (:func:`file_samples`): an image folder."""

    def __init__(self, dataset: Any, samples: list[tuple[str, Any]]) -> None:
        self.dataset, self.samples = dataset, samples
        root = getattr(dataset, "root", None)
        self.root = str(Path(root).resolve()) if root is not None else ""
        self.what = f"{type(dataset).__name__} at {self.root or '?'}"
        self.names = [p for p, _ in samples]

    def headers(self, threads: int, progress: bool) -> tuple[torch.Tensor, dict[int, str]]:
        return scan_headers(self.dataset, threads, progress)

    def read(self, threads: int, progress: bool) -> tuple[Encoded, torch.Tensor, dict[int, str]]:
        got = read_folder(self.dataset, threads, progress)
        assert got is not None  # file_samples(dataset) said it is a folder
        return got

    def describe(self, encoded: Encoded, then: str = "") -> str:
        jpegs, nbytes = int(encoded.jpeg.sum()), fmt_bytes(encoded.data.nbytes)
        others = len(encoded) - jpegs
        return f"folder ({nbytes} of files: {jpegs:,} JPEG, {others:,} other; sizes from their headers{then})"


def has_image_files(dataset: Any) -> bool:
    """Whether ``dataset`` is read from encoded images as a folder is (:func:`image_files`), without reading them."""
    return callable(getattr(dataset, "image_files", None)) or file_samples(dataset) is not None


def image_files(dataset: Any) -> ImageFiles | None:
    """The encoded images a dataset is read from as a folder is (see :class:`ImageFiles`), or None: read it sample
    by sample."""
    own = getattr(dataset, "image_files", None)
    if callable(own):
        return own()
    samples = file_samples(dataset)
    return FolderFiles(dataset, samples) if samples is not None else None


def scan_headers(
    dataset: Any, num_workers: int | None = None, progress: bool = True
) -> tuple[torch.Tensor, dict[int, str]]:
    """The ``(C, H, W)`` each file of a file-backed dataset decodes to, from the headers alone (a few KB read
    per file), and the files whose header is unusable (sample index -> why; their shape is ``(3, 0, 0)``)."""
    samples = file_samples(dataset)
    if samples is None:
        raise DataError(f"{type(dataset).__name__} is not a folder of image files read by torchvision's PIL loader")
    threads = max(1, usable_cores() if num_workers is None else num_workers)
    got = run_caught(_header, [[p for p, _ in samples]], threads, "gpufeed: reading headers", progress)
    bad = {i: str(r) for i, r in enumerate(got) if isinstance(r, DataError)}
    shapes = [(3, 0, 0) if isinstance(r, DataError) else r for r in got]
    return torch.tensor(shapes, dtype=torch.int64).view(-1, 3), bad


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
    got = dict(zip(todo, run_caught(_read_into, [[paths[i] for i in todo], [views[i] for i in todo]], threads,
                              "gpufeed: reading files", progress), strict=True))  # fmt: skip
    bad |= {i: str(r) for i, r in got.items() if isinstance(r, DataError)}
    read = [((3, 0, 0), False) if i in bad else got[i] for i in range(len(paths))]
    shapes = torch.tensor([shape for shape, _ in read], dtype=torch.int64)
    jpeg = torch.tensor([is_jpeg for _, is_jpeg in read], dtype=torch.bool)
    labels = stored_labels(dataset, [t for _, t in samples], f"{type(dataset).__name__} targets")
    return Encoded(data, starts, lengths, shapes, jpeg, paths=paths), labels, dict(sorted(bad.items()))


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
        image = encoded_store.decode_one(encoded, i)  # looked up per call: tests count the decodes
        c, h, w = encoded.shapes[i].tolist()
        if tuple(image.shape) != (h, w, c):
            got = tuple(image.shape)
            raise DataError(f"{encoded.name(i)} decoded to {got} (H, W, C), but its header said {(h, w, c)}")

    got = run_caught(check, [list(range(len(encoded)))], threads, "gpufeed: checking that the files decode", progress)
    return {i: str(r) for i, r in enumerate(got) if isinstance(r, DataError)}
