"""Hugging Face data on disk: a ``save_to_disk`` folder, a Hub repository's folder (split as ``load_dataset``
splits it: :mod:`.hub`) or Parquet files, found, opened and read row by row (:mod:`.hf_rows`).

Two readers use it. ``gpufeed convert`` reads the image column's encoded bytes straight from Arrow (never
``ds[i]``, which decodes), in the dataset's order, into MDS shards; ``--data`` of ``gpufeed train`` and the other
commands opens a ``datasets.Dataset`` that :func:`gpufeed.read.hf.arrow_images` serves as it serves one in Python.
Both find the columns by :func:`gpufeed.read.hf.find_columns`, so they read the same ones.

NOTE [ Nothing written beside the data ]
``datasets.load_from_disk`` memory-maps the Arrow files and writes nothing; ``load_dataset("parquet", ...)`` and
``Dataset.from_parquet`` would copy the files into the Hugging Face cache, so Parquet is read with ``pyarrow``
alone, and a Hub repository's Arrow files with ``pyarrow.ipc`` (for ``--data``: a ``datasets.Dataset`` over that
in-memory table, which has no cache files either). A dataset's folder is only read.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, DataError
from ..read.hf import find_columns
from .hf_rows import (
    column_values,
    file_format,
    file_rows,
    open_arrow,
    read_files,
    rows,
    rows_counted,
    saved_rows,
)
from .hub import CARD, Layout, datasets_module, hub_layout

if TYPE_CHECKING:
    from .items import Item, Source

__all__ = [
    "EVAL_SPLITS",
    "OnDisk",
    "columns",
    "file_rows",
    "locate",
    "open_dataset",
    "parquet_features",
    "rows",
    "saved_rows",
    "source",
]

EVAL_SPLITS = ("validation", "valid", "val", "dev", "test")  # a DatasetDict's evaluation split: the first of these
_DATASET_FILES = ("state.json", "dataset_info.json")  # what Dataset.save_to_disk writes beside its .arrow files
_DICT_FILE = "dataset_dict.json"  # what DatasetDict.save_to_disk writes beside its split folders


@dataclass(frozen=True)
class OnDisk:
    """Where a Hugging Face dataset lies: ``kind`` ``"hf"`` (a ``save_to_disk`` folder, ``splits`` those of a
    DatasetDict, ``()`` for a Dataset), ``"parquet"`` or ``"arrow"`` (``files``, sorted by name; of a folder read
    as a Hub repository, ``layout`` its splits, :mod:`.hub`); ``root`` the folder that holds it (never written);
    ``shown`` as messages name it."""

    kind: str
    root: Path
    shown: str
    splits: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()
    layout: Layout | None = None

    @property
    def what(self) -> str:
        if self.layout is not None:
            splits = ", ".join(self.splits)
            return f"the Hugging Face dataset folder {self.shown} (splits {splits}, by {self.layout.how})"
        if self.kind == "parquet":
            return f"{len(self.files)} Parquet file{'s' * (len(self.files) != 1)} {self.shown}"
        return f"the Hugging Face dataset {self.shown}" + (f" (splits {', '.join(self.splits)})" if self.splits else "")

    def _chosen(self, split: str | None) -> str:
        chosen = split or "train"
        if chosen not in self.splits:
            asked = f"split={split!r}" if split is not None else "no split given and none is named train"
            raise ConfigError(
                f"{asked}: {self.what} has the splits {list(self.splits)}; pass one of them (--split NAME)"
            )
        return chosen

    def split_dir(self, split: str | None) -> tuple[Path, str | None]:
        """The folder of ``split`` (a DatasetDict's; default ``"train"``) and the split's name.

        Raises:
            ConfigError: a DatasetDict without that split, or a split asked of a single dataset.
        """
        if not self.splits:
            if split is not None:
                raise ConfigError(
                    f"split={split!r}: {self.what} is one dataset, not a DatasetDict of splits: drop the split"
                )
            return self.root, None
        chosen = self._chosen(split)
        return self.root / chosen, chosen

    def split_files(self, split: str | None) -> tuple[tuple[Path, ...], str | None]:
        """The Parquet or Arrow files of ``split`` (a Hub layout's; default ``"train"``) and the split's name; of
        files given as such (a file, a glob), all of them.

        Raises:
            ConfigError: a layout without that split, or a split asked of files given as such.
        """
        if self.layout is None:
            if split is not None:
                raise ConfigError(f"split={split!r}: {self.what} are one dataset, not a DatasetDict: drop the split")
            return self.files, None
        chosen = self._chosen(split)
        return self.layout.files(chosen), chosen


def locate(src: str | Path, config: str | None = None) -> OnDisk | None:
    """The Hugging Face dataset ``src`` names: a ``save_to_disk`` folder (``state.json`` + ``dataset_info.json``,
    or a DatasetDict's ``dataset_dict.json``), a ``.parquet`` file, a glob matching such files (one dataset), or a
    folder of Parquet or Arrow files split as ``load_dataset`` splits it (a Hub repository with its ``README.md``
    card, its ``data/`` folder, any folder of them: :func:`gpufeed.mds.hub.hub_layout`; ``config`` the card's
    config); None for anything else (an image folder, tars).

    Raises:
        ConfigError: ``config`` given for what has no card; a card that cannot be followed (:func:`hub_layout`).
    """
    text = str(src)
    path = Path(text).expanduser()
    found = _locate(text, path, config)
    if config is not None and (found is None or found.layout is None or found.layout.card is None):
        what = found.what if found is not None else text
        raise ConfigError(
            f"config={config!r} picks a config of a Hub repository's {CARD} card, of Parquet or Arrow files; {what} "
            "is not one (a folder of images is read by its folders): drop it"
        )
    return found


def _locate(text: str, path: Path, config: str | None) -> OnDisk | None:
    if glob.has_magic(text) and not path.exists():
        found = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
        if found and all(p.suffix == ".parquet" for p in found):
            root = Path(os.path.commonpath([p.resolve().parent for p in found]))
            return OnDisk("parquet", root, str(path.absolute()), files=tuple(p.resolve() for p in found))
        return None
    if path.is_file():
        if path.suffix != ".parquet":
            return None
        return OnDisk("parquet", path.resolve().parent, str(path.resolve()), files=(path.resolve(),))
    if not path.is_dir():
        return None
    root = path.resolve()
    if (root / _DICT_FILE).is_file():
        return OnDisk("hf", root, str(root), splits=_dict_splits(root))
    if all((root / name).is_file() for name in _DATASET_FILES):
        return OnDisk("hf", root, str(root))
    layout = hub_layout(root, config)
    if layout is None:
        return None
    every = tuple(f for _, files in layout.splits for f in files)
    return OnDisk(layout.fmt, root, str(root), splits=layout.names, files=every, layout=layout)


def _dict_splits(root: Path) -> tuple[str, ...]:
    try:
        splits = json.loads((root / _DICT_FILE).read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"{root / _DICT_FILE}: cannot be read as a DatasetDict's list of splits ({e}); save it again"
        ) from None
    return tuple(str(s) for s in splits)


def _storage_is_image(arrow_type: Any) -> bool:
    """Whether a column holds encoded images without saying so: a ``struct<bytes, path>`` (an ``Image``'s
    storage) or plain binary, as Parquet files written by other tools have them."""
    import pyarrow as pa

    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return True
    names = {arrow_type.field(i).name for i in range(arrow_type.num_fields)} if pa.types.is_struct(arrow_type) else ()
    return names == {"bytes", "path"}


def _features(features: Any, schema: Any, image_key: str | None) -> Any:
    """``features`` (a ``datasets.Features``) with ``image_key``'s column read as an ``Image`` when the Arrow
    ``schema`` shows it holds encoded images untyped (:func:`_storage_is_image`)."""
    datasets = datasets_module()
    if image_key is not None and image_key in features and not isinstance(features[image_key], datasets.Image):
        if _storage_is_image(schema.field(image_key).type):
            features = datasets.Features({**features, image_key: datasets.Image()})
    return features


def columns(
    features: Any, image_key: str | None, label_key: str | None, what: str, explicit_floats: bool = False
) -> tuple[str, str | None, Any]:
    """:func:`gpufeed.read.hf.find_columns`, its message naming the dataset and the command line's options; a float
    column is refused unless ``explicit_floats`` (MDS shards and the CLI's classifier keep class indices)."""
    try:
        return find_columns(features, image_key, label_key, explicit_floats)
    except ConfigError as e:
        raise ConfigError(f"{what}: {e} (on the command line: --image-key NAME, --label-key NAME or none)") from None


def _schema(files: tuple[Path, ...]) -> Any:
    """The Arrow schema the files share (read from their footers, or an Arrow file's header).

    Raises:
        DataError: a file that cannot be read, or whose columns differ from the first file's.
    """
    import pyarrow.parquet as pq

    fmt = file_format(files)
    first = None
    for f in files:
        try:
            schema = pq.read_schema(f) if fmt == "parquet" else open_arrow(f).schema
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{f}: cannot be read as {fmt.capitalize()} ({e}); download or write it again") from None
        if first is None:
            first = schema
        elif not schema.remove_metadata().equals(first.remove_metadata()):
            raise DataError(
                f"{f}: its columns ({', '.join(schema.names)}) differ from those of {files[0].name} "
                f"({', '.join(first.names)}), or their types do; give the files of one dataset"
            )
    return first


def parquet_features(files: tuple[Path, ...], image_key: str | None, card: Any = None) -> Any:
    """The files' ``datasets.Features``: the card's (a Hub repository's ``dataset_info``, as ``load_dataset``
    casts to it), else from the Hugging Face metadata ``to_parquet`` writes into the schema, else inferred from the
    Arrow types; an untyped image column named by ``image_key`` read as an Image."""
    schema = _schema(files)
    features = card if card is not None else datasets_module().Features.from_arrow_schema(schema)
    return _features(features, schema, image_key)


def open_dataset(where: OnDisk, split: str | None = None, image_key: str | None = None) -> Any:
    """A ``datasets.Dataset`` of ``where`` (``split`` of a DatasetDict or a Hub layout, default ``train``), with
    nothing written anywhere (NOTE [ Nothing written beside the data ]); an untyped image column named by
    ``image_key`` read as an ``Image``."""
    datasets = datasets_module()
    if where.kind == "hf":
        folder, _ = where.split_dir(split)
        ds = datasets.load_from_disk(str(folder))
        features = _features(ds.features, ds.data.table.schema, image_key)
        if image_key is not None and image_key in features and features[image_key] != ds.features[image_key]:
            ds = ds.cast_column(image_key, features[image_key])  # an Arrow cast in memory: no cache file
        return ds
    from datasets.table import InMemoryTable, table_cast

    files, chosen = where.split_files(split)
    features = parquet_features(files, image_key, where.layout.features if where.layout else None)
    try:
        table = table_cast(read_files(files).replace_schema_metadata(None), features.arrow_schema)
    except (ValueError, TypeError) as e:  # a name the card's ClassLabel lacks, an index beyond it: load_dataset too
        said = f"the features of {where.root / CARD}" if where.layout and where.layout.features else "their features"
        what = where.shown + (f" ({chosen} split)" if chosen else "")
        raise DataError(
            f"{what}: its files do not fit {said} ({type(e).__name__}: {e}); fix the files or the card's dataset_info"
        ) from None
    # the fingerprint names this content in gpufeed's cache key (datasets would otherwise hash every byte)
    listing = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    info = datasets.DatasetInfo(features=features)
    return datasets.Dataset(InMemoryTable(table), info=info, split=chosen, fingerprint=_digest(listing)[:16])


def source(where: OnDisk, split: str | None, image_key: str | None, label_key: str | None) -> Source:
    """``gpufeed convert``'s :class:`~gpufeed.mds.sources.Source` of ``where``: a save_to_disk dataset is one
    unit read through its indices mapping; Parquet files are one unit each, their rows counted from the footers.
    The fingerprint covers the files (names, sizes; a saved dataset's own fingerprint) and the columns read."""
    from .items import Source

    if where.kind in ("parquet", "arrow"):
        files, chosen = where.split_files(split)
        what = where.shown + (f" ({chosen} split)" if chosen else "")
        features = parquet_features(files, image_key, where.layout.features if where.layout else None)
        image, label, classes = columns(features, image_key, label_key, what)
        stored = _schema(files).field(label).type if label is not None else None
        numbering = _numbering(features, label, lambda: column_values(files, str(label)), stored)
        classes = list(numbering) if numbering is not None and classes is None else classes
        counts = rows_counted(files)
        firsts = [sum(counts[:u]) for u in range(len(counts))]
        width = _key_width(sum(counts))
        if where.layout is None:
            listing: list[Any] = [[f.name, f.stat().st_size] for f in files]
        else:  # the split's files by their place in the folder, and which config and split they are
            listing = [[f.relative_to(where.root).as_posix(), f.stat().st_size] for f in files]
            listing += [where.layout.config, chosen]

        def read_file(unit: int, start: int) -> Iterator[Item]:
            return file_rows(files[unit], image, label, firsts[unit], start, width, numbering)

        units = tuple(str(f) for f in files)
        card = [classes] if where.layout is not None and where.layout.features is not None else []  # its names
        fingerprint = _digest([listing, image, label, *card])
        return Source(where.shown, where.root, where.kind, units, _tuple(classes), sum(counts), fingerprint, chosen,
                      reader=read_file)  # fmt: skip
    folder, chosen = where.split_dir(split)
    ds = datasets_module().load_from_disk(str(folder))
    features = _features(ds.features, ds.data.table.schema, image_key)
    what = where.shown + (f" ({chosen} split)" if chosen else "")
    image, label, classes = columns(features, image_key, label_key, what)
    numbering = _numbering(features, label, lambda: ds.data.table.column(label))
    classes = list(numbering) if numbering is not None else classes
    width = _key_width(len(ds))

    def read_saved(unit: int, start: int) -> Iterator[Item]:
        return saved_rows(ds, image, label, start, width, what, numbering)

    fingerprint = _digest([_saved_fingerprint(folder), chosen, image, label])
    return Source(where.shown, where.root, "hf", (str(folder),), _tuple(classes), len(ds), fingerprint, chosen,
                  reader=read_saved)  # fmt: skip


def _numbering(features: Any, label: str | None, values: Any, stored: Any = None) -> dict[str, int] | None:
    """A label column's class index by the value stored (its ``str``): a string column's names sorted (as
    :func:`gpufeed.read.hf_columns.read_labels` numbers them, over all of ``values()``, an Arrow array of the
    column); a card's ClassLabel over files (``stored`` their Arrow type), by its names where they hold names and
    its indices where they hold integers, as ``load_dataset`` casts them (a value it lacks is a bad row); None for
    any other column."""
    import pyarrow as pa

    from ..read.hf_columns import label_kind

    kind = label_kind(features[label]) if label is not None else None
    if kind == "class" and stored is not None:
        names = list(features[label].names)
        if pa.types.is_string(stored) or pa.types.is_large_string(stored) or pa.types.is_dictionary(stored):
            return {name: i for i, name in enumerate(names)}
        return {str(i): i for i in range(len(names))}
    if kind != "string":
        return None
    import pyarrow.compute as pc

    names = sorted(str(v) for v in pc.unique(values()).to_pylist() if v is not None)
    return {name: i for i, name in enumerate(names)}


def _tuple(classes: list[str] | None) -> tuple[str, ...] | None:
    return tuple(classes) if classes is not None else None


def _digest(listing: object) -> str:
    return hashlib.sha1(json.dumps(listing).encode()).hexdigest()


def _saved_fingerprint(folder: Path) -> list[Any]:
    """A ``save_to_disk`` folder's identity: ``state.json``'s fingerprint and its Arrow files' names and sizes."""
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{folder / 'state.json'}: cannot be read ({e}); save the dataset again") from None
    return [state.get("_fingerprint"), [[p.name, p.stat().st_size] for p in sorted(folder.glob("*.arrow"))]]


def _key_width(count: int) -> int:
    """Digits of the last row's index: keys then sort as the rows do."""
    return len(str(max(count - 1, 0)))
