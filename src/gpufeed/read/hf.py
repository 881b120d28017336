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

import os
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..errors import ConfigError
from .files import ImageFiles
from .hf_columns import AUTO, find_columns, read_labels
from .hf_files import ArrowFiles

__all__ = ["AUTO", "ArrowImages", "arrow_images", "find_columns", "hf_kind", "transform_of"]


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


_NOT_A_STREAM = (
    "gpufeed convert reads files on disk, not a stream: download them first (huggingface-cli download REPO "
    "--repo-type dataset --local-dir DIR, or ds.save_to_disk(DIR) of a loaded split), then gpufeed convert DIR DST "
    "and gf.stream(local=DST, ...)"
)


def _refuse_kind(ds: Any, kind: str) -> None:
    if kind == "DatasetDict":
        splits = list(ds.keys())
        first = "train" if "train" in splits else (splits[0] if splits else "train")
        raise ConfigError(
            f"a DatasetDict of the splits {splits}: gpufeed loads one split at a time; pass it, e.g. "
            f"gf.accelerate(ds[{first!r}], transform=...)"
        )
    if kind == "IterableDatasetDict":
        splits = list(ds.keys())
        first = "train" if "train" in splits else (splits[0] if splits else "train")
        raise ConfigError(
            f"an IterableDatasetDict of the splits {splits} (load_dataset(..., streaming=True)): a stream has no "
            "random access, which gpufeed's epochs need, and neither has each of its splits. Load one split "
            f"without streaming=True: ds = load_dataset(<the same arguments, without streaming=True>, "
            f"split={first!r}) (its Arrow files are then on disk), and gf.accelerate(ds, transform=...). For data "
            f"beyond one node: {_NOT_A_STREAM}"
        )
    if kind == "IterableDataset":
        raise ConfigError(
            "an IterableDataset (load_dataset(..., streaming=True)) has no random access, which gpufeed's epochs "
            "need: load it without streaming=True, ds = load_dataset(<the same arguments, without streaming=True>, "
            f"split=...) (its Arrow files are then on disk), and gf.accelerate(ds, transform=...). For data beyond "
            f"one node: {_NOT_A_STREAM}"
        )


def arrow_images(
    ds: Any,
    image_key: str | None = None,
    label_key: str | None = AUTO,
    transform: Any = None,
    classes: list[str] | None = None,
) -> Any:
    """``ds`` (a ``datasets.Dataset``) as :class:`ArrowImages`, its columns found from its features.

    ``image_key``: the ``Image`` column (found when there is one; ``Image(decode=False)`` too); ``label_key``: a
    ``ClassLabel``, integer, string (class names, numbered in sorted order) or float (targets) column (``"auto"``:
    the ``ClassLabel``, else the column named ``label``/``labels``/``target``/... of ids or names; None: no
        labels; :mod:`gpufeed.read.hf_columns` says what each becomes). ``transform``: the recipe given to
    ``accelerate`` (it replaces a ``set_transform`` function); a dataset whose own transform is such a function is
    refused with the change to make. ``classes``: the names a string label column is numbered by (another split's,
    so that both number alike; a name it lacks is refused), default its own, sorted."""
    kind = hf_kind(ds)
    if kind != "Dataset":
        _refuse_kind(ds, kind or type(ds).__name__)
    image_key, label_key, found = find_columns(ds.features, image_key, label_key)
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
    return ArrowImages(ds, image_key, label_key, classes if found is None else found)


class ArrowImages(Dataset):
    """A ``datasets.Dataset``'s image column and labels as ``(RGB PIL image, label)``, ``transform`` applied to
    the image (torchvision's convention), with the source protocol of an image folder (:meth:`image_files`)."""

    def __init__(self, ds: Any, image_key: str, label_key: str | None, classes: list[str] | None) -> None:
        """``classes``: a ClassLabel's names, or the names a string label column is numbered by (another split's;
        None: its own, sorted: :func:`gpufeed.read.hf_columns.read_labels`)."""
        self.hf, self.image_key, self.label_key = ds, image_key, label_key
        self.labelled = label_key is not None  # else batches are the images alone
        self.transform: Any = None
        self._feature = _decoding(ds.features[image_key])
        self._files: ArrowFiles | None = None
        table = ds.data.table  # the Arrow table (memory-mapped or in memory); rows through the indices mapping
        indices = getattr(ds, "_indices", None)
        self.rows = (
            np.asarray(indices.column(0).to_numpy(), dtype=np.int64)
            if indices is not None
            else np.arange(table.num_rows, dtype=np.int64)
        )
        self._column = table.column(image_key)
        labels = read_labels(ds, label_key, self.rows, classes, self.what, image_key)
        self.classes, self.label_values = labels.classes, labels.values
        self.notes: tuple[str, ...] = (labels.note,)  # the plan's line on the labels (request adds it)
        self.targets = labels.values.tolist()

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
            "classes": self.classes,  # a string column's numbering too: another numbering, another entry
            "labels": str(self.label_values.dtype),
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


def _decoding(feature: Any) -> Any:
    """The column's ``Image`` feature, decoding: an ``Image(decode=False)`` column holds the same bytes, read as
    ``Image()`` would decode them (gpufeed reads the bytes itself; only the per-sample path decodes)."""
    if getattr(feature, "decode", True):
        return feature
    import datasets

    return datasets.Image(mode=feature.mode)
