"""A sample as ``gpufeed convert`` reads it (:class:`Item`) and a source of them (:class:`Source`): the records
:mod:`.sources` (folders, tars) and :mod:`.hf` (Hugging Face datasets) both make, kept apart from both so that
neither imports the other's module to build one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError
from . import wds

__all__ = ["Item", "Source"]


@dataclass(frozen=True)
class Item:
    """One source sample: its key, label (-1: none), the image file's bytes (``None`` for a folder's file until
    :func:`ready` reads it), where it is (a path, or ``tar:key.ext``) and why it cannot be used (``None``: it may).
    """

    key: str
    label: int
    data: bytes | None
    where: str
    error: str | None = None


@dataclass(frozen=True)
class Source:
    """``kind`` ``folder``, ``food101``, ``wds``, ``hf`` (a save_to_disk folder) or ``parquet``; ``units`` the
    folder, the tars or the Parquet files; ``count`` the samples when known before reading (not of tars);
    ``fingerprint`` a digest of the listing (file names, tar sizes) and of the columns read; ``reader`` a
    Hugging Face source's rows of ``(unit, start)``."""

    path: str
    root: Path
    kind: str
    units: tuple[str, ...]
    classes: tuple[str, ...] | None
    count: int | None
    fingerprint: str
    split: str | None = None
    files: tuple[tuple[str, int], ...] = ()  # a folder's (path, label), in the dataset's order
    reader: Callable[[int, int], Iterator[Item]] | None = field(default=None, compare=False, repr=False)

    def items(self, unit: int, start: int = 0) -> Iterator[Item]:
        """The samples of ``units[unit]`` from position ``start`` on."""
        if self.kind == "wds":
            for sample in wds.samples(Path(self.units[unit]), skip=start):
                yield _tar_item(sample)
            return
        if self.reader is not None:
            yield from self.reader(unit, start)
            return
        for path, label in self.files[start:]:
            yield Item(Path(path).relative_to(self.root).as_posix(), label, None, path)


def _tar_item(sample: wds.WdsSample) -> Item:
    field = wds.image_field(sample)
    if field is None:
        has = ", ".join(sorted(sample.fields)) or "nothing"
        return Item(
            sample.key,
            -1,
            None,
            sample.where,
            f"{sample.where}: no image (fields {has}; an image is one of {', '.join(wds.IMAGE_FIELDS)})",
        )
    try:
        label = wds.label_of(sample)
    except DataError as e:
        return Item(sample.key, -1, None, sample.where, str(e))
    return Item(sample.key, label, sample.fields[field], f"{sample.where}.{field}")
