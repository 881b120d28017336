"""What ``gpufeed convert`` reads: an ImageFolder, a Food101 folder, WebDataset tars, or a Hugging Face dataset
(a ``save_to_disk`` folder or Parquet files, :mod:`.hf`), as units of samples.

A source is a list of units read in order (the folder itself, each tar, the saved dataset, each Parquet file),
each a stream of samples that can start at any position, so a conversion resumes where its last finished part
ended. A folder's listing is torchvision's own (``ImageFolder``'s classes and files; ``Food101``'s
``meta/<split>.json``), a Hugging Face dataset's order its rows', so sample ``i`` of the conversion is sample ``i``
of the dataset a user would build over the same data. Sources are only read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ConfigError, DataError
from ..inside import inside
from . import wds
from .digests import sample_digests
from .items import Item, Source

__all__ = ["Item", "Ready", "Source", "image_type", "open_source", "prepare", "ready"]

_SPLIT_NAMES = {"train", "val", "valid", "validation", "test"}
_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF8", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)


@dataclass(frozen=True)
class Ready:
    """An item read and checked: ``why`` it cannot be converted (``None``: it can), its bytes' ``sha1`` and the
    ``sample_sha1`` of its bytes and label (hex: NOTE [ What a sample's digests cover ] in :mod:`.digests`), and
    image ``kind`` (``jpeg``, ``png``, ...)."""

    item: Item
    why: str | None
    sha1: str = ""
    kind: str = ""
    sample_sha1: str = ""


def ready(items: Iterator[Item], threads: int) -> Iterator[Ready]:
    """Each item read (a folder's file), checked and hashed by :func:`prepare` on ``threads`` threads (file reads
    and sha1 release the GIL: a network file system's latency overlaps), in order, a bounded window ahead."""
    if threads <= 1:
        yield from map(prepare, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="gpufeed-convert") as pool:
        window: deque[Future[Ready]] = deque()
        for item in items:
            window.append(pool.submit(prepare, item))
            if len(window) >= 4 * threads:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def prepare(item: Item) -> Ready:
    """The item's bytes read if need be, then why it cannot be converted (unreadable; not an image by gpufeed's
    header reader: Pillow's header, its decompression-bomb limit, the file's size against the size claimed),
    else its sha1 and image kind."""
    from ..read.files import header_shape  # image folders' header check (NOTE [ Header sizes against file sizes ])

    if item.data is None and item.error is None:
        try:
            with open(item.where, "rb") as f:
                item = replace(item, data=f.read())
        except OSError as e:
            item = replace(item, error=f"{item.where}: cannot be read ({e.strerror or e})")
    if item.error is not None or item.data is None:
        return Ready(item, item.error or f"{item.where}: no data")
    try:
        header_shape(io.BytesIO(item.data), item.where)
    except DataError as e:
        return Ready(item, str(e))
    image, sample = sample_digests(item.data, item.label)
    return Ready(item, None, image, image_type(item.data), sample)


def image_type(data: bytes) -> str:
    """``jpeg``, ``png``, ``webp``, ``gif``, ``bmp``, ``tiff`` from the file's first bytes, else ``other``."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in _MAGIC if data.startswith(magic)), "other")


def open_source(
    src: str | Path,
    split: str | None = None,
    image_key: str | None = None,
    label_key: str | None = "auto",
    config: str | None = None,
) -> Source:
    """The source ``src`` names: a Hugging Face dataset (a ``save_to_disk`` folder, ``split`` of a DatasetDict's
    default ``"train"``; a ``.parquet`` file, a folder of them, a glob pattern), WebDataset tars (a tar, a folder
    of tars, a glob pattern), a Food101 folder (``images/`` beside ``meta/<split>.json``; ``split`` default
    ``"train"``), or an ImageFolder. ``image_key`` / ``label_key``: a Hugging Face dataset's columns
    (:func:`gpufeed.read.hf.find_columns`; ``label_key`` None: no labels).

    Raises:
        ConfigError: ``src`` does not exist or is no such source, or ``split``, ``image_key`` or ``label_key``
            does not apply to it (a missing column is named with the columns there are).
    """
    from . import hf

    text = str(src)
    on_disk = hf.locate(src, config)  # config: a Hub repository card's (refused for anything else)
    if on_disk is not None:
        return hf.source(on_disk, split, image_key, label_key)
    if image_key is not None or label_key != "auto":
        raise ConfigError(
            f"image_key and label_key (--image-key, --label-key) name the columns of a Hugging Face dataset (a "
            f"save_to_disk folder, Parquet files); {text} is not one: drop them"
        )
    tars = wds.list_tars(src)
    if tars is not None:
        _no_split(split, text)
        listing = [(t.name, t.stat().st_size) for t in tars]
        given = Path(text).expanduser()
        # the folder that holds the tars (a glob's or one tar's too): nothing is written into a dataset's folder
        root = given.resolve() if given.is_dir() else Path(os.path.commonpath([t.resolve().parent for t in tars]))
        shown = str(given.resolve() if given.exists() else given.absolute())  # a glob pattern stays one
        return Source(shown, root, "wds", tuple(str(t.resolve()) for t in tars), None, None, _digest(listing))
    root = Path(text).expanduser()
    if not root.is_dir():
        raise ConfigError(
            f"src={text!r}: no such folder or tar; give an image folder (SRC/<class>/<files>), a "
            "Food101 folder, WebDataset tars (a .tar, a folder of them, or a quoted glob), or a Hugging Face "
            "dataset (a save_to_disk folder, or .parquet files)"
        )
    root = root.resolve()
    if (root / "meta").is_dir() and (root / "images").is_dir():
        return _food101(root, split or "train", text)
    _no_split(split, text)
    return _image_folder(root, text)


def _no_split(split: str | None, text: str) -> None:
    if split is not None:
        raise ConfigError(
            f"split={split!r} applies to a Food101 folder (meta/<split>.json) or a Hugging Face DatasetDict "
            f"(save_to_disk); {text} is neither: drop it, and give the folder of the split you want"
        )


def _digest(listing: object) -> str:
    return hashlib.sha1(json.dumps(listing).encode()).hexdigest()


def _image_folder(root: Path, text: str) -> Source:
    from torchvision.datasets import ImageFolder

    folders = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    if "train" in folders and folders <= _SPLIT_NAMES:
        raise ConfigError(
            f"{text} holds the splits {', '.join(sorted(folders))}, not classes: convert each split on "
            f"its own (gpufeed convert {root / 'train'} DST/train)"
        )
    try:
        ds = ImageFolder(str(root))
    except (FileNotFoundError, OSError) as e:  # torchvision: no class folder, or a class without image files
        raise ConfigError(
            f"src={text!r} is not an image folder ({e}); the layout is {text}/<class name>/<image "
            "files>, or a Food101 folder, or WebDataset tars"
        ) from None
    files = tuple((str(p), int(t)) for p, t in ds.samples)
    listing = [[Path(p).relative_to(root).as_posix(), t] for p, t in files]
    return Source(str(root), root, "folder", (str(root),), tuple(ds.classes), len(files), _digest(listing), files=files)


def _food101(root: Path, split: str, text: str) -> Source:
    """torchvision's Food101 listing: classes sorted, samples in ``meta/<split>.json``'s order, ``<id>.jpg``."""
    meta = root / "meta" / f"{split}.json"
    try:
        listed = json.loads(meta.read_text())
    except FileNotFoundError:
        have = sorted(p.stem for p in (root / "meta").glob("*.json"))
        raise ConfigError(
            f"{text} is a Food101 folder without {meta.name}: split={split!r}; use one of {have}"
        ) from None
    except (OSError, ValueError) as e:
        raise DataError(f"{meta}: cannot be read as Food101's split list ({e}); download the dataset again") from None
    classes = sorted(listed)
    index = {c: i for i, c in enumerate(classes)}
    fix = "download the dataset again (its meta lists images as <class>/<id>, below images/)"
    files = tuple(
        (str(inside(root / "images", f"{rel}.jpg", listed_in=meta, links=False, fix=fix)), index[c])
        for c, rels in listed.items()
        for rel in rels
    )
    if not files:
        raise DataError(f"{meta} lists no image; nothing to convert")
    listing = [[Path(p).relative_to(root).as_posix(), t] for p, t in files]
    return Source(str(root), root, "food101", (str(root),), tuple(classes), len(files), _digest(listing), split, files)
