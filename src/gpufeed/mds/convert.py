"""``convert``: an image folder (ImageFolder, Food101), WebDataset tars or a Hugging Face dataset on disk (a
``save_to_disk`` folder, Parquet files) -> MDS shards, each image's bytes as they are (no re-encode), with digests
of its image and label; resumable (NOTE [ Parts ] in :mod:`.parts`), never writing into SRC.

The format (a contract with gpufeed's streaming reader): MDS columns ``image`` (the file's bytes), ``label`` (the
class index; -1 when a sample has none), ``key`` (the file's path relative to SRC, the WebDataset key, or a
Hugging Face dataset's row index, zero-padded),
``sha1`` (hex, of ``image``) and ``sample_sha1`` (hex, of ``image`` then ``label`` as int64: NOTE [ What a sample's
digests cover ] in :mod:`.digests`); ``DST/index.json`` lists every shard; ``DST/gpufeed.json`` (format
``gpufeed.mds/2``: classes, source, kind, split, samples, image types, skipped samples) is written last, so its
presence means the conversion finished. Samples keep the source's order: ImageFolder's (class, then file name),
Food101's (torchvision's), tar order with the tars sorted by name, or a Hugging Face dataset's rows (through a
``select``/``shuffle`` view's indices; Parquet files sorted by name).
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..device import usable_cores
from ..errors import ConfigError, DataError
from . import parts as P
from .engine import streaming
from .sources import Ready, Source, open_source, ready

__all__ = ["COLUMNS", "DEFAULT_SAMPLES_PER_PART", "DEFAULT_SHARD_SIZE", "ConvertResult", "convert"]

COLUMNS = {"image": "bytes", "label": "int", "key": "str", "sha1": "str", "sample_sha1": "str"}
DEFAULT_SHARD_SIZE = 1 << 26  # the engine's default
DEFAULT_SAMPLES_PER_PART = 2000  # what a restart may redo: seconds of work


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert` wrote: ``samples`` images (``image_types``: how many of each kind), the ``skipped``
    ones (``{"key", "why"}``), in ``parts`` parts of which ``reused_parts`` an interrupted run had finished.
    ``finished``: DST already held this conversion, and nothing was written."""

    dst: Path
    source: str
    kind: str
    split: str | None
    samples: int
    classes: tuple[str, ...] | None
    image_types: dict[str, int]
    skipped: tuple[dict[str, str], ...] = ()
    parts: int = 0
    reused_parts: int = 0
    seconds: float = 0.0
    finished: bool = False


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    compression: str | None = None,
    samples_per_part: int = DEFAULT_SAMPLES_PER_PART,
    split: str | None = None,
    progress: bool = True,
    skip_bad: bool = False,
    image_key: str | None = None,
    label_key: str | None = "auto",
    config: str | None = None,
) -> ConvertResult:
    """Convert ``src`` to MDS shards in ``dst``, copying each image file's bytes untouched.

    ``src``: an ImageFolder (``SRC/<class>/<files>``), a Food101 folder (``images/`` beside ``meta/``; ``split``
    ``"train"``, the default, or ``"test"``), or WebDataset tars (a tar, a folder of tars, or a glob pattern such
    as ``"DIR/imagenet1k-train-*.tar"``). Images of any format Pillow reads are copied as they are and counted by
    type. A Hugging Face dataset: a ``save_to_disk`` folder (of a DatasetDict, ``split``, default ``"train"``), a
    ``.parquet`` file, a folder of them, or a glob; its image column (``image_key``: found from the features, an
    ``Image``; of Parquet written by other tools, a ``struct<bytes, path>`` or binary column named here) and label
    column (``label_key``: ``"auto"``, the ``ClassLabel`` or an integer ``label`` column; None: no labels) are found
    as ``gf.accelerate`` finds them, the ``ClassLabel``'s names kept as the classes, an image given by path read
    from its file. A Hub repository's folder (its ``README.md`` card and Parquet or Arrow files, or its ``data/``
    folder) is split as ``load_dataset`` splits it (``split`` default ``"train"``; ``config`` the card's config,
    default its default one). A sample that is not an image (its header unreadable) is a DataError naming it, or with
    ``skip_bad`` is left out and listed in ``gpufeed.json``. Called again with the same arguments after an
    interruption (Ctrl-C, kill -9, a bad file), it resumes; on a finished DST it returns at once
    (``finished=True``).

    Example:
        >>> from gpufeed.mds.convert import convert
        >>> result = convert("food-101", "/scratch/food101-mds", split="train")  # doctest: +SKIP
        >>> result.samples, result.image_types  # doctest: +SKIP
        (75750, {'jpeg': 75750})
        >>> convert("food101-hf", "/scratch/food101-val-mds", split="validation")  # doctest: +SKIP

    Raises:
        ConfigError: a bad argument, a ``src`` that is no such dataset, or a ``dst`` that holds something else
            (another conversion, other settings, files gpufeed did not write).
        DataError: an unusable sample (without ``skip_bad``), a damaged tar, or no sample at all.
        CacheWriteError: ``dst`` could not be written (full disk, no permission); finished parts are kept.
    """
    settings = _settings(shard_size, compression, samples_per_part)
    source = open_source(src, split, image_key, label_key, config)
    try:
        target = Path(dst).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop: RuntimeError before Python 3.13, OSError (ELOOP) since
        raise ConfigError(
            f"dst={str(dst)!r} cannot be resolved ({e}): a symbolic link in it loops or points nowhere it can go; give "
            "a folder (new or empty) for the MDS shards, outside the loop"
        ) from None
    if target.is_relative_to(source.root):
        raise ConfigError(
            f"dst={str(dst)!r} is inside src={str(src)!r}; gpufeed never writes into a dataset: give a DST outside it"
        )
    about = {
        "format": P.FORMAT,
        "source": source.path,
        "kind": source.kind,
        "split": source.split,
        "classes": list(source.classes) if source.classes is not None else None,
    }
    lock = P.claim(target, {**about, "listing": source.fingerprint, "settings": settings})
    try:
        done = P.read_json(target / P.MANIFEST)
        if done is not None:
            return _result(target, done, finished=True)
        streaming()  # imported before the clock and the progress bar start: it takes seconds
        begun = time.monotonic()
        parts = P.finished_parts(target)
        _write_parts(target, source, settings, parts, progress, skip_bad)
        manifest = P.complete(target, parts, about)
    finally:
        os.close(lock)
    reused = sum(1 for p in parts if p.get("reused"))
    return _result(target, manifest, parts=len(parts), reused=reused, seconds=time.monotonic() - begun)


def _settings(shard_size: int, compression: str | None, samples_per_part: int) -> dict[str, Any]:
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or not 1 <= shard_size < 2**32:
        raise ConfigError(
            f"{shard_size=} must be a number of bytes from 1 to 2**32 - 1 (the engine's limit); the "
            f"default is {DEFAULT_SHARD_SIZE:,} (64 MiB)"
        )
    if isinstance(samples_per_part, bool) or not isinstance(samples_per_part, int) or samples_per_part < 1:
        raise ConfigError(f"{samples_per_part=} must be a whole number >= 1 (default {DEFAULT_SAMPLES_PER_PART})")
    if compression in (None, "", "none"):
        compression = None
    else:
        streaming()  # the engine's own names (installed and recent enough, or the fix is named)
        from streaming.base.compression import get_compressions, is_compression

        if not is_compression(compression):
            raise ConfigError(
                f"{compression=} is not one the engine writes: use none (JPEG does not compress) or "
                f"one of {', '.join(sorted(get_compressions()))}"
            )
    return {"shard_size": shard_size, "compression": compression, "samples_per_part": samples_per_part}


def _write_parts(
    dst: Path, source: Source, settings: dict[str, Any], parts: list[dict[str, Any]], progress: bool, skip_bad: bool
) -> None:
    """Write the parts that follow ``parts`` (the finished ones) to the end of the source; ``parts`` grows."""
    from tqdm.auto import tqdm

    threads = min(8, usable_cores())
    unit, start = P.after(parts[-1]) if parts else (0, 0)
    done = sum(p["consumed"] for p in parts)
    with tqdm(
        total=source.count, initial=done, desc="gpufeed: converting", unit="img", disable=not progress, smoothing=0.1
    ) as bar:
        for u in range(unit, len(source.units)):
            first = start if u == unit else 0
            items = _Ahead(ready(source.items(u, first), threads))
            while not items.ended:
                record = _write_part(dst, len(parts), settings, items, skip_bad, bar)
                record.update(unit=u, unit_name=source.units[u], start=first)
                P.publish(dst, len(parts), record)
                parts.append(record)
                first += record["consumed"]


class _Ahead:
    """A unit's items read one ahead, so that a part knows whether its unit ended with it."""

    def __init__(self, items: Iterator[Ready]) -> None:
        self._items = items
        self._next = next(items, None)

    @property
    def ended(self) -> bool:
        return self._next is None

    def take(self, n: int) -> Iterator[Ready]:
        """Up to ``n`` items."""
        for _ in range(n):
            item = self._next
            if item is None:
                return
            self._next = next(self._items, None)
            yield item


def _write_part(
    dst: Path, number: int, settings: dict[str, Any], items: _Ahead, skip_bad: bool, bar: Any
) -> dict[str, Any]:
    """The next ``samples_per_part`` items, written into ``DST/.part.NNNNN.partial`` by the engine's writer; the
    part's record (the caller adds where it starts). The writer finishes only when every item was handled: never
    after an exception (NOTE [ Parts ]), which removes the partial folder instead."""
    tmp = P.partial_dir(dst, number)
    shutil.rmtree(tmp, ignore_errors=True)  # the engine's writer refuses a folder that is not empty
    types: Counter[str] = Counter()
    skipped: list[dict[str, str]] = []
    consumed, top = 0, -1
    try:
        writer = streaming().MDSWriter(
            out=str(tmp),
            columns=COLUMNS,
            compression=settings["compression"],
            size_limit=settings["shard_size"],
            progress_bar=False,
            max_workers=1,
        )
    except OSError as e:
        raise P.write_error(dst, e) from e
    try:
        for got in items.take(settings["samples_per_part"]):
            consumed += 1
            item, why = got.item, got.why
            if why is not None:
                if not skip_bad:
                    raise DataError(
                        f"{why}\nremove or fix it, or pass --skip-bad (skip_bad=True) to leave it out "
                        "(listed in gpufeed.json); run the same command again: it resumes"
                    )
                skipped.append({"key": item.key, "why": why})
            else:
                writer.write(
                    {
                        "image": item.data,
                        "label": item.label,
                        "key": item.key,
                        "sha1": got.sha1,
                        "sample_sha1": got.sample_sha1,
                    }
                )
                types[got.kind] += 1
                top = max(top, item.label)
            bar.update()
        _finish(writer)
    except BaseException as e:
        writer.cancel_future_jobs()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise P.write_error(dst, e) from e
        raise
    written = P.drop_empty_shards(tmp)
    return {
        "consumed": consumed,
        "samples": written,
        "ends_unit": items.ended,
        "image_types": dict(types),
        "skipped": skipped,
        "max_label": top,  # gpufeed.json's num_classes where the source names no classes (numbered tars)
    }


def _finish(writer: Any) -> None:
    """``writer.finish()``, without its one-second sleep: it writes the index only once its upload queue is empty,
    polled every second, and the last shard's upload (a no-op for a local folder) was queued just before, so every
    part would wait a second. Flushing that shard first and waiting for the queue here takes milliseconds."""
    queue = getattr(getattr(writer, "executor", None), "_work_queue", None)
    if queue is not None and getattr(writer, "new_samples", None):
        writer.flush_shard()
        writer._reset_cache()
    while queue is not None and queue.qsize() > 0:
        time.sleep(0.001)
    writer.finish()


def _result(
    dst: Path, manifest: dict[str, Any], *, finished: bool = False, parts: int = 0, reused: int = 0, seconds: float = 0
) -> ConvertResult:
    classes = manifest.get("classes")
    return ConvertResult(
        dst=dst,
        source=manifest["source"],
        kind=manifest["kind"],
        split=manifest.get("split"),
        samples=manifest["samples"],
        classes=tuple(classes) if classes is not None else None,
        image_types=dict(manifest["image_types"]),
        skipped=tuple(manifest.get("skipped", ())),
        parts=parts,
        reused_parts=reused,
        seconds=seconds,
        finished=finished,
    )
