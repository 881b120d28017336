"""A Hugging Face dataset's files and rows, read: Parquet or Arrow files (one table, a column, row counts) and the
rows ``gpufeed convert`` copies (:func:`rows`: the image column's encoded bytes straight from Arrow, never
``ds[i]``, which decodes), from a saved dataset's table or a file, from any row on (a resume).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .items import Item

__all__ = [
    "arrow_table",
    "column_values",
    "file_format",
    "file_rows",
    "open_arrow",
    "read_files",
    "rows",
    "rows_counted",
    "saved_rows",
]

_SLICE = 256  # rows turned into Python bytes at a time: a few MiB of images


def file_format(files: tuple[Path, ...]) -> str:
    return "arrow" if files and files[0].suffix.lower() == ".arrow" else "parquet"


def open_arrow(f: Path) -> Any:
    """A reader of an Arrow file, memory-mapped: the IPC stream format (what ``datasets`` writes), else the file
    format, as ``datasets``' Arrow builder opens it."""
    import pyarrow as pa

    source = pa.memory_map(str(f))
    try:
        return pa.ipc.open_stream(source)
    except (OSError, pa.ArrowInvalid):
        return pa.ipc.open_file(source)


def arrow_table(f: Path) -> Any:
    return open_arrow(f).read_all()  # buffers over the mapping: nothing copied


def read_files(files: tuple[Path, ...]) -> Any:
    """The files' rows as one Arrow table (memory-mapped: an uncompressed Parquet column chunk and an Arrow file's
    buffers are read in place; compressed pages are decoded into memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file_format(files) == "arrow":
        return pa.concat_tables(arrow_table(f) for f in files)
    return pa.concat_tables(pq.read_table(f, memory_map=True) for f in files)


def column_values(files: tuple[Path, ...], column: str) -> Any:
    """One column of every file, as one Arrow array (labels: small beside the images, which are not read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file_format(files) == "arrow":
        return pa.chunked_array([c for f in files for c in arrow_table(f).column(column).chunks])
    return pa.chunked_array([c for f in files for c in pq.read_table(f, columns=[column]).column(column).chunks])


def rows_counted(files: tuple[Path, ...]) -> list[int]:
    """Each file's rows, from its footer (an Arrow file's from its batches' headers, its buffers not read)."""
    import pyarrow.parquet as pq

    if file_format(files) == "arrow":
        return [arrow_table(f).num_rows for f in files]
    return [pq.read_metadata(f).num_rows for f in files]


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
    label (-1: none, ``label_key`` None; a class name numbered by ``numbering``); errors name ``what`` and the row's
    index there (``at`` the first's): a row of a label column without a label (null, a ClassLabel's -1) is one."""
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
    for j, (raw, path, value) in enumerate(zip(data, paths, labels, strict=True)):
        key, where = f"{first + j:0{width}d}", f"{what} row {at + j}"
        if label_key is not None and (value is None or value == -1):
            # -1 is the format's "no label": a labelled dataset's row without one would stop training mid-epoch
            shown = "None" if value is None else "-1, a ClassLabel's missing value"
            yield Item(key, -1, None, where, f"{where}: no label ({shown} in {label_key!r}); a split without labels: "
                       "--label-key none (label_key=None)")  # fmt: skip
            continue
        label = int(value) if numbering is None else numbering.get(str(value), -2)
        if numbering is not None and label == -2:
            yield Item(key, -1, None, where, f"{where}: label {value!r} in {label_key!r} is not a class (there are "
                       f"{len(numbering)}); fix the row, or the card's ClassLabel")  # fmt: skip
        elif label < -1:
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

    keep = [image_key] + ([label_key] if label_key is not None else [])
    if path.suffix.lower() == ".arrow":
        table = arrow_table(path).select(keep).slice(start)
        for at in range(0, table.num_rows, _SLICE):
            part = table.slice(at, _SLICE)
            yield from rows(part, image_key, label_key, first + start + at, width, str(path), start + at, numbering)
        return
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
        for batch in pf.iter_batches(batch_size=_SLICE, row_groups=groups, columns=keep):
            if skip:
                dropped = min(skip, batch.num_rows)
                batch, at, skip = batch.slice(dropped), at + dropped, skip - dropped
            if batch.num_rows:
                yield from rows(batch, image_key, label_key, first + at, width, str(path), at, numbering)
                at += batch.num_rows
