"""A Hugging Face dataset's Image column read as a folder's files are (:class:`ArrowFiles`, the
:class:`~gpufeed.read.files.ImageFiles` of :class:`gpufeed.read.hf.ArrowImages`): the encoded bytes served from
the Arrow buffer itself where they lie in one mapping, each image's size and EXIF orientation from its header, a
row without an image (null) or an unreadable one reported by its row, as a folder's bad file is by its name."""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..device import fmt_bytes
from ..errors import DataError
from ..store.encoded import Encoded
from .files import ImageFiles, header_shape, run_caught

__all__ = ["ArrowFiles"]

_EXIF_ORIENTATION = 0x0112


class _RowNames(Sequence[str]):
    """What an error calls each sample: the image's file where the row names one, else its row."""

    def __init__(self, what: str, rows: np.ndarray, paths: list[str | None]) -> None:
        self.what, self.rows, self.paths = what, rows, paths

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        path = self.paths[i] if self.paths else None
        return f"{self.what} row {int(self.rows[i])}" + (f", {path}" if path else "")


# NOTE [ The Arrow bytes, not a copy ]
# An Image column is a struct array per chunk; its "bytes" child is a binary array: one data buffer holding every
# file back to back, and offsets. The JPEG store needs exactly that: one byte buffer with each image's start and
# length. So the store's buffer is a view of the Arrow memory: when the column's chunks all live in one Arrow file
# (memory-mapped by datasets, so its pages come from the page cache and count once, however many processes read
# it) or in one in-memory chunk, a single tensor spans them, starts being offsets into it. Several files are
# separate mappings with unmapped gaps between them: their bytes are copied once into one buffer (the plan says
# so). Nothing goes through Python bytes objects except one image at a time, for its header.


def _binary_parts(column: Any) -> list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]]:
    """Per chunk of an Image column (a ``struct<bytes, path>``, or plain binary): its bytes' data buffer, each
    row's start in it and its length, and which rows have no bytes (an image given by path, or a null row: the
    struct or its bytes null; its length is 0, whatever its offsets span). A sliced chunk's offset is honoured.

    NOTE [ Null rows ]: an Arrow null's slot in the offsets is not an image's end: a null row is marked, its length
    0, never -1 (a -1 entered a cumulative sum and moved every later row's bytes one back, so the row before a null
    lost its last byte and was reported corrupt)."""
    import pyarrow as pa

    out = []
    for chunk in column.chunks:
        if pa.types.is_struct(chunk.type):
            child = chunk.field("bytes")
            if chunk.offset or len(child) != len(chunk):  # a sliced struct: field() ignores its offset, flatten() not
                child = chunk.flatten()[chunk.type.get_field_index("bytes")]
        else:
            child = chunk
        wide = pa.types.is_large_binary(child.type)
        bufs = child.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
            child.offset : child.offset + len(child) + 1
        ]
        starts = offsets[:-1].astype(np.int64)
        lengths = np.diff(offsets).astype(np.int64)
        missing = np.zeros(len(chunk), dtype=bool)
        if chunk.null_count:
            missing |= np.asarray(chunk.is_null(), dtype=bool)
        if child is not chunk and child.null_count:
            missing |= np.asarray(child.is_null(), dtype=bool)
        lengths[missing] = 0
        out.append((bufs[2], starts, lengths, missing))
    return out


def _is_struct(column: Any) -> bool:
    """Whether an Arrow column is a struct (an Image's storage), not plain binary."""
    import pyarrow as pa

    return bool(pa.types.is_struct(column.type))


def _one_buffer(
    parts: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]], single_file: bool
) -> tuple[torch.Tensor, np.ndarray] | None:
    """A tensor over the Arrow memory holding every chunk's data, and each chunk's base offset in it; None when
    the chunks are not in one mapping (NOTE [ The Arrow bytes, not a copy ])."""
    import pyarrow as pa

    held = [p[0] for p in parts if p[0] is not None and p[0].size]
    if not held:
        return torch.empty(0, dtype=torch.uint8), np.zeros(len(parts), dtype=np.int64)
    if len(held) > 1 and not single_file:
        return None
    lo, hi = min(b.address for b in held), max(b.address + b.size for b in held)
    span = pa.foreign_buffer(lo, hi - lo, base=held)  # keeps the Arrow buffers (and their mapping) alive
    with warnings.catch_warnings():  # read-only memory: gpufeed's decoders only read it
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(np.frombuffer(span, dtype=np.uint8))
    bases = np.array([(p[0].address - lo) if p[0] is not None else 0 for p in parts], dtype=np.int64)
    return data, bases


class ArrowFiles(ImageFiles):
    """An :class:`ArrowImages`' encoded images, read as a folder's files are (see :class:`ImageFiles`)."""

    records = False  # no folder to compare an entry with (gpufeed cache verify --data): the fingerprint says it

    def __init__(self, source: Any) -> None:  # an ArrowImages (gpufeed.read.hf imports this module, not back)
        from datasets.table import list_table_cache_files

        self.source = source
        self._got: list[Any] | None = None
        self.what = source.what
        self.root = f"{source.what} ({source.hf._fingerprint})"
        parts = _binary_parts(source._column)
        mapped = len(list_table_cache_files(source.hf.data))
        single = mapped == 1 or len(parts) == 1
        empty = np.zeros(0, dtype=np.int64)
        chunk_of = np.concatenate([np.full(len(p[1]), k, dtype=np.int64) for k, p in enumerate(parts)] or [empty])
        starts = np.concatenate([p[1] for p in parts] or [empty])
        lengths = np.concatenate([p[2] for p in parts] or [empty])
        missing = np.concatenate([p[3] for p in parts] or [np.zeros(0, dtype=bool)])
        rows = source.rows
        self._lengths = lengths[rows]
        self._missing = missing[rows]  # no bytes: by path (read below), or no image at all (NOTE [ Null rows ])
        self._paths: list[str | None] = []
        if self._missing.any() and _is_struct(source._column):
            col = source._column.combine_chunks().field("path")
            self._paths = [None] * len(rows)
            for i in np.flatnonzero(self._missing).tolist():
                self._paths[i] = col[int(rows[i])].as_py()
        by_path = sum(p is not None for p in self._paths)
        self.names = _RowNames(source.what, rows, self._paths)
        joined = _one_buffer(parts, single) if not by_path else None
        if joined is not None:
            data, bases = joined
            self._data, self._starts, self.copied = data, (bases[chunk_of] + starts)[rows], ""
        else:  # several mappings, or images by path: their bytes packed once into one buffer
            self._data, self._starts = self._pack(parts, chunk_of, starts, rows)
            self.copied = (
                "images given by path read from their files"
                if by_path
                else f"the column's {len(parts)} chunks "
                + ("span several Arrow files" if mapped else "lie in separate buffers in memory")
                + ": their bytes copied into one buffer"
            )

    def _pack(
        self, parts: Any, chunk_of: np.ndarray, starts: np.ndarray, rows: np.ndarray
    ) -> tuple[torch.Tensor, np.ndarray]:
        lengths = self._lengths.copy()
        sizes = {}
        for i, path in enumerate(self._paths):
            if path is not None:
                try:
                    sizes[i] = os.stat(path).st_size
                except OSError:
                    sizes[i] = 0
        for i, size in sizes.items():
            lengths[i] = size
        out_starts = np.cumsum(lengths) - lengths
        data = torch.empty(int(lengths.sum()), dtype=torch.uint8)
        views = [np.frombuffer(p[0], dtype=np.uint8) if p[0] is not None else None for p in parts]
        flat = data.numpy()
        for i, row in enumerate(rows.tolist()):
            at, n = int(out_starts[i]), int(lengths[i])
            if i in sizes:
                try:
                    with open(str(self._paths[i]), "rb", buffering=0) as f:
                        got = f.readinto(flat[at : at + n].data)
                except OSError:
                    got = -1
                if got != n:
                    lengths[i] = 0
            elif n:
                k = int(chunk_of[row])
                flat[at : at + n] = views[k][int(starts[row]) : int(starts[row]) + n]  # type: ignore[index]
        self._lengths = lengths
        return data, out_starts

    def __len__(self) -> int:
        return len(self._starts)

    def _view(self, i: int) -> np.ndarray:
        at, n = int(self._starts[i]), int(self._lengths[i])
        return self._data.numpy()[at : at + n] if n > 0 else np.zeros(0, dtype=np.uint8)

    def _header(self, i: int) -> tuple[tuple[int, int, int], int, bool]:
        name = self.names[i]
        path = self._paths[i] if self._paths else None
        if self._missing[i] and path is None:
            key = self.source.image_key
            raise DataError(
                f"{name}: no image (its {key!r} is None: neither bytes nor a path); drop such rows "
                f"(ds.filter(lambda r: r[{key!r}] is not None)) or pass on_error='skip'"
            )
        if self._lengths[i] <= 0:
            raise DataError(f"{name}: cannot be read (no bytes, and its path {path} gives none)")
        raw = self._view(i).tobytes()
        shape = header_shape(io.BytesIO(raw), name)
        orientation = _orientation(raw, name)
        if orientation in (5, 6, 7, 8):  # datasets turns it upright: a quarter turn swaps the sides
            shape = (shape[0], shape[2], shape[1])
        return shape, orientation, raw[:3] == b"\xff\xd8\xff"

    def _scan(self, threads: int, progress: bool) -> list[Any]:
        """Each image's header (shape, orientation, is-JPEG) or its DataError: read once, for headers() and read()."""
        if self._got is None:
            self._got = run_caught(
                self._header, [list(range(len(self)))], threads, "gpufeed: reading headers", progress
            )
        return self._got

    def headers(self, threads: int, progress: bool) -> tuple[torch.Tensor, dict[int, str]]:
        got = self._scan(threads, progress)
        bad = {i: str(r) for i, r in enumerate(got) if isinstance(r, DataError)}
        shapes = [(3, 0, 0) if isinstance(r, DataError) else r[0] for r in got]
        return torch.tensor(shapes, dtype=torch.int64).view(-1, 3), bad

    def read(self, threads: int, progress: bool) -> tuple[Encoded, torch.Tensor, dict[int, str]]:
        got = self._scan(threads, progress)
        bad = {i: str(r) for i, r in enumerate(got) if isinstance(r, DataError)}
        ok = lambda r: not isinstance(r, DataError)  # noqa: E731
        shapes = torch.tensor([r[0] if ok(r) else (3, 0, 0) for r in got], dtype=torch.int64).view(-1, 3)
        orient = torch.tensor([r[1] if ok(r) else 1 for r in got], dtype=torch.uint8)
        jpeg = torch.tensor([bool(r[2]) if ok(r) else False for r in got], dtype=torch.bool)
        lengths = torch.from_numpy(self._lengths.copy())
        encoded = Encoded(self._data, torch.from_numpy(self._starts.copy()), lengths, shapes, jpeg, paths=self.names,
                          orient=orient if bool((orient > 1).any()) else None, mapped=not self.copied)  # fmt: skip
        labels = torch.from_numpy(self.source.label_values.copy())  # int64 classes, or float32 targets
        return encoded, labels, bad

    def describe(self, encoded: Encoded, then: str = "") -> str:
        jpegs, nbytes = int(encoded.jpeg.sum()), fmt_bytes(int(encoded.lengths.sum()))
        where = self.copied or "served from the Arrow memory itself, not copied"
        return (
            f"{self.what} (column {self.source.image_key!r}: {nbytes} of encoded images, {jpegs:,} JPEG, "
            f"{len(encoded) - jpegs:,} other; {where}; sizes from their headers{then})"
        )


def _orientation(raw: bytes, name: str) -> int:
    """The EXIF orientation ``datasets`` turns an image by (1: none), read without decoding where the format
    allows: a JPEG's, a WebP's or a TIFF's is in its header; a PNG's may follow its pixels, so a PNG that holds
    EXIF at all (an eXIf chunk, or ImageMagick's text chunk) is loaded to tell, as ``datasets`` loads it."""
    from PIL import Image

    from ..store.decoders import _jpeg_orientation

    if raw[:3] == b"\xff\xd8\xff":  # the APP1 segment's tag, walked by the JPEG decoders' own reader
        return _jpeg_orientation(raw[: 1 << 17])
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and b"eXIf" not in raw and b"exif" not in raw:
        return 1
    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format == "PNG":
                im.load()
            value = im.getexif().get(_EXIF_ORIENTATION)
    except Exception as e:  # what PIL raises for a damaged file varies
        raise DataError(f"{name}: cannot be read as an image ({type(e).__name__}: {e}); remove it or fix it") from e
    return int(value) if isinstance(value, int) and 1 <= value <= 8 else 1
