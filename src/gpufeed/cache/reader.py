"""Open a cache: validate the manifest and sizes, optionally every block hash, then memory-map."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import CacheError
from .format import BLOCK_BYTES, Manifest, block_hashes

__all__ = ["Cache", "open_cache", "verify_cache"]

_REQUIRED = ("images", "labels")


@dataclass(frozen=True)
class Cache:
    """An opened cache: memory-mapped ``images`` ``(N, C, H, W)`` and ``labels``, and its manifest."""

    path: Path
    manifest: Manifest
    images: torch.Tensor
    labels: torch.Tensor

    @property
    def key(self) -> str:
        return self.manifest.key

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.manifest.arrays.values())


def _remedy(path: Path) -> str:
    return f"delete it (gpufeed cache clear {path}) and build it again"


def _map(path: Path, name: str, manifest: Manifest, verify: bool) -> np.ndarray:
    spec = manifest.arrays.get(name)
    if spec is None:
        raise CacheError(f"{path / 'manifest.json'} lists no '{name}' array; {_remedy(path)}")
    file = path / spec.file
    if not file.is_file():
        raise CacheError(f"{file} is missing; {_remedy(path)}")
    size = file.stat().st_size
    if size != spec.nbytes:
        raise CacheError(f"{file} is {size} bytes but the manifest says {spec.nbytes} (truncated?); {_remedy(path)}")
    try:
        # Copy-on-write: writable for torch (no warning), and nothing is ever written back to the file.
        array = (
            np.memmap(file, dtype=np.dtype(spec.dtype), mode="c", shape=spec.shape)
            if spec.nbytes
            else (np.zeros(spec.shape, dtype=np.dtype(spec.dtype)))
        )
        hashes = block_hashes(array) if verify else ()
    except OSError as e:
        raise CacheError(f"{file} cannot be read ({e.strerror or e}); check its permissions") from None
    if verify:
        for i, (got, want) in enumerate(zip(hashes, spec.hashes, strict=True)):
            if got != want:
                start = i * BLOCK_BYTES
                raise CacheError(
                    f"{file}: bytes {start}-{min(start + BLOCK_BYTES, spec.nbytes)} do not match the manifest's hash "
                    f"(corrupted, zero-filled or swapped with another cache's file); {_remedy(path)}"
                )
    return array


def open_cache(path: str | Path, verify: bool = True) -> Cache:
    """Open the cache directory ``path``; with ``verify`` every byte is checked against its hash first.

    Sizes are always checked. Hashing costs one read of the files (about 1 GB/s per core, blocks
    hashed in parallel); ``verify=False`` skips it for trusted storage.
    """
    path = Path(path)
    manifest = Manifest.read(path)
    images, labels = (_map(path, name, manifest, verify) for name in _REQUIRED)
    if images.ndim != 4 or labels.shape[:1] != images.shape[:1]:
        raise CacheError(
            f"{path}: images {images.shape} and labels {labels.shape} do not form a dataset; {_remedy(path)}"
        )
    return Cache(path, manifest, torch.from_numpy(images), torch.from_numpy(labels))


def verify_cache(path: str | Path) -> Cache:
    """Open with every hash checked; raises :class:`~gpufeed.errors.CacheError` on the first fault."""
    return open_cache(path, verify=True)
