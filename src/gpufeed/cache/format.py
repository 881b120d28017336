"""The on-disk layout of a gpufeed cache; the only module that knows it.

A cache is a directory::

    <name>/
      images.bin      raw C-order array bytes (memory-mappable), no header
      labels.bin
      manifest.json   written last: format, version, key, and per array dtype, shape, size and
                      the blake2b hash of every 64 MiB block

A directory without a valid manifest is not a cache. Readers check sizes always and hashes when
asked (the default), so truncation, a zero-filled tail, bit flips and swapped files are caught
before a sample is served.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CacheError

__all__ = ["BLOCK_BYTES", "FORMAT", "MANIFEST", "VERSION", "ArraySpec", "Manifest", "block_hashes"]

FORMAT = "gpufeed-cache"
VERSION = 1
MANIFEST = "manifest.json"
BLOCK_BYTES = 64 << 20


def _hash(block: memoryview) -> str:
    return hashlib.blake2b(block, digest_size=16).hexdigest()


def block_hashes(buffer: np.ndarray | memoryview, threads: int = 4) -> tuple[str, ...]:
    """blake2b of each ``BLOCK_BYTES`` block; threads help because hashlib releases the GIL."""
    view = memoryview(buffer).cast("B")
    blocks: Iterable[memoryview] = (view[i : i + BLOCK_BYTES] for i in range(0, len(view), BLOCK_BYTES))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return tuple(pool.map(_hash, blocks))


@dataclass(frozen=True)
class ArraySpec:
    file: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    hashes: tuple[str, ...]

    def __post_init__(self) -> None:
        expected = int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
        if expected != self.nbytes or self.nbytes < 0:
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
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """Parse and validate ``directory/manifest.json``, or raise a CacheError that says what to do."""
        path = directory / MANIFEST
        remedy = f"delete {directory} (gpufeed cache clear) and build it again"
        if not path.is_file():
            raise CacheError(f"{path} is missing: {directory} is an incomplete build or not a gpufeed cache; {remedy}")
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CacheError(f"{path} is not valid JSON ({e}); {remedy}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise CacheError(f"{path} is not a gpufeed cache manifest (format={_get(raw, 'format')!r}); {remedy}")
        if raw.get("version") != VERSION:
            raise CacheError(
                f"{path} has format version {raw.get('version')!r}, this gpufeed reads {VERSION}; {remedy}"
            )
        try:
            arrays = {
                name: ArraySpec(a["file"], a["dtype"], tuple(a["shape"]), int(a["nbytes"]), tuple(a["hashes"]))
                for name, a in raw["arrays"].items()
            }
            return cls(str(raw["key"]), arrays, dict(raw.get("meta", {})))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CacheError(f"{path} is malformed ({e!r}); {remedy}") from None


def _get(raw: Any, key: str) -> Any:
    return raw.get(key) if isinstance(raw, dict) else None
