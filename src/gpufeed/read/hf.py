"""Hugging Face ``datasets`` as a source: an image column served from its own Arrow bytes.

A ``datasets.Dataset`` keeps each image's encoded file in an Arrow table (``{"bytes", "path"}`` per row, usually a
memory-mapped file) beside a ``ClassLabel`` column. :func:`arrow_images` wraps it as :class:`ArrowImages`, a
map-style dataset of ``(RGB PIL image, label)`` that the rest of gpufeed reads as it reads an image folder:

- ``ArrowImages[i]`` decodes with the dataset's own ``Image`` feature (``datasets``' code: PIL, EXIF orientation
  applied as ``datasets`` applies it), then ``.convert("RGB")``, the line a user's ``set_transform`` function
  starts with; an evaluation recipe read sample by sample sees exactly the user's pixels;
- :meth:`ArrowImages.image_files` is its :class:`~gpufeed.read.files.ImageFiles`: the bytes as an
  :class:`~gpufeed.store.encoded.Encoded` store *over the Arrow buffer itself* (no copy when the column lives in
  one Arrow file or one in-memory chunk; NOTE [ The Arrow bytes, not a copy ]), each image's size and EXIF
  orientation from its header, so the folder route (pixel store or JPEG store, bad images found at build time,
  ``on_error="skip"``) serves it unchanged;
- :meth:`ArrowImages.source_identity` is its cache identity: the dataset's fingerprint (a new one for every
  ``select``, ``filter``, ``shuffle``, ``train_test_split`` part), its Arrow files' sizes and times, the columns.

``datasets`` is optional (``pip install gpufeed[hf]``) and imported only for an object of its own.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..device import fmt_bytes
from ..errors import ConfigError, DataError
from ..store.encoded import Encoded
from .files import ImageFiles, header_shape, run_caught

__all__ = ["AUTO", "ArrowImages", "arrow_images", "find_columns", "hf_kind", "transform_of"]

AUTO: Any = "auto"  # label_key: the ClassLabel column, else an integer column named label/labels/target
_LABEL_NAMES = ("label", "labels", "target", "targets", "fine_label", "coarse_label")
_EXIF_ORIENTATION = 0x0112


def hf_kind(obj: Any) -> str | None:
    """``"Dataset"``, ``"DatasetDict"``, ``"IterableDataset"`` or ``"IterableDatasetDict"`` for an object of
    Hugging Face ``datasets`` (judged by its class's module, so ``datasets`` is not imported for anything else)."""
    for cls in type(obj).__mro__:
        if (cls.__module__ or "").startswith("datasets.") and cls.__name__ in (
            "Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict",
        ):  # fmt: skip
            return cls.__name__
    return None


def transform_of(ds: Any) -> Any:
    """The function ``set_transform`` / ``with_transform`` gave ``ds``, or None."""
    fmt = getattr(ds, "format", None) or {}
    return (fmt.get("format_kwargs") or {}).get("transform") if fmt.get("type") == "custom" else None


def _columns_read(ds: Any) -> list[str]:
    fmt = getattr(ds, "format", None) or {}
    return list(fmt.get("columns") or ds.column_names)


def _refuse_kind(ds: Any, kind: str) -> None:
    if kind in ("DatasetDict", "IterableDatasetDict"):
        splits = list(ds.keys())
        first = splits[0] if splits else "train"
        raise ConfigError(
            f"a {kind} of the splits {splits}: gpufeed loads one split at a time; pass it, e.g. "
            f"gf.accelerate(ds[{first!r}], transform=...)"
        )
    if kind == "IterableDataset":
        raise ConfigError(
            "an IterableDataset (load_dataset(..., streaming=True)) has no random access, which gpufeed's epochs "
            "need: load it without streaming=True (the Arrow files are then on disk), or for data beyond one "
            "node convert it to MDS shards (gpufeed convert) and use gf.stream"
        )


def arrow_images(ds: Any, image_key: str | None = None, label_key: str | None = AUTO, transform: Any = None) -> Any:
    """``ds`` (a ``datasets.Dataset``) as :class:`ArrowImages`, its columns found from its features.

    ``image_key``: the ``Image`` column (found when there is one); ``label_key``: a ``ClassLabel`` or integer
    column (``"auto"``: the ``ClassLabel``, else an integer column named ``label``/``labels``/``target``; None:
    no labels). ``transform``: the recipe given to ``accelerate`` (it replaces a ``set_transform`` function); a
    dataset whose own transform is such a function is refused with the change to make."""
    kind = hf_kind(ds)
    if kind != "Dataset":
        _refuse_kind(ds, kind or type(ds).__name__)
    image_key, label_key, classes = find_columns(ds.features, image_key, label_key)
    mode = ds.features[image_key].mode
    if mode not in (None, "RGB"):
        raise ConfigError(
            f"the column {image_key!r} is Image(mode={mode!r}): gpufeed serves RGB images (as "
            f"ImageFolder does); cast it with ds.cast_column({image_key!r}, datasets.Image()) and convert in the "
            "recipe if the model needs another mode"
        )
    own = transform_of(ds)
    if own is not None and transform is None:
        name = getattr(own, "__qualname__", type(own).__name__)
        raise ConfigError(
            f"the dataset carries its own transform ({name}, set by set_transform/with_transform), a function "
            f"gpufeed cannot split into cached and batched parts (it reads the columns {_columns_read(ds)}). Pass "
            f"the recipe it applies to each image instead: gf.accelerate(ds, transform=RECIPE, ...) in place of "
            f"DataLoader(ds.with_transform(fn), ...); gpufeed decodes {image_key!r} to RGB and labels from "
            f"{label_key!r} as your function would"
        )
    return ArrowImages(ds, image_key, label_key, classes)


def find_columns(
    features: Any, image_key: str | None = None, label_key: str | None = AUTO
) -> tuple[str, str | None, list[str] | None]:
    """``(image_key, label_key, classes)`` of a dataset's ``features`` (a ``datasets.Features``), by the rules
    :func:`arrow_images` states: the one ``Image`` column unless ``image_key`` names one; ``label_key`` ``"auto"``
    the ``ClassLabel``, else an integer column named ``label``/``labels``/``target``/..., else none; ``classes``
    the ``ClassLabel``'s names (None for an integer column or none). ``gpufeed convert`` reads a Hugging Face
    dataset on disk by the same rules, so both name the same columns.

    Raises:
        ConfigError: no (or several) Image columns and no ``image_key``; a key that is not a column, or a column
            of the wrong kind; several label columns. The message lists the columns and the option to pass.
    """
    from datasets import ClassLabel, Image, Value

    images = [k for k, f in features.items() if isinstance(f, Image)]
    described = ", ".join(f"{k} ({type(f).__name__})" for k, f in features.items())
    if image_key is None:
        if len(images) != 1:
            which = f"{len(images)} Image columns ({images})" if images else "no Image column"
            raise ConfigError(
                f"the dataset has {which}; its columns: {described}. Pass image_key= (a column of encoded images: "
                "cast one with ds.cast_column(name, datasets.Image()))"
            )
        image_key = images[0]
    elif image_key not in features:
        raise ConfigError(f"image_key={image_key!r} is not a column of the dataset; its columns: {described}")
    elif not isinstance(features[image_key], Image):
        raise ConfigError(
            f"image_key={image_key!r} is a {features[image_key]!r} column, not an Image: cast it with "
            f"ds.cast_column({image_key!r}, datasets.Image()) if it holds encoded images or their paths"
        )
    integer = lambda f: isinstance(f, Value) and (f.dtype.startswith(("int", "uint")) or f.dtype == "bool")  # noqa: E731
    if label_key is AUTO:
        named = [k for k, f in features.items() if isinstance(f, ClassLabel)]
        if not named:
            named = [k for k in _LABEL_NAMES if k in features and integer(features[k])]
        if len(named) > 1:
            raise ConfigError(f"the dataset has several label columns ({named}); pass label_key= (None: no labels)")
        label_key = named[0] if named else None
    elif label_key is not None:
        if label_key not in features:
            raise ConfigError(f"label_key={label_key!r} is not a column of the dataset; its columns: {described}")
        if not (isinstance(features[label_key], ClassLabel) or integer(features[label_key])):
            raise ConfigError(
                f"label_key={label_key!r} is a {features[label_key]!r} column; gpufeed reads class indices (a "
                "ClassLabel or an integer column): pass another label_key, or None for images alone"
            )
    labels = features[label_key] if label_key is not None else None
    classes = list(labels.names) if isinstance(labels, ClassLabel) else None
    return image_key, label_key, classes


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


class ArrowImages(Dataset):
    """A ``datasets.Dataset``'s image column and labels as ``(RGB PIL image, label)``, ``transform`` applied to
    the image (torchvision's convention), with the source protocol of an image folder (:meth:`image_files`)."""

    def __init__(self, ds: Any, image_key: str, label_key: str | None, classes: list[str] | None) -> None:
        self.hf, self.image_key, self.label_key = ds, image_key, label_key
        self.classes = classes
        self.labelled = label_key is not None  # else batches are the images alone
        self.transform: Any = None
        self._feature = ds.features[image_key]
        self._files: ArrowFiles | None = None
        table = ds.data.table  # the Arrow table (memory-mapped or in memory); rows through the indices mapping
        indices = getattr(ds, "_indices", None)
        self.rows = (
            np.asarray(indices.column(0).to_numpy(), dtype=np.int64)
            if indices is not None
            else np.arange(table.num_rows, dtype=np.int64)
        )
        self._column = table.column(image_key)
        labels = table.column(label_key).to_numpy(zero_copy_only=False)[self.rows] if label_key is not None else None
        if labels is not None and (labels < 0).any():
            row = int(self.rows[int(np.flatnonzero(labels < 0)[0])])
            raise DataError(
                f"{self.what} row {row} has label {int(labels[labels < 0][0])} in {label_key!r} (a ClassLabel's "
                "missing value is -1): drop unlabelled rows (ds.filter(lambda r: r[...] >= 0)) or pass label_key=None"
            )
        self.targets = labels.astype(np.int64).tolist() if labels is not None else [0] * len(self.rows)

    def __getstate__(self) -> dict[str, Any]:
        # a DataLoader worker under spawn gets the dataset pickled: the Arrow column would be copied with it
        return {k: v for k, v in self.__dict__.items() if k not in ("_column", "_files")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _files=None, _column=state["hf"].data.table.column(state["image_key"]))

    @property
    def what(self) -> str:
        """The dataset as a message names it."""
        name = getattr(getattr(self.hf, "info", None), "dataset_name", None)
        split = getattr(self.hf, "split", None)
        named = f"the Hugging Face dataset {name!r}" if name else "a Hugging Face dataset"
        return named + (f" ({split} split)" if split else "")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        value = self._column[int(self.rows[i])].as_py()
        image = self._feature.decode_example(value).convert("RGB")  # datasets' decoding, as the user's path has it
        return (self.transform(image) if self.transform is not None else image), self.targets[i]

    def source_identity(self) -> dict[str, Any]:
        """What identifies these samples in a cache key (see :func:`gpufeed.read.fingerprint.dataset_identity`)."""
        import datasets
        from datasets.table import list_table_cache_files

        files = []
        for f in list_table_cache_files(self.hf.data):
            st = os.stat(f)
            files.append([os.path.realpath(f), st.st_size, st.st_mtime_ns, st.st_ino])
        return {
            "class": "datasets.Dataset",
            "fingerprint": self.hf._fingerprint,
            "files": files,
            "len": len(self),
            "columns": [self.image_key, self.label_key],
            "classes": self.classes,
            # the decoding a row gets (EXIF orientation appeared in datasets 3): part of what the pixels are
            "datasets": datasets.__version__,
        }

    def image_files(self) -> ImageFiles:
        """The column's encoded images as a folder's files are read (made once; a copy of this dataset shares it)."""
        if self._files is None:
            self._files = ArrowFiles(self)
        return self._files

    def __repr__(self) -> str:
        return f"ArrowImages({self.what}, {len(self):,} rows, image={self.image_key!r}, label={self.label_key!r})"


# NOTE [ The Arrow bytes, not a copy ]
# An Image column is a struct array per chunk; its "bytes" child is a binary array: one data buffer holding every
# file back to back, and offsets. The JPEG store needs exactly that: one byte buffer with each image's start and
# length. So the store's buffer is a view of the Arrow memory: when the column's chunks all live in one Arrow file
# (memory-mapped by datasets, so its pages come from the page cache and count once, however many processes read
# it) or in one in-memory chunk, a single tensor spans them, starts being offsets into it. Several files are
# separate mappings with unmapped gaps between them: their bytes are copied once into one buffer (the plan says
# so). Nothing goes through Python bytes objects except one image at a time, for its header.


def _binary_parts(column: Any) -> list[tuple[Any, np.ndarray, np.ndarray]]:
    """Per chunk of an Image column: its "bytes" child's data buffer, each row's start in it and its length
    (-1 for a row with no bytes, an image given by path); the struct's own offset (a sliced chunk) honoured."""
    import pyarrow as pa

    out = []
    for chunk in column.chunks:
        child = chunk.field("bytes")
        if chunk.offset or len(child) != len(chunk):  # a sliced struct: field() ignores its offset, flatten() does not
            child = chunk.flatten()[chunk.type.get_field_index("bytes")]
        wide = pa.types.is_large_binary(child.type)
        bufs = child.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
            child.offset : child.offset + len(child) + 1
        ]
        starts = offsets[:-1].astype(np.int64)
        lengths = np.diff(offsets).astype(np.int64)
        if child.null_count:
            lengths[np.asarray(child.is_null())] = -1
        out.append((bufs[2], starts, lengths))
    return out


def _one_buffer(
    parts: list[tuple[Any, np.ndarray, np.ndarray]], single_file: bool
) -> tuple[torch.Tensor, np.ndarray] | None:
    """A tensor over the Arrow memory holding every chunk's data, and each chunk's base offset in it; None when
    the chunks are not in one mapping (NOTE [ The Arrow bytes, not a copy ])."""
    import pyarrow as pa

    held = [b for b, _, _ in parts if b is not None and b.size]
    if not held:
        return torch.empty(0, dtype=torch.uint8), np.zeros(len(parts), dtype=np.int64)
    if len(held) > 1 and not single_file:
        return None
    lo, hi = min(b.address for b in held), max(b.address + b.size for b in held)
    span = pa.foreign_buffer(lo, hi - lo, base=held)  # keeps the Arrow buffers (and their mapping) alive
    with warnings.catch_warnings():  # read-only memory: gpufeed's decoders only read it
        warnings.simplefilter("ignore", UserWarning)
        data = torch.from_numpy(np.frombuffer(span, dtype=np.uint8))
    bases = np.array([(b.address - lo) if b is not None else 0 for b, _, _ in parts], dtype=np.int64)
    return data, bases


class ArrowFiles(ImageFiles):
    """An :class:`ArrowImages`' encoded images, read as a folder's files are (see :class:`ImageFiles`)."""

    records = False  # no folder to compare an entry with (gpufeed cache verify --data): the fingerprint says it

    def __init__(self, source: ArrowImages) -> None:
        from datasets.table import list_table_cache_files

        self.source = source
        self._got: list[Any] | None = None
        self.what = source.what
        self.root = f"{source.what} ({source.hf._fingerprint})"
        parts = _binary_parts(source._column)
        single = len(list_table_cache_files(source.hf.data)) == 1 or len(parts) == 1
        chunk_of = np.concatenate([np.full(len(s), k, dtype=np.int64) for k, (_, s, _) in enumerate(parts)])
        starts = np.concatenate([s for _, s, _ in parts]) if parts else np.zeros(0, dtype=np.int64)
        lengths = np.concatenate([n for _, _, n in parts]) if parts else np.zeros(0, dtype=np.int64)
        rows = source.rows
        self._lengths = lengths[rows]
        path_only = np.flatnonzero(self._lengths < 0)
        self._paths: list[str | None] = []
        if len(path_only):
            col = source._column.combine_chunks().field("path")
            self._paths = [None] * len(rows)
            for i in path_only.tolist():
                self._paths[i] = col[int(rows[i])].as_py()
        self.names = _RowNames(source.what, rows, self._paths)
        joined = _one_buffer(parts, single) if not len(path_only) else None
        if joined is not None:
            data, bases = joined
            self._data, self._starts, self.copied = data, (bases[chunk_of] + starts)[rows], ""
        else:  # several mappings, or images by path: their bytes packed once into one buffer
            self._data, self._starts = self._pack(parts, chunk_of, starts, rows)
            self.copied = (
                "images given by path read from their files"
                if len(path_only)
                else f"the column's {len(parts)} chunks span several Arrow files: their bytes copied into one buffer"
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
        views = [np.frombuffer(b, dtype=np.uint8) if b is not None else None for b, _, _ in parts]
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
            else:
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
        if self._lengths[i] <= 0:
            raise DataError(
                f"{name}: cannot be read (no bytes, and its path {self._paths[i] if self._paths else None} gives none)"
            )
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
        lengths = torch.from_numpy(np.maximum(self._lengths, 0))
        encoded = Encoded(self._data, torch.from_numpy(self._starts.copy()), lengths, shapes, jpeg, paths=self.names,
                          orient=orient if bool((orient > 1).any()) else None, mapped=not self.copied)  # fmt: skip
        labels = torch.tensor(self.source.targets, dtype=torch.int64)
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
