"""Hugging Face data on disk: a ``save_to_disk`` folder or Parquet files, found, opened and read row by row.

Two readers use it. ``gpufeed convert`` reads the image column's encoded bytes straight from Arrow (never
``ds[i]``, which decodes), in the dataset's order, into MDS shards; ``--data`` of ``gpufeed train`` and the other
commands opens a ``datasets.Dataset`` that :func:`gpufeed.read.hf.arrow_images` serves as it serves one in Python.
Both find the columns by :func:`gpufeed.read.hf.find_columns`, so they read the same ones.

NOTE [ Nothing written beside the data ]
``datasets.load_from_disk`` memory-maps the Arrow files and writes nothing; ``load_dataset("parquet", ...)`` and
``Dataset.from_parquet`` would copy the files into the Hugging Face cache, so Parquet is read with ``pyarrow``
alone (for ``--data``: a ``datasets.Dataset`` over that in-memory table, which has no cache files either). A
dataset's folder is only read.
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

EVAL_SPLITS = ("validation", "valid", "val", "test")  # a DatasetDict's evaluation split: the first of these
_SLICE = 256  # rows turned into Python bytes at a time: a few MiB of images
_DATASET_FILES = ("state.json", "dataset_info.json")  # what Dataset.save_to_disk writes beside its .arrow files
_DICT_FILE = "dataset_dict.json"  # what DatasetDict.save_to_disk writes beside its split folders


@dataclass(frozen=True)
class OnDisk:
    """Where a Hugging Face dataset lies: ``kind`` ``"hf"`` (a ``save_to_disk`` folder, ``splits`` those of a
    DatasetDict, ``()`` for a Dataset) or ``"parquet"`` (``files``, sorted by name); ``root`` the folder that
    holds it (never written); ``shown`` as messages name it."""

    kind: str
    root: Path
    shown: str
    splits: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()

    @property
    def what(self) -> str:
        if self.kind == "parquet":
            return f"{len(self.files)} Parquet file{'s' * (len(self.files) != 1)} {self.shown}"
        return f"the Hugging Face dataset {self.shown}" + (f" (splits {', '.join(self.splits)})" if self.splits else "")

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
        chosen = split or "train"
        if chosen not in self.splits:
            asked = f"split={split!r}" if split is not None else "no split given and none is named train"
            raise ConfigError(
                f"{asked}: the Hugging Face dataset {self.shown} has the splits {list(self.splits)}; pass one of "
                "them (--split NAME)"
            )
        return self.root / chosen, chosen


def locate(src: str | Path) -> OnDisk | None:
    """The Hugging Face dataset ``src`` names: a ``save_to_disk`` folder (``state.json`` + ``dataset_info.json``,
    or a DatasetDict's ``dataset_dict.json``), a ``.parquet`` file, a folder holding them, or a glob matching them;
    None for anything else (an image folder, tars).

    Raises:
        ConfigError: a folder that holds both Parquet files and subfolders (which is meant?).
    """
    text = str(src)
    path = Path(text).expanduser()
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
    files = sorted(p for p in root.iterdir() if p.suffix == ".parquet" and p.is_file())
    if not files:
        return None
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if folders:
        raise ConfigError(
            f"{text} holds both Parquet files ({files[0].name}, ...) and folders ({', '.join(folders[:3])}, ...): "
            f"give the Parquet files as a quoted pattern ('{root}/*.parquet'), or the folder you mean"
        )
    return OnDisk("parquet", root, str(root), files=tuple(files))


def _dict_splits(root: Path) -> tuple[str, ...]:
    try:
        splits = json.loads((root / _DICT_FILE).read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"{root / _DICT_FILE}: cannot be read as a DatasetDict's list of splits ({e}); save it again"
        ) from None
    return tuple(str(s) for s in splits)


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "reading a Hugging Face dataset (a save_to_disk folder or Parquet files) needs the datasets package: "
            "pip install 'gpufeed[hf]'"
        ) from None
    return datasets


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
    datasets = _datasets()
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


def _parquet_schema(files: tuple[Path, ...]) -> Any:
    """The Arrow schema the files share (read from their footers).

    Raises:
        DataError: a file that is not Parquet, or whose columns differ from the first file's.
    """
    import pyarrow.parquet as pq

    first = None
    for f in files:
        try:
            schema = pq.read_schema(f)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{f}: cannot be read as Parquet ({e}); download or write it again") from None
        if first is None:
            first = schema
        elif not schema.remove_metadata().equals(first.remove_metadata()):
            raise DataError(
                f"{f}: its columns ({', '.join(schema.names)}) differ from those of {files[0].name} "
                f"({', '.join(first.names)}), or their types do; give the files of one dataset"
            )
    return first


def parquet_features(files: tuple[Path, ...], image_key: str | None) -> Any:
    """The files' ``datasets.Features``: from the Hugging Face metadata ``to_parquet`` writes into the schema,
    else inferred from the Arrow types; an untyped image column named by ``image_key`` read as an Image."""
    schema = _parquet_schema(files)
    return _features(_datasets().Features.from_arrow_schema(schema), schema, image_key)


def open_dataset(where: OnDisk, split: str | None = None, image_key: str | None = None) -> Any:
    """A ``datasets.Dataset`` of ``where`` (``split`` of a DatasetDict), with nothing written anywhere (NOTE
    [ Nothing written beside the data ]); an untyped image column named by ``image_key`` read as an ``Image``."""
    datasets = _datasets()
    if where.kind == "hf":
        folder, _ = where.split_dir(split)
        ds = datasets.load_from_disk(str(folder))
        features = _features(ds.features, ds.data.table.schema, image_key)
        if image_key is not None and image_key in features and features[image_key] != ds.features[image_key]:
            ds = ds.cast_column(image_key, features[image_key])  # an Arrow cast in memory: no cache file
        return ds
    if split is not None:
        raise ConfigError(f"split={split!r}: {where.what} are one dataset, not a DatasetDict: drop the split")
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.table import InMemoryTable, table_cast

    features = parquet_features(where.files, image_key)
    # memory_map: an uncompressed column chunk is read in place; compressed pages are decoded into memory anyway
    table = pa.concat_tables(pq.read_table(f, memory_map=True) for f in where.files)
    table = table_cast(table.replace_schema_metadata(None), features.arrow_schema)
    # the fingerprint names this content in gpufeed's cache key (datasets would otherwise hash every byte)
    listing = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in where.files]
    info = datasets.DatasetInfo(features=features)
    return datasets.Dataset(InMemoryTable(table), info=info, fingerprint=_digest(listing)[:16])


def source(where: OnDisk, split: str | None, image_key: str | None, label_key: str | None) -> Source:
    """``gpufeed convert``'s :class:`~gpufeed.mds.sources.Source` of ``where``: a save_to_disk dataset is one
    unit read through its indices mapping; Parquet files are one unit each, their rows counted from the footers.
    The fingerprint covers the files (names, sizes; a saved dataset's own fingerprint) and the columns read."""
    from .items import Source

    if where.kind == "parquet":
        if split is not None:
            raise ConfigError(f"split={split!r}: {where.what} are one dataset, not a DatasetDict: drop the split")
        features = parquet_features(where.files, image_key)
        image, label, classes = columns(features, image_key, label_key, where.what)
        numbering = _numbering(features, label, lambda: _parquet_values(where.files, str(label)))
        classes = list(numbering) if numbering is not None else classes
        counts = _parquet_rows(where.files)
        firsts = [sum(counts[:u]) for u in range(len(counts))]
        width = _key_width(sum(counts))
        listing = [[f.name, f.stat().st_size] for f in where.files]

        def read_file(unit: int, start: int) -> Iterator[Item]:
            return file_rows(where.files[unit], image, label, firsts[unit], start, width, numbering)

        units = tuple(str(f) for f in where.files)
        fingerprint = _digest([listing, image, label])
        return Source(where.shown, where.root, "parquet", units, _tuple(classes), sum(counts), fingerprint,
                      reader=read_file)  # fmt: skip
    folder, chosen = where.split_dir(split)
    ds = _datasets().load_from_disk(str(folder))
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


def _numbering(features: Any, label: str | None, values: Any) -> dict[str, int] | None:
    """A string label column's class indices: its names sorted (as :func:`gpufeed.read.hf_columns.read_labels`
    numbers them, over all of ``values()``, an Arrow array of the column); None for any other column."""
    from ..read.hf_columns import label_kind

    if label is None or label_kind(features[label]) != "string":
        return None
    import pyarrow.compute as pc

    names = sorted(str(v) for v in pc.unique(values()).to_pylist() if v is not None)
    return {name: i for i, name in enumerate(names)}


def _parquet_values(files: tuple[Path, ...], column: str) -> Any:
    """One column of every file, as one Arrow array (labels: small beside the images, which are not read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.chunked_array([c for f in files for c in pq.read_table(f, columns=[column]).column(column).chunks])


def _tuple(classes: list[str] | None) -> tuple[str, ...] | None:
    return tuple(classes) if classes is not None else None


def _parquet_rows(files: tuple[Path, ...]) -> list[int]:
    """Each file's rows, from its footer."""
    import pyarrow.parquet as pq

    return [pq.read_metadata(f).num_rows for f in files]


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


def rows(
    table: Any,
    image_key: str,
    label_key: str | None,
    first: int,
    width: int,
    what: str,
    at: int,
    numbering: dict[str, int] | None = None,
) -> Iterator[Item]:
    """The rows of ``table`` (an Arrow table or record batch holding the two columns) as items: key the row's
    index in the dataset (``first`` is the first row's) zero-padded to ``width``, the image's bytes as stored (an
    image given only by a path is read from it by :func:`~gpufeed.mds.sources.prepare`, as a folder's file), the
    label (-1: none; a class name numbered by ``numbering``); errors name ``what`` and the row's index there (``at``
    the first's)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .items import Item

    images = table.column(image_key)
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks()
    if pa.types.is_struct(images.type):  # struct_field honours a sliced struct's offset (.field() does not)
        data, paths = pc.struct_field(images, "bytes").to_pylist(), pc.struct_field(images, "path").to_pylist()
    else:
        data, paths = images.to_pylist(), [None] * len(images)
    labels = table.column(label_key).to_pylist() if label_key is not None else [-1] * len(images)
    if numbering is not None:
        labels = [None if v is None else numbering[str(v)] for v in labels]
    for j, (raw, path, label) in enumerate(zip(data, paths, labels, strict=True)):
        key, where = f"{first + j:0{width}d}", f"{what} row {at + j}"
        label = -1 if label is None else int(label)  # a ClassLabel's missing value is -1 too: no label
        if label < -1:
            yield Item(key, -1, None, where, f"{where}: label {label} in {label_key!r} is not a class index (>= 0)")
        elif raw is not None:
            yield Item(key, label, raw, where)
        elif path:
            yield Item(key, label, None, str(path))
        else:
            yield Item(key, label, None, where, f"{where}: no image (its {image_key!r} holds neither bytes nor a path)")


def saved_rows(
    ds: Any,
    image_key: str,
    label_key: str | None,
    start: int,
    width: int,
    what: str,
    numbering: dict[str, int] | None = None,
) -> Iterator[Item]:
    """A loaded dataset's rows from ``start`` on, read from its Arrow table through its indices mapping (a
    ``select`` or ``shuffle`` view not flattened), a slice at a time: ``ds[i]`` would decode each image."""
    table = ds.data.table.select([image_key] + ([label_key] if label_key is not None else []))
    indices = getattr(ds, "_indices", None)
    mapping = indices.column(0) if indices is not None else None
    for at in range(start, len(ds), _SLICE):
        n = min(_SLICE, len(ds) - at)
        part = table.slice(at, n) if mapping is None else table.take(mapping.slice(at, n))
        yield from rows(part, image_key, label_key, at, width, what, at, numbering)


def file_rows(
    path: Path,
    image_key: str,
    label_key: str | None,
    first: int,
    start: int,
    width: int,
    numbering: dict[str, int] | None = None,
) -> Iterator[Item]:
    """A Parquet file's rows from ``start`` on (``first``: its first row's index in the dataset); the row groups
    before ``start`` are not read."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as pf:
        groups: list[int] = []
        skip = start
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if not groups and skip >= n:
                skip -= n
                continue
            groups.append(g)
        if not groups:  # started at the file's end: a finished part ended there
            return
        at = start - skip  # the first kept group's first row, in the file
        keep = [image_key] + ([label_key] if label_key is not None else [])
        for batch in pf.iter_batches(batch_size=_SLICE, row_groups=groups, columns=keep):
            if skip:
                dropped = min(skip, batch.num_rows)
                batch, at, skip = batch.slice(dropped), at + dropped, skip - dropped
            if batch.num_rows:
                yield from rows(batch, image_key, label_key, first + at, width, str(path), at, numbering)
                at += batch.num_rows
