"""A conversion's folder (DST): claimed, its finished parts found and kept, new parts put in place, completed.

NOTE [ Parts ]
The engine's ``MDSWriter`` cannot resume, and its ``with`` block writes an ``index.json`` even when the block
raised: a partial dataset that looks complete. So a conversion writes parts: ``DST/part.NNNNN/`` holds a run of
at most ``samples_per_part`` source samples (never two tars' samples), written by its own writer into
``DST/.part.NNNNN.partial`` and renamed into place only after that writer finished cleanly, with a record of
what it covers (``gpufeed.part.json``: which unit, tar or folder, from which sample, how many read and written).
A restart keeps the finished parts (each must start where the one before it ended), deletes a ``.partial`` and
continues from the last part's end. Last, the parts' shard entries become ``DST/index.json`` (basenames
``part.NNNNN/shard.NNNNN.mds``), then ``gpufeed.json``: its presence means the conversion finished.
``DST/gpufeed.convert.json``, written first, names the source, its listing's digest and the settings: a DST that
is not empty and lacks it is someone else's folder, refused and never overwritten.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from ..cache.writer import fsync_dir
from ..errors import CacheWriteError, ConfigError, DataError
from ..inside import inside
from .digests import FORMAT as DIGESTS_FORMAT
from .index import FILE_KEYS

__all__ = [
    "FORMAT",
    "MANIFEST",
    "after",
    "claim",
    "complete",
    "drop_empty_shards",
    "finished_parts",
    "partial_dir",
    "publish",
    "read_json",
    "write_error",
]

FORMAT = DIGESTS_FORMAT  # 2: each sample's digest covers its label (NOTE [ What a sample's digests cover ])
MANIFEST = "gpufeed.json"  # written last: the conversion finished
STARTED = "gpufeed.convert.json"  # written first: what DST is the conversion of, and how
INDEX = "index.json"
PART_RECORD = "gpufeed.part.json"
_PART = re.compile(r"part\.(\d{5,})")
_PARTIAL = re.compile(r"\.part\.(\d{5,})\.partial")
_PART_FIX = "gpufeed did not write it so: delete DST and convert again"
_OURS = {MANIFEST, STARTED, INDEX, *(f".{n}.tmp" for n in (MANIFEST, STARTED, INDEX))}


def part_dir(dst: Path, number: int) -> Path:
    return dst / f"part.{number:05d}"


def partial_dir(dst: Path, number: int) -> Path:
    return dst / f".part.{number:05d}.partial"


def claim(dst: Path, started: dict[str, Any]) -> int:
    """Lock ``dst`` (an ``flock`` on the folder, held until the returned descriptor is closed) and check that it
    is new, empty, or this same conversion (``started``: format, source, split, listing digest, settings)."""
    try:
        dst.mkdir(parents=True, exist_ok=True)
        fd = os.open(dst, os.O_RDONLY)
    except FileExistsError:
        raise ConfigError(f"{dst} is a file; give a folder (new or empty) for the MDS shards") from None
    except OSError as e:
        raise CacheWriteError(f"{dst}: cannot be created ({e.strerror or e}); choose a writable DST") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{dst}: another gpufeed convert is writing into it; wait for it to end") from None
    try:
        names = sorted(p.name for p in dst.iterdir())
        if not names or names == [f".{STARTED}.tmp"]:  # new, or killed while it was being claimed
            _write_json(dst / STARTED, started)
            return fd
        record = read_json(dst / STARTED)
        if record is None:
            raise ConfigError(
                f"{dst} holds files gpufeed did not write ({', '.join(names[:5])}); gpufeed writes only into a new "
                "or empty folder, or one it converted into: give another DST"
            )
        _check_same(dst, record, started)
        foreign = [n for n in names if n not in _OURS and not _PART.fullmatch(n) and not _PARTIAL.fullmatch(n)]
        if foreign:
            raise ConfigError(
                f"{dst} is a gpufeed conversion but also holds {', '.join(foreign[:5])}, which gpufeed did not "
                "write; move those out, then run the same command again"
            )
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_same(dst: Path, record: dict[str, Any], want: dict[str, Any]) -> None:
    fresh = "delete it to convert again, or give another DST"
    if record.get("format") != FORMAT:
        raise ConfigError(f"{dst} holds a conversion of format {record.get('format')!r}, not {FORMAT}; {fresh}")
    if (record.get("source"), record.get("split")) != (want["source"], want["split"]):
        raise ConfigError(
            f"{dst} holds the conversion of {record.get('source')} (split {record.get('split')}), not of "
            f"{want['source']} (split {want['split']}); {fresh}"
        )
    if record.get("listing") != want["listing"]:
        raise ConfigError(
            f"{dst} holds a conversion of {want['source']} as it was before its files changed (added, removed, "
            f"renamed, or a tar's size); {fresh}"
        )
    if record.get("settings") != want["settings"]:
        raise ConfigError(
            f"{dst} was converted with {record.get('settings')}, not {want['settings']}: run the same command as "
            f"before to finish it, or {fresh}"
        )


def finished_parts(dst: Path) -> list[dict[str, Any]]:
    """The records of the parts an earlier run finished, each starting where the one before ended, marked
    ``reused``; what follows the first gap (a ``.partial``, a part after a missing one) is removed: gpufeed
    wrote it (its record says so) and writes it again."""
    parts: list[dict[str, Any]] = []
    position = (0, 0)
    while (record := read_json(part_dir(dst, len(parts)) / PART_RECORD)) is not None:
        unit, start = record.get("unit"), record.get("start")
        follows = (unit, start) == position or (  # or the next unit that had samples (a tar may hold none)
            position[1] == 0 and start == 0 and isinstance(unit, int) and unit > position[0]
        )
        if not follows:
            break
        parts.append({**record, "reused": True})
        position = after(record)
    for path in sorted(dst.iterdir()):
        m = _PART.fullmatch(path.name) or _PARTIAL.fullmatch(path.name)
        if m is None or (path.name.startswith("part.") and int(m[1]) < len(parts)):
            continue
        if path.name.startswith("part.") and read_json(path / PART_RECORD) is None:
            raise ConfigError(
                f"{path} has no {PART_RECORD}: gpufeed did not leave it so; remove it, then run the same command again"
            )
        shutil.rmtree(path)
    return parts


def after(record: dict[str, Any]) -> tuple[int, int]:
    """The source position (unit, sample) after a part: the next unit's start, or further on in the same."""
    if record["ends_unit"]:
        return record["unit"] + 1, 0
    return record["unit"], record["start"] + record["consumed"]


def drop_empty_shards(part: Path) -> int:
    """Remove the shards of no sample (the engine writes one when a sample alone exceeds the shard size) from a
    part's index and folder; returns the part's sample count."""
    index = json.loads((part / INDEX).read_text())
    kept = [s for s in index["shards"] if s["samples"] > 0]
    for shard in index["shards"]:
        for key in ("raw_data", "zip_data"):
            if shard["samples"] == 0 and shard.get(key):
                inside(part, shard[key]["basename"], listed_in=part / INDEX).unlink(missing_ok=True)
    if len(kept) != len(index["shards"]):
        _write_json(part / INDEX, {**index, "shards": kept})
    return sum(s["samples"] for s in kept)


def publish(dst: Path, number: int, record: dict[str, Any]) -> None:
    """Write the part's record, flush its files to disk and rename it into place (NOTE [ Parts ])."""
    tmp = partial_dir(dst, number)
    try:
        (tmp / PART_RECORD).write_text(json.dumps(record, sort_keys=True))
        for path in tmp.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(tmp)
        os.rename(tmp, part_dir(dst, number))
        fsync_dir(dst)
    except OSError as e:
        raise write_error(dst, e) from e


def complete(dst: Path, parts: list[dict[str, Any]], about: dict[str, Any]) -> dict[str, Any]:
    """Write the parts' shards as ``DST/index.json``, then ``gpufeed.json`` (``about``: format, source, kind,
    classes, split; the counts are added); returns that manifest."""
    shards = []
    for i in range(len(parts)):
        prefix = part_dir(dst, i).name
        for shard in json.loads((part_dir(dst, i) / INDEX).read_text())["shards"]:
            for key in FILE_KEYS:
                if shard.get(key):
                    # a part's names stay in the part (a part left by an earlier run may have been edited since)
                    name = shard[key].get("basename")
                    inside(part_dir(dst, i), name, listed_in=part_dir(dst, i) / INDEX, fix=_PART_FIX)
                    shard[key] = {**shard[key], "basename": f"{prefix}/{name}"}
            shards.append(shard)
    samples, recorded = sum(s["samples"] for s in shards), sum(p["samples"] for p in parts)
    if samples != recorded:
        raise DataError(
            f"{dst}: the parts' indexes hold {samples} samples, their records {recorded}; a part was changed after "
            "it was written: delete DST and convert again"
        )
    if samples == 0:
        raise DataError(f"{about['source']}: no sample to convert (every one was left out, or the tars hold none)")
    types: Counter[str] = Counter()
    for part in parts:
        types.update(part["image_types"])
    manifest = {
        **about,
        "num_classes": _num_classes(about.get("classes"), parts),
        "samples": samples,
        "image_types": dict(sorted(types.items())),
        "skipped": [s for p in parts for s in p["skipped"]],
    }
    try:
        _write_json(dst / INDEX, {"shards": shards, "version": 2})
        _write_json(dst / MANIFEST, manifest)
    except OSError as e:
        raise write_error(dst, e) from e
    return manifest


def _num_classes(classes: list[str] | None, parts: list[dict[str, Any]]) -> int | None:
    """The classes' count: the names' (a folder's, a ClassLabel's), else the largest label written plus one (tars
    number their classes); None for images without labels, or parts written before the largest was recorded."""
    if classes is not None:
        return len(classes)
    tops = [p.get("max_label") for p in parts]
    if any(t is None for t in tops):
        return None
    top = max((t for t in tops if t is not None), default=-1)
    return top + 1 if top >= 0 else None


def write_error(dst: Path, e: OSError) -> CacheWriteError:
    where = f": {e.filename}" if e.filename else ""
    return CacheWriteError(
        f"{dst}: writing failed ({e.strerror or e}{where}); free space or choose a writable DST, then run the same "
        "command again: the finished parts are kept"
    )


def _write_json(path: Path, obj: Any) -> None:
    """Write to a temporary sibling, flush, rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; ``None`` if it is missing, unreadable or not an object."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None
