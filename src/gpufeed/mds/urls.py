"""What names an MDS dataset, told from its text alone: a remote URL the streaming engine reads, a directory holding
an MDS ``index.json``, or neither (an image folder, a keyword). It imports nothing heavy: the command line's
``--data`` (:mod:`gpufeed.data.images`, :mod:`gpufeed.data.mds`) and ``gf.stream``'s argument checks both ask it.

Example:
    >>> is_url("s3://bucket/imagenet-mds"), is_stream("/nonexistent")
    (True, False)
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from ..errors import ConfigError

__all__ = ["SCHEMES", "check_url", "is_mds_dir", "is_stream", "is_url"]

# The engine's downloaders (streaming 0.14.2's DOWNLOADER_MAPPINGS; ``dbfs:/Volumes/...`` is its dbfs-uc). Kept
# here, not read from the engine, so that parsing --data imports nothing; tests/stream/test_cli_stream.py compares.
SCHEMES = ("alipan", "azure", "azure-dl", "dbfs", "gs", "hf", "oci", "s3", "sftp")


def _scheme(text: str) -> str | None:
    """The URL scheme of ``text`` (``s3``, ``gs``, ...), None for a path (a Windows drive letter is a path)."""
    if "://" not in text and not text.startswith("dbfs:/"):
        return None
    return urllib.parse.urlparse(text).scheme or None


def is_url(text: str | None) -> bool:
    """Whether ``text`` is a remote the engine reads (``s3://...``, ``gs://...``, ...).

    Example:
        >>> is_url("s3://bucket/imagenet-mds"), is_url("/data/imagenet")
        (True, False)
    """
    return text is not None and _scheme(text) in SCHEMES


def is_mds_dir(path: str | Path | None) -> bool:
    """Whether ``path`` is a directory holding an MDS dataset (its ``index.json``)."""
    return path is not None and "://" not in str(path) and (Path(path).expanduser() / "index.json").is_file()


def is_stream(data: str | None) -> bool:
    """Whether ``--data`` names an MDS dataset (a remote URL, or a directory with an ``index.json``)."""
    return is_url(data) or is_mds_dir(data)


def check_url(text: str) -> None:
    """A ConfigError when ``text`` looks like a URL of a scheme the engine does not read."""
    scheme = _scheme(text)
    if scheme is not None and scheme not in SCHEMES:
        raise ConfigError(
            f"{text!r}: the streaming engine reads {', '.join(f'{s}://' for s in SCHEMES)} or a directory, not "
            f"{scheme}://"
        )
