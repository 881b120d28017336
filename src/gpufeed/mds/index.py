"""An MDS index: its shards, where a global sample id lives, and how a sample record holds its image and label.

MDS layout (``streaming``'s ``MDSWriter``): ``index.json`` lists the shards (``samples``, ``raw_data.basename``,
``column_names``/``column_encodings``/``column_sizes``, ...); a shard file is ``uint32 samples``,
``uint32 offsets[samples + 1]`` (absolute), then each sample record: one ``uint32`` size per variable-size column,
then the columns' bytes, in the index's column order.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from ..inside import Root, check_name
from .digests import SAMPLE_COLUMN

__all__ = ["FILE_KEYS", "IMAGE_ENCODINGS", "LABEL_ENCODINGS", "RESERVED", "Index"]

# encodings whose bytes are a whole image file, as the file was (``bytes``: whatever was written; ``jpeg``/``png``:
# the engine's PIL encoders write a file's bytes). Not ``pil``/``ndarray`` (pixels), nor ``jpeg_array`` or
# ``list[...]`` (several images behind a header of their own).
IMAGE_ENCODINGS = ("bytes", "jpeg", "png")
# integer encodings -> struct format (little-endian, as numpy writes them); ``str_int``: decimal digits
LABEL_ENCODINGS = {
    "int": "<q",
    "int8": "<b",
    "int16": "<h",
    "int32": "<i",
    "int64": "<q",
    "uint8": "<B",
    "uint16": "<H",
    "uint32": "<I",
    "uint64": "<Q",
    "str_int": "",
}


_SHARD_KEYS = ("samples", "raw_data", "column_names", "column_encodings", "column_sizes")
# the entries of a shard that name a file (relative to the index's folder, and to the remote's prefix)
FILE_KEYS = ("raw_data", "zip_data", "raw_meta", "zip_meta")
# files of a dataset's folder (or a remote's local) that are not shards: a shard named so would overwrite one
RESERVED = frozenset({"index.json", "gpufeed.json", "gpufeed-remote.json", ".gpufeed-claim"})
_FIX = (
    "the index is damaged or crafted (shard names are relative to the folder of index.json, and gpufeed reads and "
    "downloads only below it): write the dataset again with gpufeed convert or streaming.MDSWriter"
)


@dataclass(frozen=True)
class _Columns:
    """Where a shard layout keeps the image and label columns inside a sample record, and the ``sha1`` (hex of the
    image's bytes) and ``key`` columns ``gpufeed convert`` writes, when the layout has them."""

    sizes: tuple[int | None, ...]  # fixed size of each column, None = variable (its size leads the record)
    image: int
    label: int | None
    label_format: str
    digest: int | None = None
    key: int | None = None
    sample: int | None = None  # ``sample_sha1`` (image and label: NOTE [ What a sample's digests cover ])

    @classmethod
    def of(cls, shard: dict[str, Any], image_key: str, label_key: str | None) -> _Columns:
        names, encodings = shard["column_names"], shard["column_encodings"]
        where = f"shard {shard['raw_data']['basename']} (columns {dict(zip(names, encodings, strict=True))})"
        if image_key not in names:
            raise ConfigError(f"image_key={image_key!r} is not a column of {where}; pass image_key=<its image column>")
        image_encoding = encodings[names.index(image_key)]
        if image_encoding not in IMAGE_ENCODINGS:
            raise ConfigError(
                f"column {image_key!r} has encoding {image_encoding!r}, not an image file's bytes ({where}); gpufeed "
                f"reads image columns of encodings {IMAGE_ENCODINGS}: convert with `gpufeed convert` or write the "
                "files' bytes with MDSWriter(columns={..., 'image': 'bytes'})"
            )
        label, label_format = None, ""
        if label_key is not None:
            if label_key not in names:
                raise ConfigError(f"label_key={label_key!r} is not a column of {where}; pass label_key=None for none")
            label = names.index(label_key)
            if encodings[label] not in LABEL_ENCODINGS:
                raise ConfigError(
                    f"column {label_key!r} has encoding {encodings[label]!r} ({where}); a label column is one of "
                    f"{sorted(LABEL_ENCODINGS)}"
                )
            label_format = LABEL_ENCODINGS[encodings[label]]
        sizes = tuple(int(s) if s else None for s in shard["column_sizes"])

        def text_column(name: str) -> int | None:
            return names.index(name) if name in names and encodings[names.index(name)] == "str" else None

        # the sample digest covers the converter's label column: checked only when that is the one read
        sample = text_column(SAMPLE_COLUMN) if label_key == "label" else None
        return cls(sizes, names.index(image_key), label, label_format, text_column("sha1"), text_column("key"), sample)

    def _spans(self, record: bytes) -> list[tuple[int, int]]:
        """``(start, end)`` of each column's bytes in ``record``; a ValueError if they overrun it."""
        variable = sum(s is None for s in self.sizes)
        lengths = iter(struct.unpack_from(f"<{variable}I", record, 0))
        at, spans = 4 * variable, []
        for fixed in self.sizes:
            size = fixed if fixed is not None else next(lengths)
            spans.append((at, at + size))
            at += size
        if at > len(record):
            raise ValueError(f"the record holds {len(record)} bytes, its columns {at}")
        return spans

    def parse(self, record: bytes) -> tuple[bytes, int, bytes | None, bytes | None]:
        """The image bytes, the label (-1 without a label column), the stored sha1 of the image and the stored
        sample digest (hex, ASCII; None without a ``sha1`` / ``sample_sha1`` column) of one sample record."""
        spans = self._spans(record)
        begin, end = spans[self.image]
        image, label = record[begin:end], -1
        if self.label is not None:
            begin, end = spans[self.label]
            raw = record[begin:end]
            label = int(raw.decode()) if not self.label_format else struct.unpack(self.label_format, raw)[0]
            if not -(1 << 63) <= label < 1 << 63:  # served as int64 (a uint64 column's high bit, a long str_int)
                raise ValueError(f"its label {label} does not fit an int64")
        digest = sample = None
        if self.digest is not None:
            begin, end = spans[self.digest]
            digest = record[begin:end]
        if self.sample is not None:
            begin, end = spans[self.sample]
            sample = record[begin:end]
        return image, label, digest, sample

    def key_of(self, record: bytes) -> str | None:
        """The sample's ``key`` column (its name in the source: a file's path), None without one."""
        if self.key is None:
            return None
        begin, end = self._spans(record)[self.key]
        return record[begin:end].decode("utf-8", errors="replace")


class Index:
    """An MDS ``index.json``: its shards, their sample counts and files, and where each global sample id lives.

    Example::

        index = Index.load("/data/imagenet-mds/index.json")
        shard, position = index.locate(np.array([0, 5000]))
    """

    def __init__(self, obj: dict[str, Any], source: str, image_key: str = "image", label_key: str | None = "label"):
        shards = obj.get("shards") if isinstance(obj, dict) else None
        if not shards or obj.get("version") != 2:
            raise DataError(f"{source} is not an MDS index (version 2, with shards); write it with streaming.MDSWriter")
        for k, entry in enumerate(shards):
            missing = [key for key in _SHARD_KEYS if not isinstance(entry, dict) or key not in entry]
            raw = entry.get("raw_data") if isinstance(entry, dict) else None
            if missing or not isinstance(raw, dict) or "basename" not in raw or "bytes" not in raw:
                raise DataError(
                    f"{source}: shard {k} lacks {missing or ['raw_data.basename/bytes']}; the index is damaged or not "
                    "MDS: write it again with streaming.MDSWriter or gpufeed convert"
                )
        seen: dict[str, str] = {}  # a file's normal name -> the entry that listed it first
        for k, s in enumerate(shards):
            if s.get("format") != "mds":
                raise DataError(f"{source}: shard {s.get('raw_data')} has format {s.get('format')!r}, not 'mds'")
            for key, name in _files(s):
                why = check_name(name)
                # './index.json' and 'a.mds/' are the files 'index.json' and 'a.mds': one file is never two entries
                normal = posixpath.normpath(name) if why is None else ""
                if why is None and normal.split("/")[0] in RESERVED:  # 'index.json/x' too: no file goes below one
                    why = "is a file of the dataset, not a shard"
                elif why is None and normal in seen:
                    why = f"is the file {seen[normal]} lists too (its samples would be served twice, the others never)"
                if why is not None:
                    raise DataError(f"{source} (shard {k}, {key}.basename) lists {name!r}, which {why}; {_FIX}")
                seen[normal] = f"shard {k}'s {key}.basename"
        self.source = source
        self.shards: list[dict[str, Any]] = shards
        self.samples_per_shard = np.array([s["samples"] for s in shards], dtype=np.int64)
        self.ends = np.cumsum(self.samples_per_shard)
        self.starts = self.ends - self.samples_per_shard
        self.num_samples = int(self.ends[-1])
        self.basenames = [s["raw_data"]["basename"] for s in shards]
        self.max_bytes = np.array(
            [s["raw_data"]["bytes"] + ((s.get("zip_data") or {}).get("bytes") or 0) for s in shards], dtype=np.int64
        )
        canonical = json.dumps(shards, sort_keys=True, separators=(",", ":")).encode()
        self.fingerprint = hashlib.sha1(canonical).hexdigest()
        layouts: dict[str, _Columns] = {}
        self.columns: list[_Columns] = []
        for s in shards:
            key = json.dumps([s["column_names"], s["column_encodings"], s["column_sizes"]])
            if key not in layouts:
                layouts[key] = _Columns.of(s, image_key, label_key)
            self.columns.append(layouts[key])
        # every shard has the sha1 column gpufeed convert writes: each sample can be checked against its bytes
        self.has_digests = all(c.digest is not None for c in self.columns)
        # ... and the sample digest, which covers the label too (NOTE [ What a sample's digests cover ])
        self.has_sample_digests = all(c.sample is not None for c in self.columns)

    @classmethod
    def load(cls, path: str | os.PathLike[str], image_key: str = "image", label_key: str | None = "label") -> Index:
        try:
            obj = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise DataError(
                f"{path} does not exist: local= must hold an MDS dataset (index.json and its shards); for remote data "
                "pass remote=<its URL or directory> and local=<a cache directory>"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{path} is not JSON ({e}); it is not an MDS index") from None
        return cls(obj, str(path), image_key, label_key)

    def paths(self, root: str | os.PathLike[str]) -> list[str]:
        """Each shard's file below ``root`` (the dataset's folder, or a remote's local cache), every file a shard
        names checked to stay inside ``root`` once symlinks are resolved (:func:`gpufeed.inside.inside`): a
        DataError naming the shard otherwise."""
        out, below = [], Root(root)
        for k, s in enumerate(self.shards):
            for key, name in _files(s):
                path = below.join(name, listed_in=f"{self.source} (shard {k}, {key}.basename)", fix=_FIX)
                if key == "raw_data":
                    out.append(path)
        return out

    def check_hash(self, validate_hash: str | None) -> None:
        """A ConfigError, before any shard is fetched, when the engine's ``validate_hash`` has nothing to check: the
        index records no such hash of the shards' files (``gpufeed convert`` records none: its samples carry their
        own digests instead)."""
        if validate_hash is None:
            return
        for k, s in enumerate(self.shards):
            file = s.get("zip_data") or s["raw_data"]  # the file the engine downloads and hashes
            hashes = file.get("hashes") if isinstance(file, dict) else None
            if not isinstance(hashes, dict) or validate_hash not in hashes:
                have = sorted(hashes) if isinstance(hashes, dict) else []
                raise ConfigError(
                    f"validate_hash={validate_hash!r}: {self.source} records no {validate_hash} hash of shard {k} "
                    f"({self.basenames[k]}; it records {have or 'none'}): pass validate_hash=None, or one the index "
                    "records (MDSWriter(hashes=[...]) writes them)"
                )

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def locate(self, ids: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, position in shard)`` of each global sample id."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_samples):
            raise IndexError(f"sample ids must be in [0, {self.num_samples}); got {ids.min()}..{ids.max()}")
        shard = np.searchsorted(self.ends, ids, side="right")
        return shard, ids - self.starts[shard]


def _files(shard: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(entry, basename)`` of each file a shard's index entry names."""
    return [(key, shard[key].get("basename")) for key in FILE_KEYS if isinstance(shard.get(key), dict)]
