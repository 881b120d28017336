"""The digests ``gpufeed convert`` stores with each sample, and what a dataset's digests cover.

NOTE [ What a sample's digests cover ]
Every byte that decides what is learned is checked: the image and its label. ``gpufeed convert`` writes two hex
digests per sample: ``sha1``, of the image's bytes (as every release wrote it: an older reader still checks its
images), and ``sample_sha1``, of the image's bytes followed by the label as 8 little-endian bytes (int64), both
from one pass over the image. The reader checks the first, then the second (:meth:`Shards._read_shard
<gpufeed.mds.shards.Shards>`), so a flipped bit in a label -- served as another class before, the images' sha1
being blind to it -- is a DataError naming the sample, told apart from a damaged image. What a dataset has:

- ``gpufeed.json`` of format ``gpufeed.mds/2`` and both columns: images and labels checked;
- ``gpufeed.mds/1`` (written before labels were covered): images checked, labels not -- served, with one warning
  that says so and how to convert again;
- a format of gpufeed's whose columns are missing from a shard (the index edited, or mixing another dataset's
  shards): a DataError, not a dataset checked less;
- no ``gpufeed.json`` (an MDS dataset another tool wrote): served without a content check, with one warning (a
  ``sha1`` column there may mean anything; the engine's ``validate_hash`` checks whole shards against hashes the
  index records, when it records them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..errors import DataError

__all__ = ["FORMAT", "SAMPLE_COLUMN", "Coverage", "coverage", "label_bytes", "sample_digests"]

FORMAT = "gpufeed.mds/2"  # 2: sample_sha1 covers the label too; 1: sha1 of the image alone
SAMPLE_COLUMN = "sample_sha1"


def label_bytes(label: int) -> bytes:
    """A label as the sample digest covers it: 8 bytes, little-endian, two's complement (any int, no error)."""
    return (int(label) % (1 << 64)).to_bytes(8, "little")


def sample_digests(image: bytes, label: int) -> tuple[str, str]:
    """``(sha1 of image, sha1 of image + label)`` in hex, from one pass over the image's bytes.

    Example:
        >>> image, sample = sample_digests(b"pixels", 3)
        >>> image == hashlib.sha1(b"pixels").hexdigest(), sample == hashlib.sha1(b"pixels" + label_bytes(3)).hexdigest()
        (True, True)
        >>> label_bytes(3).hex(), label_bytes(-1).hex()
        ('0300000000000000', 'ffffffffffffffff')
    """
    h = hashlib.sha1(image)
    first = h.hexdigest()
    h.update(label_bytes(label))
    return first, h.hexdigest()


@dataclass(frozen=True)
class Coverage:
    """What a dataset's digests let the reader check: ``images`` and ``labels`` (bools); ``note``, a line for
    ``loader.plan``; ``warning``, what a person must be told once (None: nothing is missing)."""

    images: bool
    labels: bool
    note: str
    warning: str | None = None


def coverage(meta: dict[str, Any], image_digests: bool, sample_digests_: bool, labelled: bool, where: str) -> Coverage:
    """What is checked in the dataset ``where`` (NOTE [ What a sample's digests cover ]): ``meta`` its
    ``gpufeed.json`` (``{}`` without one); ``image_digests``/``sample_digests_``: every shard has the column;
    ``labelled``: labels are read (``label_key`` is the converter's ``label``)."""
    fmt = str(meta.get("format", ""))
    version = fmt.removeprefix("gpufeed.mds/")
    written = int(version) if fmt.startswith("gpufeed.mds/") and version.isdigit() else None
    # a format gpufeed convert wrote promises its columns: one missing is an edit, never a reason to check less
    missing = None
    if written is not None and not image_digests:
        missing = "sha1"
    elif written is not None and written >= 2 and labelled and not sample_digests_:
        missing = SAMPLE_COLUMN
    if missing is not None:
        raise DataError(
            f"{where}'s gpufeed.json says {fmt}, whose every shard holds a {missing!r} column, but a shard in its "
            f"index.json has none (renamed or removed: the index was edited, or mixes another dataset's shards), so "
            "its samples would be served unchecked; convert the source again (gpufeed convert SRC DST, into a new DST)"
        )
    if not fmt.startswith("gpufeed.mds/") or not image_digests:
        what = "has no gpufeed.json" if not meta else f"was not written by gpufeed convert (format {fmt or None!r})"
        text = (
            f"{where} {what}: its samples are served without a content check (a damaged image or label would be "
            "learned from). The engine's validate_hash= checks whole shards against hashes the index records (write "
            "them with MDSWriter(hashes=['sha1'])); or convert the source with gpufeed convert, which stores a digest "
            "of each sample's image and label"
        )
        return Coverage(False, False, "content: not checked (no gpufeed convert digests)", text)
    if labelled and not sample_digests_:
        text = (
            f"{where} was written by an earlier gpufeed convert ({fmt}): each image is checked against its sha1, but "
            "its label is not covered (a damaged label would be served as another class); convert it again with "
            "this release (gpufeed convert SRC DST, into a new DST) to check labels too"
        )
        return Coverage(True, False, f"content: images checked against their sha1, labels not covered ({fmt})", text)
    if not labelled:
        return Coverage(True, False, "content: images checked against their sha1 (no labels read)")
    return Coverage(True, True, "content: each sample's image and label checked against its digest")
