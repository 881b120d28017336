"""Open a cache entry: validate the manifest and sizes, optionally every block hash, then memory-map its arrays.

An entry is a set of named arrays with ``labels`` among them, and a kind (the manifest's ``meta["store"]``)
that says what the others mean. That meaning is the storage layer's: :mod:`gpufeed.store.entry` opens an entry
as the store of its kind, which checks that its arrays fit together. Here every array the manifest lists is
checked against its size (and, with ``verify``, its hashes) and memory-mapped, whatever the kind: a new kind of
store needs nothing from this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import CacheError
from ..inside import inside
from .format import BLOCK_BYTES, Manifest, block_hashes

__all__ = ["Entry", "open_entry", "read_array", "remedy", "verify_entry"]


@dataclass(frozen=True)
class Entry:
    """An opened entry: its manifest, its kind and its memory-mapped arrays (``labels`` among them)."""

    path: Path
    manifest: Manifest
    kind: str  # what the arrays hold (gpufeed.store's kinds: "dense", "pixels", "jpeg")
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


def remedy(path: Path) -> str:
    """What to do about a damaged entry: the end of every CacheError that names one."""
    return f"delete it (gpufeed cache clear {path}) and build it again"


def _map(path: Path, name: str, manifest: Manifest, verify: bool) -> np.ndarray:
    spec = manifest.arrays.get(name)
    if spec is None:
        raise CacheError(f"{path / 'manifest.json'} lists no '{name}' array; {remedy(path)}")
    # the manifest names the file: it must be the entry's own, not a symlink out of it (NOTE in gpufeed.inside)
    file = inside(path, spec.file, listed_in=path / "manifest.json", error=CacheError, fix=remedy(path))
    if not file.is_file():
        raise CacheError(f"{file} is missing; {remedy(path)}")
    size = file.stat().st_size
    if size != spec.nbytes:
        raise CacheError(f"{file} is {size} bytes but the manifest says {spec.nbytes} (truncated?); {remedy(path)}")
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
                    f"(corrupted, zero-filled or swapped with another cache's file); {remedy(path)}"
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
    names = sorted(set(manifest.arrays) | {"labels"})  # every entry has labels: a manifest without is refused
    mapped = {name: _map(path, name, manifest, verify) for name in names}
    hold(path, list(mapped.values()), record_use)
    kind = str(manifest.meta.get("store", "dense"))
    return Entry(path, manifest, kind, {name: torch.from_numpy(array) for name, array in mapped.items()})


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
