"""The folder route: an image folder read by torchvision's PIL loader, kept as decoded pixels or as its files' bytes.

The files' headers are read first (nothing allocated for pixels yet): they give each image's size, so the
store's kind follows from the budget (``store="auto"``: the pixels when they fit, else the bytes) and a cache
hit reads nothing else. A fresh pixel store is decoded chunk by chunk into a progress file beside its entry, so
that a killed build resumes (:mod:`gpufeed.cache.partial`).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..cache.format import hashes
from ..cache.partial import progress_file
from ..device import fmt_bytes, usable_cores
from ..errors import CacheWriteError, ConfigError, DataError
from ..read.files import bad_files_error, file_samples, image_files, undecodable
from ..read.fingerprint import cache_key
from ..read.samples import Ingested
from ..store.encoded import Encoded, decode, downscaled
from ..store.ragged import Ragged
from .entries import Source, cached_read, check_outside_dataset
from .plan import StorePlan
from .request import Request

__all__ = ["FolderRead", "folder_store", "with_file_record"]

# NOTE [ Finding bad files when the store is built ]
# A folder's bad files (truncated, garbled, not images, headers that claim more than the file holds) are all
# found while its store is built, never mid-epoch: the headers when they are read (before anything is
# allocated for pixels), each file's bytes as they are read, and each decode: the pixel store decodes every
# file anyway (a chunk that fails is decoded again image by image, to find each bad one); the jpeg store
# decodes every file once, on threads, keeping nothing (measured on the 2-core dev machine: 400 synthetic
# 375x500 JPEGs, 32 MB, in 0.6-0.7 s, about the cost of one epoch's decode; a cache hit does not repeat it,
# the entry records what was left out). Then on_error="error" names them all in one DataError, and
# on_error="skip" leaves them out (one warning, a line in the plan); the entry records the files it left
# out, so a hit under on_error="error" raises as a fresh read would, and a fixed file changes the key.


@dataclass(frozen=True)
class FolderRead(Ingested):
    """A folder's store as read, with what its entry records besides: the files left out (``"path: why"``, with
    ``on_error="skip"``) and per kept file its path relative to the folder and the hash of its bytes (what
    ``gpufeed cache verify --data DIR`` compares the folder with)."""

    skipped: tuple[tuple[str, str], ...] = ()  # (path, why)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def folder_store(req: Request, split: Any, decided: StorePlan) -> Source:
    """The folder's images, each kept as it is: decoded pixels (a Ragged store) or the files' bytes (an Encoded
    store); RandomResizedCrop makes them one size. ``on_error``: ``"error"`` names every file that cannot be used
    in one DataError; ``"skip"`` leaves them out, with one warning that lists them."""
    dataset, options = req.dataset, req.read
    store, max_side, on_error = options.store, options.max_side, options.on_error
    num_workers, progress, budget = options.num_workers, options.progress, decided.budget.device
    notes = list(decided.notes)
    files = image_files(dataset)
    assert files is not None  # the plan chose this route for a source of encoded images
    threads = max(1, usable_cores() if num_workers is None else num_workers)
    shapes, unreadable = files.headers(threads, progress)  # bad files: (3, 0, 0), no pixels
    target = downscaled(shapes, max_side)
    pixels = int(target.prod(1).sum()) + len(target) * 48  # and per image: its start, shape and label
    if max_side is not None and store == "auto" and pixels > budget:  # the bytes would undo max_side: say so
        raise ConfigError(
            f"with max_side={max_side} the pixels still take {fmt_bytes(pixels)}, over the budget of "
            f"{fmt_bytes(budget)}: lower max_side, raise memory_budget, or drop max_side to keep the files' bytes "
            "(store='jpeg')"
        )
    keep_bytes = store == "jpeg" or (store == "auto" and pixels > budget)
    if keep_bytes:
        over = f"decoded they would take {fmt_bytes(pixels)}, over the budget of {fmt_bytes(budget)}"
        why = "store='jpeg'" if store == "jpeg" else over
        notes.append(f"the files' bytes are kept and each batch is decoded as it is served ({why})")

    def read_folder(progress_at: tuple[Path, str] | None = None) -> Ingested:
        """The files (and their pixels, decoded); ``progress_at``: the entry and key whose build keeps its
        progress on disk as it goes, so that a killed build resumes. Every file that cannot be used is found
        (its header, its read, its decode) before one error names them all, or they are left out."""
        t0 = time.perf_counter()
        encoded, labels, bad = files.read(threads, progress)
        n, what = len(encoded), files.what
        good = [i for i in range(len(encoded)) if i not in bad]
        if not good:  # skipping every file would leave nothing to train on
            raise bad_files_error(bad, n, what)
        if bad and on_error == "error":  # the others are decoded too, to name every bad file, but not kept
            readable = encoded.select(torch.tensor(good, dtype=torch.int64))
            bad |= {good[j]: why for j, why in undecodable(readable, threads, progress).items()}
            raise bad_files_error(bad, n, what)
        encoded, labels = _keep(encoded, labels, good, len(bad))
        if keep_bytes:
            # A file that fails its decode is found now, not after batches of training: every file is decoded
            # once, nothing kept (NOTE [ Finding bad files when the store is built ]).
            late = _decodable_check(dataset, split, options.cache, encoded, threads, progress)
            bad |= {good[j]: why for j, why in late.items()}
            if late and on_error == "error":
                raise bad_files_error(bad, n, what)
            good = [g for j, g in enumerate(good) if j not in late]
            encoded, labels = _keep(encoded, labels, [j for j in range(len(encoded)) if j not in late], len(late))
            return _folder_read(encoded, labels, files.describe(encoded), t0, None, bad, dataset, records=files.records)
        images, resumed, late = _decode_chunks(encoded, threads, max_side, progress, progress_at, files.root)
        if late:
            bad |= {good[j]: why for j, why in late.items()}
            if on_error == "error":
                _drop_partial(progress_at)  # a build that fails on bad files leaves no large leftover
                raise bad_files_error(bad, n, what)
            keep = torch.tensor([j for j in range(len(encoded)) if j not in late], dtype=torch.int64)
            # their bytes stay in the buffer, unreferenced: the decoded file is moved into the entry as it is
            images = Ragged(images.data, images.starts[keep], images.shapes[keep], images.hwc)
            labels, encoded = labels[keep], encoded.select(keep)
        then = f"; decoded on {threads} thread(s)"
        if resumed:
            then += f", resuming a stopped build at image {resumed:,} of {len(encoded):,}"
        # the pixels of a resumable build are already in its progress file: moved into the entry, not copied
        kept = {"pixels": progress_file(progress_at[0])} if progress_at is not None else None
        described = files.describe(encoded, then)
        return _folder_read(images, labels, described, t0, kept, bad, dataset, encoded, files.records)

    kind: dict[str, Any] = {"kind": "jpeg" if keep_bytes else "pixels", "max_side": max_side}
    # "auto" persists the pixels (a cache saves the decode); the bytes are what the files are
    if max_side is not None and not keep_bytes:
        changed = int((target != shapes).any(1).sum())
        notes.append(
            f"max_side={max_side}: {changed:,} of {len(shapes):,} images, those with a longer side over {max_side}, "
            f"downscaled once to the size torchvision's Resize(size=None, max_size={max_side}) gives (antialiased; "
            "smaller images are left as they are) -- the model sees these, not the files"
        )
    resume = None if keep_bytes else lambda target, key: read_folder((target, key))
    src = cached_read(dataset, split, options, kind, read_folder, lambda d: not keep_bytes, notes, resume)
    if keep_bytes and src.images.paths is None:  # the files' store, from the cache: errors still name the files
        left_out = {p for p, _ in src.skipped}
        src.images = replace(src.images, paths=[p for p in files.names if p not in left_out])
    return src


def _decodable_check(
    dataset: Any, split: Any, cache: bool | str | Path, encoded: Encoded, threads: int, progress: bool
) -> dict[int, str]:
    """:func:`undecodable` for a JPEG store, done once per state of the folder's files: its finding is kept in
    a small record under the cache root, keyed as an entry is (each file's path, size, mtime, ctime and inode),
    so a start that finds the files unchanged skips the full decode. ``cache=False`` keeps nothing on disk."""
    import json

    from ..cache.location import default_cache_dir

    key = cache_key(dataset, split.cached, {"kind": "jpeg-decodable", "files": len(encoded)}) if cache else None
    record = None
    if key is not None:
        record = (cache if isinstance(cache, Path) else default_cache_dir()) / ".decodable" / f"{key}.json"
        try:
            check_outside_dataset(dataset, record)  # never a file in the dataset's own directory
        except CacheWriteError:
            record = None
    if record is not None:
        try:
            found = json.loads(record.read_text())
            if found.get("files") == len(encoded):
                return {int(j): str(why) for j, why in found["undecodable"].items()}
        except (OSError, ValueError, KeyError, AttributeError):
            pass  # no record (or an unreadable one): decode
    late = undecodable(encoded, threads, progress)
    if record is not None:
        try:  # a temporary name, then one rename: a reader never sees half a record
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_name(f".{record.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"files": len(encoded), "undecodable": {str(j): w for j, w in late.items()}}))
            os.replace(tmp, record)
        except OSError:
            pass  # a read-only cache root: the check is simply done again next time
    return late


_CHUNK_BYTES = 64 << 20  # decoded pixels per recorded step of a resumable build: a kill loses about this
_PER_THREAD = 16  # and at least this many images per decoding thread in a step, so that none waits long


def _decode_chunks(
    encoded: Encoded,
    threads: int,
    max_side: int | None,
    progress: bool,
    progress_at: tuple[Path, str] | None,
    source: str = "",
) -> tuple[Ragged, int, dict[int, str]]:
    """Decode chunk by chunk (a progress bar), in memory or, with ``progress_at``, into the build's progress
    file beside the entry, recording each chunk; returns the pixel store, how many images an earlier,
    stopped build had decoded, and the images that did not decode (position -> why; their place holds no
    pixels). A chunk with a bad image is decoded again image by image, so that every bad one is found."""
    from tqdm.auto import tqdm

    from ..cache.partial import Partial

    shapes = downscaled(encoded.shapes, max_side)
    sizes = shapes.prod(1)
    ends = torch.cumsum(sizes, 0)
    starts, n, nbytes = ends - sizes, len(encoded), int(ends[-1])
    partial = Partial.open(*progress_at, nbytes, n, source) if progress_at is not None else None
    data = partial.data if partial is not None else torch.empty(nbytes, dtype=torch.uint8)
    done = partial.done if partial is not None else 0
    bad: dict[int, str] = dict(partial.bad) if partial is not None else {}
    with tqdm(total=n, initial=done, desc="gpufeed: decoding", unit="image", disable=not progress) as bar:
        while done < n:
            # the images that end within the next _CHUNK_BYTES, and at least 16 per thread (threads kept busy)
            last = int(torch.searchsorted(ends, int(starts[done]) + _CHUNK_BYTES, right=True))
            last = min(n, max(last, done + _PER_THREAD * threads))
            part = encoded.select(torch.arange(done, last))
            try:
                decode(part, torch.device("cpu"), threads, max_side, out=data[int(starts[done]) : int(ends[last - 1])])
            except DataError:
                for j in range(done, last):
                    try:
                        one = encoded.select(torch.tensor([j]))
                        decode(one, torch.device("cpu"), 1, max_side, out=data[int(starts[j]) : int(ends[j])])
                    except DataError as e:
                        bad[j] = str(e)
            if partial is not None:
                partial.commit(last, bad)
            bar.update(last - done)
            done = last
    return Ragged(data, starts, shapes), partial.resumed if partial is not None else 0, bad


def _drop_partial(progress_at: tuple[Path, str] | None) -> None:
    """Remove a failed build's progress (its decoded pixels: as large as the store)."""
    from ..cache.partial import is_partial, partial_path

    if progress_at is not None and is_partial(partial_path(progress_at[0])):
        shutil.rmtree(partial_path(progress_at[0]), ignore_errors=True)


def _keep(encoded: Encoded, labels: torch.Tensor, keep: list[int], dropped: int) -> tuple[Encoded, torch.Tensor]:
    """The images at positions ``keep`` and their labels, the others' bytes freed; as they are if none is dropped."""
    if not dropped:
        return encoded, labels
    idx = torch.tensor(keep, dtype=torch.int64)
    return encoded.select(idx).compact(), labels[idx]


def _file_bytes(store: Encoded, i: int) -> Any:
    return store.file(i).numpy()


def _folder_read(
    images: Ragged | Encoded,
    labels: torch.Tensor,
    description: str,
    t0: float,
    kept: dict[str, Path] | None,
    bad: dict[int, str],
    dataset: Any,
    files: Encoded | None = None,
    records: bool = True,
) -> FolderRead:
    """The read, with the skipped files and, per kept file, its name and the hash of its bytes (``files``: the
    files' store, when ``images`` holds their pixels; ``records``: whether the source keeps such a record)."""
    store = files if files is not None else images
    assert isinstance(store, Encoded) and store.paths is not None
    all_paths = store.paths
    extra = {}
    if records:
        paths = [all_paths[int(store.index[i]) if store.index is not None else i] for i in range(len(store))]
        extra = _file_record(dataset, paths, (functools.partial(_file_bytes, store, i) for i in range(len(store))))
    skipped = tuple((str(all_paths[i]), why) for i, why in sorted(bad.items()))
    return FolderRead(images, labels, description, time.perf_counter() - t0, kept, skipped=skipped, extra=extra)


def _file_record(dataset: Any, paths: list[str], blocks: Any) -> dict[str, torch.Tensor]:
    """Per file, its path relative to the folder and the hash of its bytes (``blocks``: a function per file that
    gives them): what ``gpufeed cache verify --data DIR`` compares the folder with."""
    root = getattr(dataset, "root", None)  # the samples' paths start with it; the entry records it resolved
    names = [os.path.relpath(p, root) if root is not None else p for p in paths]
    digests = hashes(blocks)
    return {
        "digests": torch.tensor([list(bytes.fromhex(d)) for d in digests], dtype=torch.uint8).view(-1, 16),
        "names": torch.frombuffer(bytearray("\0".join(names).encode()), dtype=torch.uint8),
    }


def _read_file(path: str) -> Any:
    import numpy as np

    return np.fromfile(path, dtype=np.uint8)


def with_file_record(dataset: Any, read: Any) -> Any:
    """``read`` of a folder read sample by sample (a pipeline that resizes first), its entry recording the files'
    names and hashes as a folder store's does; other datasets' ``read`` as it is."""
    files = file_samples(dataset)
    if files is None:
        return read

    def read_and_record() -> Ingested:
        data = read()
        if isinstance(data, FolderRead) or len(files) != len(data.labels):
            return data
        paths = [p for p, _ in files]
        extra = _file_record(dataset, paths, (functools.partial(_read_file, p) for p in paths))
        return FolderRead(data.images, data.labels, data.path, data.seconds, data.files, data.modes, extra=extra)

    return read_and_record
