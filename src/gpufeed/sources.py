"""Where accelerate's stored images come from: a cache hit, or the dataset read and (when it pays) cached.

Two shapes of data. One size after the cached part: one ``(N, C, H, W)`` tensor (:func:`load`).
Different sizes with a recipe that starts with RandomResizedCrop (:func:`load_ragged`): each image
kept as it is, as decoded pixels (a :class:`~gpufeed.augment.ragged.Ragged` store) or as the files'
own bytes (an :class:`~gpufeed.encoded.Encoded` store, decoded per batch). For a folder read by
torchvision's loader the choice is made from the files' headers before anything is read in full,
so a cache hit reads nothing else.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .augment.ragged import Ragged
from .augment.transforms import takes_ragged
from .cache import entry_path
from .cache.fingerprint import cache_key
from .cache.partial import progress_file
from .caching import load_or_ingest
from .device import usable_cores
from .encoded import Encoded, decode, downscaled, file_samples, header_shapes, read_files
from .errors import ConfigError
from .ingest import Ingested, exposes_arrays, ingest

__all__ = ["STORES", "Source", "describe_store", "fmt_bytes", "load", "load_ragged", "takes_ragged"]

STORES = ("auto", "pixels", "jpeg")


@dataclass
class Source:
    images: torch.Tensor | Ragged | Encoded
    labels: torch.Tensor
    description: str
    cache_path: Path | None = None
    mapped: bool = False  # memory-mapped from a cache file
    notes: list[str] = field(default_factory=list)


def fmt_bytes(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def load(
    dataset: Any,
    split: Any,
    cache: bool | str | Path,
    num_workers: int | None,
    progress: bool,
    lock_timeout: float | None,
) -> Source:
    """Images of one size and labels on the host, from a cache hit or a fresh ingest (persisted when it pays)."""
    if cache == "auto" and not split.cached and exposes_arrays(dataset):
        # Nothing to compute and a vectorised read: a cache could not be faster, and fingerprinting
        # the arrays would cost more than reading them.
        data = ingest(dataset, None, num_workers=num_workers, progress=progress)
        return Source(data.images, data.labels, _describe(data))

    def read() -> Ingested:
        return ingest(dataset, split.cached_transform(), num_workers=num_workers, progress=progress)

    # "auto" persists what was expensive to compute: a per-sample read
    return _cached(dataset, split, cache, None, read, lambda d: d.path == "per-sample", progress, lock_timeout, [])


def load_ragged(
    dataset: Any,
    split: Any,
    cache: bool | str | Path,
    num_workers: int | None,
    progress: bool,
    lock_timeout: float | None,
    store: str,
    budget: int,
    max_side: int | None = None,
) -> Source:
    """Images of different sizes, each kept as it is: decoded pixels (a Ragged store) or the files' bytes
    (an Encoded store); RandomResizedCrop makes them one size."""
    notes = [
        "images of different sizes: each is stored as it is, and RandomResizedCrop draws its box from its own size"
    ]
    if split.cached or file_samples(dataset) is None:  # read sample by sample, through the cached part
        if store == "jpeg":
            why = (
                f"its cached part ({', '.join(repr(op) for op in split.cached)}) changes the images"
                if split.cached
                else f"{type(dataset).__name__} is not a folder of image files read by torchvision's PIL loader"
            )
            raise ConfigError(
                f"store='jpeg' keeps the files' own bytes, but {why}; use store='pixels' (decoded once, kept)"
            )
        if max_side is not None:
            raise ConfigError(
                f"max_side downscales the files of a folder read by torchvision's PIL loader as they are decoded; "
                f"{type(dataset).__name__} is read sample by sample: add a Resize before RandomResizedCrop instead"
            )

        def read_samples() -> Ingested:
            return ingest(dataset, split.cached_transform(), num_workers=num_workers, progress=progress, ragged=True)

        per_sample = {"kind": "pixels", "read": "samples"}
        return _cached(dataset, split, cache, per_sample, read_samples, lambda d: True, progress, lock_timeout, notes)
    shapes = header_shapes(dataset, num_workers, progress)
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
    threads = max(1, usable_cores() if num_workers is None else num_workers)

    def read_folder(progress_at: tuple[Path, str] | None = None) -> Ingested:
        """The files (and their pixels, decoded); ``progress_at``: the entry and key whose build keeps its
        progress on disk as it goes, so that a killed build resumes."""
        t0 = time.perf_counter()
        files = read_files(dataset, num_workers, progress)
        assert files is not None  # file_samples(dataset) said it is a folder
        encoded, labels = files
        if keep_bytes:
            return Ingested(encoded, labels, _files(encoded, ""), time.perf_counter() - t0)
        images, resumed = _decode_chunks(encoded, threads, max_side, progress, progress_at, _source(dataset))
        then = f"; decoded on {threads} thread(s)"
        if resumed:
            then += f", resuming a stopped build at image {resumed:,} of {len(encoded):,}"
        # the pixels of a resumable build are already in its progress file: moved into the entry, not copied
        kept = {"pixels": progress_file(progress_at[0])} if progress_at is not None else None
        return Ingested(images, labels, _files(encoded, then), time.perf_counter() - t0, kept)

    kind: dict[str, Any] = {"kind": "jpeg" if keep_bytes else "pixels", "max_side": max_side}
    # "auto" persists the pixels (a cache saves the decode); the bytes are what the files are
    if max_side is not None and not keep_bytes:
        changed = int((target != shapes).any(1).sum())
        notes.append(
            f"max_side={max_side}: {changed:,} of {len(shapes):,} images, those with a longer side over {max_side}, "
            f"downscaled once to the size torchvision's Resize(size=None, max_size={max_side}) gives (antialiased; "
            "smaller images are left as they are) -- the model sees these, not the files"
        )
    src = _cached(
        dataset, split, cache, kind, read_folder, lambda d: not keep_bytes, progress, lock_timeout, notes,
        resume=None if keep_bytes else lambda target, key: read_folder((target, key)),
    )  # fmt: skip
    if isinstance(src.images, Encoded) and src.images.paths is None:  # from the cache: errors still name files
        src.images = replace(src.images, paths=[p for p, _ in file_samples(dataset) or []])
    return src


_CHUNK_BYTES = 64 << 20  # decoded pixels per recorded step of a resumable build: a kill loses about this
_PER_THREAD = 16  # and at least this many images per decoding thread in a step, so that none waits long


def _source(dataset: Any) -> str:
    """What a build's progress records as its data: the folder the files are in."""
    root = getattr(dataset, "root", None)
    return str(Path(root).resolve()) if root is not None else ""


def _decode_chunks(
    encoded: Encoded,
    threads: int,
    max_side: int | None,
    progress: bool,
    progress_at: tuple[Path, str] | None,
    source: str = "",
) -> tuple[Ragged, int]:
    """Decode chunk by chunk (a progress bar), in memory or, with ``progress_at``, into the build's progress
    file beside the entry, recording each chunk; returns the pixel store and how many images an earlier,
    stopped build had decoded."""
    from tqdm.auto import tqdm

    from .cache.partial import Partial

    shapes = downscaled(encoded.shapes, max_side)
    sizes = shapes.prod(1)
    ends = torch.cumsum(sizes, 0)
    starts, n, nbytes = ends - sizes, len(encoded), int(ends[-1])
    partial = Partial.open(*progress_at, nbytes, n, source) if progress_at is not None else None
    data = partial.data if partial is not None else torch.empty(nbytes, dtype=torch.uint8)
    done = partial.done if partial is not None else 0
    with tqdm(total=n, initial=done, desc="gpufeed: decoding", unit="image", disable=not progress) as bar:
        while done < n:
            # the images that end within the next _CHUNK_BYTES, and at least 16 per thread (threads kept busy)
            last = int(torch.searchsorted(ends, int(starts[done]) + _CHUNK_BYTES, right=True))
            last = min(n, max(last, done + _PER_THREAD * threads))
            part = encoded.select(torch.arange(done, last))
            decode(part, torch.device("cpu"), threads, max_side, out=data[int(starts[done]) : int(ends[last - 1])])
            if partial is not None:
                partial.commit(last)
            bar.update(last - done)
            done = last
    return Ragged(data, starts, shapes), partial.resumed if partial is not None else 0


def _files(encoded: Encoded, then: str) -> str:
    jpegs = int(encoded.jpeg.sum())
    return (
        f"folder ({fmt_bytes(encoded.data.nbytes)} of files: {jpegs:,} JPEG, {len(encoded) - jpegs:,} other; sizes "
        f"from their headers{then})"
    )


def _cached(
    dataset: Any,
    split: Any,
    cache: bool | str | Path,
    kind: dict[str, Any] | None,
    read: Any,
    expensive: Any,
    progress: bool,
    lock_timeout: float | None,
    notes: list[str],
    resume: Any = None,
) -> Source:
    """``read()``'s data, or the cache entry of the same key; written to the cache when asked (``cache=True`` or
    a root) or, for ``"auto"``, when ``expensive(data)``. ``resume``: a ``read`` that resumes a stopped build
    (see :func:`gpufeed.caching.load_or_ingest`)."""
    key = cache_key(dataset, split.cached, kind) if cache is not False else None
    notes = list(notes)
    if cache is not False and key is None:
        warnings.warn(
            f"gpufeed.accelerate: {type(dataset).__name__} or its cached ops cannot be fingerprinted, so nothing is "
            "written to disk (an opaque source could later be matched to other data)",
            stacklevel=4,
        )
        notes.append("not persisted: the source or the cached ops cannot be fingerprinted")
    if key is None:
        data = read()
        return Source(data.images, data.labels, _describe(data), None, False, notes)
    root = cache if isinstance(cache, Path) else None
    path = entry_path(dataset, key, root)
    always = cache is True or root is not None
    hit, data = load_or_ingest(
        dataset,
        split,
        path,
        key,
        lambda d: always or expensive(d),
        None,
        progress,
        lock_timeout,
        strict=False,  # a cache that cannot be written is not a reason to fail: the data stays in memory
        read=read,
        resume=resume,
    )
    if data is None:
        assert hit is not None  # load_or_ingest returns one or the other
        return Source(hit.images, hit.labels, f"cache hit, verified ({len(hit.labels)} samples)", path, True, notes)
    if hit is not None:
        return Source(hit.images, hit.labels, _describe(data) + ", written to the cache", path, True, notes)
    return Source(data.images, data.labels, _describe(data), None, False, notes)


def describe_store(images: Ragged | Encoded) -> str:
    """The plan's line for a store of images of different sizes."""
    h, w = images.shapes[:, 1], images.shapes[:, 2]
    sizes = f"heights {int(h.min())}-{int(h.max())}, widths {int(w.min())}-{int(w.max())}"
    if isinstance(images, Encoded):
        where = "nvJPEG, batched" if images.data.is_pinned() else f"torchvision on {usable_cores()} CPU thread(s)"
        jpegs = int(images.jpeg.sum())
        others = f", the {len(images) - jpegs:,} others by PIL on the CPU" if jpegs < len(images) else ""
        what = f"encoded files: {len(images):,} images decoding to 3 channels, {sizes}"
        return f"{what}; {jpegs:,} JPEGs decoded by {where}{others}"
    return f"ragged: {len(images):,} images of {int(images.shapes[0, 0])} channel(s), {sizes}"


def _describe(data: Any) -> str:
    return f"{data.path} read of {len(data.labels)} samples in {data.seconds:.2f} s"
