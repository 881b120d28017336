"""Open a cache entry: validate the manifest and sizes, optionally every block hash, then memory-map its arrays.

Three kinds of entry (the manifest's ``meta["store"]``), each a set of arrays: ``"dense"`` images
``(N, C, H, W)``; ``"pixels"``, images of different sizes in one buffer with each one's start and (C, H, W);
``"jpeg"``, the files' own bytes with each one's start, length, decoded (C, H, W) and JPEG flag. Every kind
has ``labels``. What the arrays mean as images is the storage layer's (:mod:`gpufeed.store.entry` opens an
entry as its store); here they are only checked to fit together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import CacheError
from .format import BLOCK_BYTES, Manifest, block_hashes

__all__ = ["Entry", "open_entry", "read_array", "verify_entry"]

_ARRAYS = {
    "dense": ("images", "labels"),
    "pixels": ("pixels", "starts", "shapes", "labels"),
    "jpeg": ("bytes", "starts", "lengths", "shapes", "jpeg", "labels"),
}


@dataclass(frozen=True)
class Entry:
    """An opened entry: its manifest and its memory-mapped arrays of its kind (``labels`` among them), checked
    to fit together."""

    path: Path
    manifest: Manifest
    kind: str  # "dense" | "pixels" | "jpeg"
    arrays: dict[str, torch.Tensor]

    @property
    def labels(self) -> torch.Tensor:
        return self.arrays["labels"]

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


def open_entry(path: str | Path, verify: bool = True, record_use: bool = True) -> Entry:
    """Open the entry directory ``path``; with ``verify`` every byte is checked against its hash first.

    Sizes are always checked. Hashing costs one read of the files (about 1 GB/s per core, blocks
    hashed in parallel); ``verify=False`` skips it for trusted storage. The entry is marked in use for
    as long as its arrays live, and its last use recorded (NOTE [ Entries in use ]) unless ``record_use=False``
    (a check is not a use: ``gpufeed cache verify`` must not reorder what ``GPUFEED_CACHE_LIMIT`` removes first).
    """
    from .usage import hold

    path = Path(path)
    manifest = Manifest.read(path)
    kind = manifest.meta.get("store", "dense")
    if kind not in _ARRAYS:
        raise CacheError(
            f"{path}: store kind {kind!r} is not one gpufeed writes ({', '.join(_ARRAYS)}); {_remedy(path)}"
        )
    mapped = {name: _map(path, name, manifest, verify) for name in _ARRAYS[kind]}
    if verify:  # the arrays an entry holds besides (a folder's file names and hashes) are checked too
        for name in sorted(set(manifest.arrays) - set(mapped)):
            _map(path, name, manifest, verify)
    hold(path, list(mapped.values()), record_use)
    a = {name: torch.from_numpy(array) for name, array in mapped.items()}
    labels = a["labels"]
    if kind == "dense":
        if a["images"].dim() != 4 or labels.shape[:1] != a["images"].shape[:1]:
            raise CacheError(
                f"{path}: images {tuple(a['images'].shape)} and labels {tuple(labels.shape)} do not form a dataset; "
                f"{_remedy(path)}"
            )
    else:
        _check_index(path, kind, a)
    return Entry(path, manifest, kind, a)


def _check_index(path: Path, kind: str, a: dict[str, torch.Tensor]) -> None:
    """A ragged entry's index arrays (each image's start and size) checked against its buffer."""
    n, data = a["labels"].shape[0], a["pixels" if kind == "pixels" else "bytes"]
    starts, shapes = a["starts"], a["shapes"]
    ok = starts.shape == (n,) and shapes.shape == (n, 3) and (kind == "pixels" or a["lengths"].shape == (n,))
    if ok and n:
        sizes = shapes.prod(1) if kind == "pixels" else a["lengths"]
        ok = bool((starts >= 0).all() and (sizes >= 0).all() and int((starts + sizes).max()) <= data.numel())
    if not ok:
        raise CacheError(f"{path}: its index arrays do not fit its {data.numel():,}-element buffer; {_remedy(path)}")


def verify_entry(path: str | Path) -> Entry:
    """Open with every hash checked; raises :class:`~gpufeed.errors.CacheError` on the first fault. The entry's
    last use is left as it was."""
    return open_entry(path, verify=True, record_use=False)


def read_array(path: str | Path, name: str, verify: bool = True) -> np.ndarray | None:
    """The array ``name`` of the entry ``path`` (mapped, checked as :func:`open_entry` checks), or None if the
    entry has none (an entry built before gpufeed recorded it)."""
    path = Path(path)
    manifest = Manifest.read(path)
    return _map(path, name, manifest, verify) if name in manifest.arrays else None
