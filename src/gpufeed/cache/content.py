"""A folder's entry compared with the folder's files as they are now (``gpufeed cache verify --data DIR``).

The key covers each file's path, size, mtime, ctime and inode, which catches a file replaced or
rewritten by any ordinary means. What it cannot catch (a file system that fakes them, a change made
below the file system) a content check does: a folder's entry records, per file it holds, the file's
name relative to the folder and the blake2b hash of its bytes as they were read at build time
(``names`` and ``digests``); this module re-reads the files and names those that differ.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CacheError
from ..inside import inside
from .format import Manifest
from .reader import read_array, remedy

__all__ = ["Comparison", "compare_folder", "entry_folder", "file_digest"]

_READ = 1 << 20


def file_digest(path: Path) -> bytes:
    """The 16-byte blake2b of a file's bytes, as a folder's entry records them."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            h.update(chunk)
    return h.digest()


@dataclass
class Comparison:
    """What differs between an entry and its folder: ``changed`` files (``"path: why"``), and how many matched."""

    entry: Path
    folder: Path
    files: int = 0
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.changed


def entry_folder(entry: Path) -> Path | None:
    """The folder whose files the entry holds, or None for an entry of another kind of dataset."""
    source = Manifest.read(entry).meta.get("source")
    root = source.get("root") if isinstance(source, dict) else None
    return Path(root) if root else None


def compare_folder(entry: Path, threads: int = 4) -> Comparison:
    """Re-read every file the folder entry ``entry`` holds and compare its bytes with the hash recorded at
    build time; files of the folder's classes that the entry does not hold (added since) count as changed,
    unless the entry holds only a part of the folder (a ``Subset`` or ``random_split`` part).
    Raises CacheError for an entry that records no files (not a folder's, or built before gpufeed recorded them).
    """
    manifest = Manifest.read(entry)
    folder = entry_folder(entry)
    names, digests = read_array(entry, "names"), read_array(entry, "digests")
    if folder is None or names is None or digests is None:
        raise CacheError(
            f"{entry} records no files of a folder to compare (it is not a folder's entry, or it was built before "
            f"gpufeed recorded them); delete it (gpufeed cache clear {entry}) and build it again to check it"
        )
    files = bytes(names).decode().split("\0") if len(names) else []
    if len(files) != len(digests):
        raise CacheError(f"{entry}: {len(files)} file names but {len(digests)} hashes; delete it and build it again")
    out = Comparison(entry, folder, len(files))

    for name in files:  # recorded relative to the folder: each must stay in it (the folder's own links may not)
        inside(folder, name, listed_in=f"{entry}/names.bin", error=CacheError, links=False, fix=remedy(entry))

    def check(i: int) -> str | None:
        path = folder / files[i]
        try:
            got = file_digest(path)
        except FileNotFoundError:
            return f"{path}: missing (removed or renamed since the entry was built)"
        except OSError as e:
            return f"{path}: cannot be read ({e.strerror or e})"
        if got != bytes(digests[i]):
            return f"{path}: its bytes differ from those the entry was built from (replaced or changed since)"
        return None

    with ThreadPoolExecutor(threads) as pool:
        out.changed = [why for why in pool.map(check, range(len(files))) if why is not None]
    source = manifest.meta.get("source")
    if isinstance(source, dict) and source.get("selection"):
        # A part of the folder (a Subset or random_split part): the folder's other files were never in it, so a
        # file added since cannot be told from them (the part's own files are compared above).
        return out
    skipped = [str(d.get("path")) for d in manifest.meta.get("skipped", []) if isinstance(d, dict)]
    held = {str(Path(p).resolve()) for p in [*(str(folder / f) for f in files), *skipped]}
    added = [p for p in _folder_files(folder) if str(Path(p).resolve()) not in held]
    out.changed += [f"{p}: added since the entry was built" for p in added]
    return out


def _folder_files(folder: Path) -> list[str]:
    """The image files an ``ImageFolder`` of ``folder`` would read (in its class directories)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

    if not folder.is_dir():
        return []
    return sorted(
        str(p)
        for d in folder.iterdir()
        if d.is_dir()
        for p in d.rglob("*")
        if p.is_file() and has_file_allowed_extension(p.name, IMG_EXTENSIONS)
    )
