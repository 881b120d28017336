"""A dataset's entries in the cache: a read through the cache (:func:`cached_read`, what every route of
:mod:`gpufeed.pipeline.materialise` goes through), the open-or-build under the entry's lock
(:func:`load_or_ingest`, also ``build_cache``'s) and the write (:func:`store`).

An entry's key covers the source, the cached ops and the store kind (:func:`gpufeed.read.fingerprint.cache_key`);
:mod:`gpufeed.cache` below is pure storage. Files an entry left out (``on_error="skip"``) are warned about on
every use, and are an error under ``on_error="error"``, as a fresh read's would be.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ..cache import Manifest, check_target, entry_path, is_gpufeed_entry, write_cache
from ..cache.lock import build_lock
from ..cache.lock import lock_timeout as resolve_lock_timeout
from ..errors import CacheError, CacheNotWrittenWarning, CacheWriteError
from ..options import ReadOptions
from ..read.files import bad_files_error
from ..read.fingerprint import cache_key
from ..read.wrappers import selection
from ..store import as_store
from ..store.entry import Cache, open_cache

__all__ = [
    "Source",
    "cached_hit",
    "cached_read",
    "check_outside_dataset",
    "describe_read",
    "describe_source",
    "folder_root",
    "load_or_ingest",
    "mode_check",
    "store",
]


def _current(target: Path, key: str, announce: bool, stale: Stale | None = None) -> Cache | None:
    """The valid entry at ``target`` if it has ``key`` (and ``stale`` finds nothing to rebuild it for);
    ``announce``: warn about what will be rebuilt.

    The key is read from the manifest first, so an entry of other data is not hashed just to be
    replaced.
    """
    try:
        if Manifest.read(target).key != key:
            if announce:
                warnings.warn(
                    f"replacing the cache at {target}: it holds another dataset or another transform",
                    stacklevel=4,
                )
            return None
        cache = open_cache(target, verify=True)
    except CacheError as e:
        if announce and is_gpufeed_entry(target):
            warnings.warn(f"rebuilding the cache: {e}", stacklevel=4)
        return None
    why = stale(cache) if stale is not None else None
    if why is None:
        return cache
    if announce:
        warnings.warn(f"rebuilding the cache at {target}: {why}", stacklevel=4)
    return None


# What makes a valid entry of the right key unusable as it is: a sentence (it is rebuilt), None (it is used); it
# raises what a fresh read would raise on the data the entry records.
Stale = Callable[[Cache], str | None]


def mode_check(check_mode: Callable[[int, str | None], None] | None) -> Stale | None:
    """The check of an entry's recorded PIL modes (:attr:`gpufeed.read.samples.Ingested.modes`) by ``check_mode``,
    the probe's check of each sample a read meets (:class:`gpufeed.pipeline.probe.Probed`); None when there is
    nothing to check. An entry written by a pipeline that only moves pixels, or by ``build_cache``, was read
    without it: a hit then refuses (or leaves to the fallback) the first sample of another mode as the read would
    have. One that records no modes (written before gpufeed recorded them) is rebuilt, once."""
    if check_mode is None:
        return None

    def stale(cache: Cache) -> str | None:
        meta = cache.manifest.meta
        if meta.get("ingest") == "arrays":  # a dataset's one array: torchvision's dataset makes one mode of it
            return None
        recorded = meta.get("modes")
        if not (isinstance(recorded, list) and all(_mode_entry(m) for m in recorded)):
            return (
                "it records no PIL modes of its samples (written before gpufeed recorded them), and the pipeline "
                "computes on PIL images what depends on their mode: every sample is read again to check them"
            )
        for i, mode in recorded:
            check_mode(i, mode)
        return None

    return stale


def _mode_entry(m: Any) -> bool:
    return isinstance(m, list) and len(m) == 2 and isinstance(m[0], int) and isinstance(m[1], (str, type(None)))


def load_or_ingest(
    dataset: Any,
    split: Any,
    target: Path,
    key: str,
    persist: Callable[[Any], bool],
    num_workers: int | None = None,
    progress: bool = True,
    lock_timeout: float | None = None,
    strict: bool = True,
    read: Callable[[], Any] | None = None,
    resume: Callable[[Path, str], Any] | None = None,
    meta: dict[str, Any] | None = None,
    stale: Stale | None = None,
) -> tuple[Cache | None, Any]:
    """The entry at ``target`` if it is valid and has ``key``; else a fresh ingest, stored when ``persist(data)``.

    ``read``: what makes the data (an :class:`~gpufeed.read.samples.Ingested`, whose images may be a Ragged or
    Encoded store); by default the dataset read through the split's cached part. ``resume(target, key)``:
    the same, for a build that will be stored, keeping its progress beside ``target`` so that a killed
    build resumes (:mod:`gpufeed.cache.partial`); called under the build lock.

    Returns ``(cache, data)``: ``(entry, None)`` on a hit, ``(entry, data)`` when just written,
    ``(None, data)`` when not persisted. A valid entry is read without the lock (so a read-only
    cache works); building runs under the entry's build lock, so concurrent callers (one per rank)
    build once. A damaged entry is rebuilt with a warning; a path that is not gpufeed's is refused
    before anything is created beside it. ``strict=False`` (accelerate): a location that cannot be
    written gives ``(None, data)`` and one warning instead of a CacheWriteError.

    ``meta``: what the entry records besides (``"source"``, ``"pipeline"``). Once it is written, the entries
    beside it of the same source and pipeline under another key are removed, then the least recently used
    ones while the root is over ``$GPUFEED_CACHE_LIMIT`` (:mod:`gpufeed.cache.usage`; never one in use).
    ``stale``: what makes a valid entry of ``key`` unusable as it is (:func:`mode_check`): it is rebuilt.
    """
    from ..cache.usage import cache_limit, enforce_limit, remove_superseded
    from ..read.samples import ingest

    cache_limit()  # a bad limit is an error before anything is read

    lock_timeout = resolve_lock_timeout(lock_timeout)  # a bad value is an error even on a hit
    hit = _current(target, key, announce=False, stale=stale)  # entries appear by one rename: no lock to read
    if hit is not None:
        return hit, None

    if read is None:

        def read() -> Any:
            return ingest(dataset, split.cached_transform(), num_workers=num_workers, progress=progress)

    with ExitStack() as stack:
        try:
            check_target(target)  # before the lock file is created beside it
            check_outside_dataset(dataset, target)
            stack.enter_context(build_lock(target, lock_timeout, progress=progress))
        except CacheWriteError as e:
            if strict:
                raise
            data = read()
            if persist(data):
                _in_memory(e)
            return None, data
        hit = _current(target, key, announce=True, stale=stale)  # built by another process while we waited?
        if hit is not None:
            return hit, None
        try:
            data = resume(target, key) if resume is not None else read()
        except CacheWriteError as e:  # no room or no right to keep the build's progress: the data stays in memory
            if strict:
                raise
            _in_memory(e)
            return None, read()
        if not persist(data):
            return None, data
        try:
            # Verified when asked for a cache; accelerate skips the re-read: the bytes were hashed as they
            # were written, and reading them back would hold a second copy of the images in memory.
            cache = store(target, key, split, data, verify=strict, adopt=data.files, meta=meta)
        except CacheWriteError as e:
            _drop_progress(target, resume)  # no room or no right to write: give the room back
            if strict:
                raise
            _in_memory(e)
            return None, data
        _drop_progress(target, resume)
        # Under the new entry's build lock: no other build of it runs. The old ones go only when unused.
        remove_superseded(target, cache.manifest)
        enforce_limit(target.parent, keep=target)
        return cache, data


def _drop_progress(target: Path, resume: Any) -> None:
    """A resumable build's progress, once the entry is written (or cannot be); a store mapped onto it stays
    readable (the file goes when it is unmapped)."""
    from ..cache.partial import is_partial, partial_path

    if resume is not None and is_partial(partial_path(target)):
        shutil.rmtree(partial_path(target), ignore_errors=True)


def _in_memory(e: CacheWriteError) -> None:
    warnings.warn(
        CacheNotWrittenWarning(f"gpufeed: the data stays in memory, not cached on disk: {e}", e), stacklevel=4
    )


def check_outside_dataset(dataset: Any, target: Path) -> None:
    """A cache inside an image folder's directory would change the dataset (a new "class" appears).

    Checked for the datasets whose directory *is* their data (``ImageFolder`` and the other
    ``DatasetFolder``s) and those that keep it in ``root/base_folder`` (CIFAR, SVHN, STL10, ...).
    """
    from torchvision.datasets import DatasetFolder

    root, base = getattr(dataset, "root", None), getattr(dataset, "base_folder", None)
    if not isinstance(root, (str, os.PathLike)) or not (isinstance(dataset, DatasetFolder) or isinstance(base, str)):
        return
    data_dir = (Path(root) / base if isinstance(base, str) else Path(root)).resolve()
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError) as e:  # a loop of symbolic links on the way (Python < 3.13 raises RuntimeError)
        raise CacheWriteError(
            f"the cache {target} cannot be resolved ({e}): a symbolic link on its way points back at itself; choose "
            "another cache location (accelerate(..., cache=ROOT), --cache-dir or GPUFEED_CACHE_DIR)"
        ) from None
    if resolved.is_relative_to(data_dir):
        raise CacheWriteError(
            f"the cache {target} would be inside {data_dir}, the directory of the dataset "
            f"({type(dataset).__name__}); gpufeed never writes into a dataset's directory: choose a cache location "
            "outside it (build_cache(dataset, path), accelerate(..., cache=ROOT), --cache-dir or GPUFEED_CACHE_DIR)"
        )


def store(
    target: Path,
    key: str,
    split: Any,
    data: Any,
    verify: bool = True,
    adopt: dict[str, Path] | None = None,
    meta: dict[str, Any] | None = None,
) -> Cache:
    """Write ingested data (:class:`gpufeed.read.samples.Ingested`) as the entry ``target`` and open it (``adopt``:
    see :func:`gpufeed.cache.write_cache`; ``meta``: recorded besides). A folder's read
    (:class:`gpufeed.pipeline.folder_store.FolderRead`) adds the files it left out and its files' names and hashes."""
    record: dict[str, Any] = {
        "cached": [repr(op) for op in split.cached],
        "ingest": data.path,
        "ingest_seconds": round(data.seconds, 3),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **(meta or {}),
    }
    modes = getattr(data, "modes", None)  # a per-sample read's: what a hit is checked by (mode_check)
    if modes is not None:
        record["modes"] = [[i, mode] for i, mode in modes]
    skipped = getattr(data, "skipped", ())
    if skipped:
        record["skipped"] = [{"path": p, "why": why} for p, why in skipped]
    arrays, described = as_store(data.images).arrays()  # what the images are kept as, and how to read them back
    record.update(described)
    write_cache(target, key, {**arrays, **getattr(data, "extra", {}), "labels": data.labels}, record, adopt)
    return open_cache(target, verify=verify)


@dataclass
class Source:
    """The stored images and labels, with what the plan says about how they were got."""

    images: Any  # (N, C, H, W) tensor, or a Ragged / Encoded store
    labels: torch.Tensor
    description: str
    cache_path: Path | None = None
    mapped: bool = False  # memory-mapped from a cache file
    notes: list[str] = field(default_factory=list)
    skipped: tuple[tuple[str, str], ...] = ()  # files left out with on_error="skip": (path, why)
    key: str | None = None  # the cache key it was looked up under (None: not fingerprinted, or cache=False)
    tier: str = ""  # where the loader keeps it: "device", "pinned" or "mmap" (set by the materialise stage)
    why: str = ""  # the plan's sentence for the tier
    nbytes: int = 0  # images and labels


def cached_read(
    dataset: Any,
    split: Any,
    options: ReadOptions,
    kind: dict[str, Any] | None,
    read: Callable[[], Any],
    expensive: Callable[[Any], bool],
    notes: Sequence[str] = (),
    resume: Callable[[Path, str], Any] | None = None,
    fits: Callable[[Any], bool] | None = None,
    check_mode: Callable[[int, str | None], None] | None = None,
) -> Source:
    """``read()``'s data, or the cache entry of the same key; written to the cache when asked (``cache=True`` or
    a root) or, for ``"auto"``, when ``expensive(data)``, and only when ``fits(data)`` (data of the kind this key
    is for). ``resume``: a ``read`` that resumes a stopped build (see :func:`load_or_ingest`). Files an entry left
    out (``on_error="skip"``) are an error on a hit with ``on_error="error"``, as they would be on a fresh read; so
    is a sample of a PIL mode ``check_mode`` refuses (see :func:`mode_check`)."""
    cache, on_error = options.cache, options.on_error
    key = cache_key(dataset, split.cached, kind) if cache is not False else None
    notes = list(notes)
    if cache is not False and key is None:
        warnings.warn(
            f"gpufeed.accelerate: {type(dataset).__name__} or its cached ops cannot be fingerprinted, so nothing is "
            "written to disk (an opaque source could later be matched to other data)",
            stacklevel=5,
        )
        notes.append("not persisted: the source or the cached ops cannot be fingerprinted")
    if key is None:
        data = read()
        return _skipping(
            Source(data.images, data.labels, describe_read(data), None, False, notes), data, None, on_error
        )
    root = cache if isinstance(cache, Path) else None
    path = entry_path(type(dataset).__name__, key, root)
    always = cache is True or root is not None
    meta = {
        "source": describe_source(dataset),
        "pipeline": {"cached": [repr(op) for op in split.cached], **(kind or {})},
    }
    hit, data = load_or_ingest(
        dataset,
        split,
        path,
        key,
        lambda d: (fits is None or fits(d)) and (always or expensive(d)),
        None,
        options.progress,
        options.lock_timeout,
        strict=False,  # a cache that cannot be written is not a reason to fail: the data stays in memory
        read=read,
        resume=resume,
        meta=meta,
        stale=mode_check(check_mode),
    )
    if data is None:
        assert hit is not None  # load_or_ingest returns one or the other
        src = Source(hit.images, hit.labels, f"cache hit, verified ({len(hit.labels)} samples)", path, True, notes)
    elif hit is not None:
        src = Source(hit.images, hit.labels, describe_read(data) + ", written to the cache", path, True, notes)
    else:
        src = Source(data.images, data.labels, describe_read(data), None, False, notes)
    src.key = key
    return _skipping(src, data, hit, on_error)


def cached_hit(
    dataset: Any,
    split: Any,
    options: ReadOptions,
    kind: dict[str, Any] | None,
    notes: Sequence[str] = (),
    check_mode: Callable[[int, str | None], None] | None = None,
) -> Source | None:
    """The valid entry of ``kind``'s key if there is one (read without the lock, as :func:`load_or_ingest` reads
    one; ``check_mode``: as :func:`cached_read`'s), else None: nothing is read from the dataset or written."""
    key = cache_key(dataset, split.cached, kind) if options.cache is not False else None
    if key is None:
        return None
    path = entry_path(type(dataset).__name__, key, options.cache if isinstance(options.cache, Path) else None)
    hit = _current(path, key, announce=False, stale=mode_check(check_mode))
    if hit is None:
        return None
    src = Source(hit.images, hit.labels, f"cache hit, verified ({len(hit.labels)} samples)", path, True, list(notes))
    src.key = key
    return _skipping(src, None, hit, options.on_error)


def describe_source(dataset: Any) -> dict[str, Any]:
    """What an entry records as its data (``gpufeed cache info`` shows it; a newer entry of the same source and
    pipeline replaces it): the dataset's class, its folder and its split, and for a part of it (a ``Subset``,
    a ``random_split`` part, a ``ConcatDataset``) which part: two parts of one folder are two sources."""
    out: dict[str, Any] = {"class": f"{type(dataset).__module__}.{type(dataset).__qualname__}"}
    if folder_root(dataset):
        out["root"] = folder_root(dataset)
    for attr in ("train", "split"):
        if isinstance(getattr(dataset, attr, None), (bool, str)):
            out[attr] = getattr(dataset, attr)
    part = selection(dataset)  # a Subset / random_split part or a ConcatDataset: which samples of the root
    if part is not None:
        out["selection"] = part
    return out


def _skipping(src: Source, data: Any, hit: Any, on_error: str) -> Source:
    """The files left out (a fresh read's, or the entry's record on a hit): one warning that lists them and a
    line in the plan; on a hit with ``on_error="error"`` they are the error a fresh read would raise."""
    if data is not None:
        skipped = tuple(getattr(data, "skipped", ()))
    else:
        skipped = tuple((d["path"], d["why"]) for d in hit.manifest.meta.get("skipped", []))
    if not skipped:
        return src
    total = len(src.labels) + len(skipped)
    if on_error == "error":
        raise bad_files_error(
            dict(enumerate(why for _, why in skipped)), total, f"the folder of the cache entry {src.cache_path}"
        )
    src.skipped = skipped
    lines = "\n".join(f"  {why}" for _, why in skipped)
    warnings.warn(
        f"gpufeed.accelerate: on_error='skip' left out {len(skipped):,} of {total:,} files that cannot be used:\n"
        f"{lines}\n(the files stay as they are; remove or fix them to train on them)",
        stacklevel=6,
    )
    src.notes.append(
        f"on_error='skip': {len(skipped):,} of {total:,} files left out (they cannot be read or decoded; the "
        "warning lists them); every other image keeps its label"
    )
    return src


def folder_root(dataset: Any) -> str:
    """What a build's progress records as its data: the folder the files are in."""
    root = getattr(dataset, "root", None)
    return str(Path(root).resolve()) if root is not None else ""


def describe_read(data: Any) -> str:
    return f"{data.path} read of {len(data.labels)} samples in {data.seconds:.2f} s"
