"""WebDataset ``.tar`` shards (LAION, timm's ``-wds`` sets) read with :mod:`tarfile` alone: no ``webdataset``.

A sample is a run of consecutive members sharing a key; the key is a member's name up to the first dot of its
base name (directory included), the rest is the field: ``train/000001.jpg`` -> key ``train/000001``, field
``jpg``; ``a/b.seg.png`` -> ``a/b``, ``seg.png`` (webdataset's ``base_plus_ext``). Members named ``__...__``
(``__index__``, ``__meta__``) are metadata, and members that are not regular files are skipped, as webdataset
does. The tar is read as a stream (mode ``r|*``), so ``.tar.gz`` works too and nothing is seeked.
"""

from __future__ import annotations

import glob
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DataError

__all__ = ["IMAGE_FIELDS", "TAR_SUFFIXES", "WdsSample", "image_field", "is_tar", "label_of", "list_tars", "samples"]

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# The fields that hold an image file, in the order one is chosen when a sample has several (webdataset's image
# extensions and those of timm's and LAION's sets); ``seg.png`` and other compound fields are never the image.
IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp", "img", "image", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm")
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


@dataclass(frozen=True)
class WdsSample:
    """One sample: its key, its fields' bytes by field name (lower case), and where it is (``tar:key``)."""

    key: str
    fields: dict[str, bytes]
    where: str


def is_tar(path: Path) -> bool:
    return path.name.lower().endswith(TAR_SUFFIXES)


def list_tars(src: str | Path) -> list[Path] | None:
    """The tars ``src`` names, sorted by name: a tar file, a folder holding tars (not its subfolders), or a glob
    pattern (``"DIR/imagenet1k-train-*.tar"``: timm's sets keep train and validation tars in one folder);
    ``None`` when ``src`` is a folder without tars (an image folder)."""
    text = str(src)
    path = Path(text).expanduser()
    if glob.has_magic(text) and not path.exists():
        found = sorted(Path(p) for p in glob.glob(str(path)) if is_tar(Path(p)) and Path(p).is_file())
        if not found:
            raise ConfigError(f"{text}: the pattern matches no {'/'.join(TAR_SUFFIXES)} file; check the pattern")
        return found
    if path.is_file():
        if not is_tar(path):
            raise ConfigError(
                f"{text} is a file but not a WebDataset tar ({', '.join(TAR_SUFFIXES)}); give a tar, a folder of "
                "tars, or an image folder"
            )
        return [path]
    if not path.is_dir():
        return None
    tars = sorted(p for p in path.iterdir() if is_tar(p) and p.is_file())
    folders = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if tars and folders:  # an image folder beside an archive of it, say: which one is meant?
        raise ConfigError(
            f"{text} holds both tars ({tars[0].name}, ...) and folders ({', '.join(folders[:3])}, ...): give the "
            f"WebDataset shards as a quoted pattern ('{path}/*.tar'), or move the tars out of the image folder"
        )
    return tars or None


def samples(tar: Path, skip: int = 0) -> Iterator[WdsSample]:
    """The samples of ``tar`` in member order, after the first ``skip`` ones (read through, not kept).

    Raises:
        DataError: the tar is damaged or truncated, or a key repeats a field (two ``.jpg`` in one sample).
    """
    key: str | None = None
    fields: dict[str, bytes] = {}
    seen = 0
    try:
        with tarfile.open(tar, mode="r|*") as stream:
            for member in stream:
                name = member.name
                if not member.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")):
                    continue
                m = _KEY.match(name)
                if m is None:  # no extension: webdataset has no field to put it in either
                    continue
                k, field = m[1], m[2].lower()
                if k != key:
                    if key is not None:
                        seen += 1
                        if seen > skip:
                            yield WdsSample(key, fields, f"{tar}:{key}")
                    key, fields = k, {}
                if field in fields:
                    raise DataError(
                        f"{tar}: member {name} repeats the field {field!r} of sample {k!r}; a sample's members must "
                        "have different extensions (rewrite the tar, or remove the duplicate)"
                    )
                reader = stream.extractfile(member)
                assert reader is not None  # a regular member always has its data
                # only the samples kept need their bytes; a skipped one is read past by the stream
                fields[field] = reader.read() if seen >= skip else b""
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{tar}: cannot be read as a tar ({type(e).__name__}: {e}); download it again") from e
    if key is not None and seen + 1 > skip:
        yield WdsSample(key, fields, f"{tar}:{key}")


def image_field(sample: WdsSample) -> str | None:
    """The field that holds the sample's image (see ``IMAGE_FIELDS``), or ``None``."""
    return next((f for f in IMAGE_FIELDS if f in sample.fields), None)


def label_of(sample: WdsSample) -> int:
    """The class index in the sample's ``.cls`` (ASCII digits, as webdataset writes it), -1 without one."""
    raw = sample.fields.get("cls")
    if raw is None:
        return -1
    try:
        return int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise DataError(
            f"{sample.where}.cls holds {raw[:20]!r}, not a class index (ASCII digits); fix the sample or leave it out"
        ) from None
