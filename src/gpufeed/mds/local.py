"""``local=`` of a stream checked from the file system alone, before any network: a directory gpufeed can enter
(and, for a remote's cache, write), or a typed error naming it and the fix.

Example:
    >>> check_local("/nonexistent/cache", remote="s3://bucket/data")  # created later, when the remote is opened
"""

from __future__ import annotations

import errno
import os

from ..errors import ConfigError

__all__ = ["check_local", "make_local"]


def _fix(remote: str | None) -> str:
    if remote is None:
        return "give the folder that holds the dataset's index.json and shards"
    return "give a directory this user can write (the remote's shards are downloaded into it), or leave local out"


def check_local(local: str | os.PathLike[str], remote: str | None) -> None:
    """A ConfigError if ``local`` cannot be a stream's directory: a file, a symlink loop, a path through a file or
    a directory that cannot be entered; with ``remote``, also one this user cannot write (a read-only ``local``
    is usable only as local-only data: gpufeed then only reads it). A ``local`` that does not exist yet is left
    to :func:`make_local` (a remote's cache) or to the index's own error (local-only data)."""
    path = os.fspath(local)
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:  # ELOOP, ENOTDIR (a path through a file), EACCES on a parent, ENAMETOOLONG
        why = "is a symbolic link loop" if e.errno == errno.ELOOP else f"cannot be used ({e.strerror or e})"
        raise ConfigError(f"local={path!r} {why}; {_fix(remote)}") from None
    if not os.path.isdir(path):
        raise ConfigError(f"local={path!r} is a file, not a directory; {_fix(remote)}")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"local={path!r} is a directory this user cannot enter or list; {_fix(remote)}")
    if remote is not None and not os.access(path, os.W_OK):
        raise ConfigError(
            f"local={path!r} is read-only, and remote={remote!r} is downloaded into it: give a writable local (or "
            "leave it out: gpufeed picks one under its cache directory); if it already holds the whole dataset, read "
            "it as local-only data (local= alone, remote=None): gpufeed then only reads it"
        )


def make_local(local: str, remote: str) -> None:
    """Create a remote's ``local`` (and its parents), or a ConfigError naming why it cannot be."""
    check_local(local, remote)
    try:
        os.makedirs(local, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"local={local!r} cannot be created ({e.strerror or e}); {_fix(remote)}") from None
    check_local(local, remote)
