"""The on-disk layout of a gpufeed cache; the only module that knows it.

A cache is a directory::

    <name>/
      images.bin      raw C-order little-endian array bytes (memory-mappable), no header
      labels.bin
      manifest.json   written last: format, version, key, per array dtype, shape, size and the
                      blake2b hash of every 64 MiB block, and a digest of the manifest itself

A directory without a valid manifest is not a cache. The manifest's own digest covers every other
field, so an edited shape, dtype or byte order is caught even when the byte count still adds up.
Readers check sizes always and block hashes when asked (the default), so truncation, a zero-filled
tail, bit flips and swapped files are caught before a sample is served.

A directory whose manifest parses and names this format (any version, damaged or not) is
gpufeed's own: the only kind of directory gpufeed will replace or delete (:func:`is_gpufeed_entry`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CacheError

__all__ = [
    "BLOCK_BYTES",
    "DTYPES",
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "ArraySpec",
    "Manifest",
    "block_hashes",
    "dtype_code",
    "hashes",
    "is_gpufeed_entry",
]

FORMAT = "gpufeed-cache"
VERSION = 2  # 2: explicit byte order in dtypes, manifest digest
MANIFEST = "manifest.json"
BLOCK_BYTES = 64 << 20

# The dtypes gpufeed writes, in numpy's explicit spelling ("|" no byte order, "<" little-endian).
# Anything else in a manifest was not written by gpufeed and is refused before a byte is mapped.
DTYPES = ("|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8")


def _hash(block: memoryview | bytes) -> str:
    return hashlib.blake2b(block, digest_size=16).hexdigest()


def hashes(blocks: Iterable[Callable[[], Any]], threads: int = 4) -> tuple[str, ...]:
    """blake2b of each block, ``blocks`` giving a function that makes it (a buffer), in ``threads`` threads.

    A block is made inside its thread, so at most ``threads`` copies exist at once when making one
    copies (a slice of a strided array); hashlib releases the GIL, so the threads run in parallel.
    """
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return tuple(pool.map(lambda make: _hash(memoryview(make()).cast("B")), blocks))


def block_hashes(buffer: Any, threads: int = 4) -> tuple[str, ...]:
    """blake2b of each ``BLOCK_BYTES`` block of a contiguous buffer (a numpy array, a memoryview)."""
    view = memoryview(buffer).cast("B")

    def block(i: int) -> Callable[[], memoryview]:
        return lambda: view[i : i + BLOCK_BYTES]

    return hashes((block(i) for i in range(0, len(view), BLOCK_BYTES)), threads)


def dtype_code(dtype: np.dtype) -> str:
    """The manifest's spelling of ``dtype`` (little-endian); a dtype gpufeed does not write is a CacheError."""
    code = np.dtype(dtype).newbyteorder("<").str
    if code not in DTYPES:
        raise CacheError(f"dtype {np.dtype(dtype)} cannot be stored in a gpufeed cache; it stores {', '.join(DTYPES)}")
    return code


def _digest(fields: dict[str, Any]) -> str:
    body = {k: v for k, v in fields.items() if k != "digest"}
    return _hash(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


@dataclass(frozen=True)
class ArraySpec:
    file: str
    dtype: str  # one of DTYPES
    shape: tuple[int, ...]
    nbytes: int
    hashes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            order = {">": "big-endian", "=": "native byte order"}.get(self.dtype[:1], "")
            what = f"{order} dtype" if order else "dtype"
            raise ValueError(
                f"{self.file} has {what} {self.dtype!r}, which gpufeed never writes (it writes {', '.join(DTYPES)})"
            )
        if "/" in self.file or "\\" in self.file or "\0" in self.file or self.file in ("", ".", ".."):
            raise ValueError(f"array file {self.file!r} is not a plain file name inside the cache directory")
        if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in self.shape):
            raise ValueError(f"{self.file}: shape {self.shape} must be non-negative integers")
        expected = int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
        if expected != self.nbytes:
            raise ValueError(f"{self.file}: shape {self.shape} of {self.dtype} is {expected} bytes, not {self.nbytes}")
        if len(self.hashes) != -(-self.nbytes // BLOCK_BYTES):
            raise ValueError(f"{self.file}: {len(self.hashes)} block hashes for {self.nbytes} bytes")


@dataclass(frozen=True)
class Manifest:
    key: str
    arrays: dict[str, ArraySpec]
    meta: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        fields = asdict(self)
        return json.dumps({**fields, "digest": _digest(fields)}, indent=2, sort_keys=True)

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """Parse and validate ``directory/manifest.json``, or raise a CacheError that says what to do."""
        path = directory / MANIFEST
        remedy = f"delete it (gpufeed cache clear {directory}) and build it again"
        try:
            present = path.is_file()
        except OSError as e:  # e.g. a directory this process may not enter
            raise CacheError(f"cannot read {path} ({e.strerror or e}); check the permissions of {directory}") from None
        if not present:
            raise CacheError(
                f"{path} is missing: {directory} is an incomplete build or not a gpufeed cache; if it is a gpufeed "
                f"entry, {remedy}"
            )
        raw = _load(path)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CacheError(
                f"{path} is not a gpufeed cache manifest (format={_get(raw, 'format')!r}); gpufeed will not read, "
                f"replace or delete {directory}: point it at a gpufeed cache or at a path that does not exist yet"
            )
        if raw.get("version") != VERSION:
            raise CacheError(
                f"{path} has format version {raw.get('version')!r}, this gpufeed reads {VERSION}; {remedy}"
            )
        if raw.get("digest") != _digest(raw):
            raise CacheError(
                f"{path} does not match its own digest: the manifest was edited or damaged after it was written "
                f"(a changed shape, dtype or hash would serve wrong data); {remedy}"
            )
        try:
            arrays = {
                name: ArraySpec(a["file"], a["dtype"], tuple(a["shape"]), a["nbytes"], tuple(a["hashes"]))
                for name, a in raw["arrays"].items()
            }
            return cls(str(raw["key"]), arrays, dict(raw.get("meta", {})))
        except ValueError as e:
            raise CacheError(f"{path}: {e}; {remedy}") from None
        except (KeyError, TypeError, AttributeError) as e:
            raise CacheError(f"{path} is malformed ({e!r}); {remedy}") from None


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CacheError(
            f"{path} is not valid JSON ({e}); if {path.parent} is a gpufeed cache, delete it "
            f"(gpufeed cache clear {path.parent}) and build it again"
        ) from None


def _get(raw: Any, key: str) -> Any:
    return raw.get(key) if isinstance(raw, dict) else None


def is_gpufeed_entry(directory: Path) -> bool:
    """Whether ``directory`` holds a manifest that parses and names gpufeed's format (valid or damaged).

    Such a directory was made by gpufeed, so gpufeed may replace or delete it; no other is ever touched.
    """
    try:
        raw = json.loads((directory / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("format") == FORMAT
