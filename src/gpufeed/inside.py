"""Names read from data, kept inside their root: the rule tar and zip extractors learned the hard way.

A shard's basename in an MDS ``index.json``, an array's file in a cache manifest, a file listed by a dataset's
own metadata: each is a name a file gave, joined to a directory gpufeed chose. A crafted or damaged file can
make it climb out (``../../x``), jump out (``/etc/passwd``, ``C:\\x``), hide a NUL byte (the OS call would cut
the name there) or go through a symlink that points elsewhere; gpufeed would then read, or download into, a
file outside the dataset or cache. :func:`inside` joins a name to its root only when the result stays inside
the root, else raises a typed error naming the file the name came from, the name and the fix.

Example:
    >>> str(inside("/data/imagenet", "part.00000/shard.00001.mds", listed_in="/data/imagenet/index.json"))
    '/data/imagenet/part.00000/shard.00001.mds'
    >>> inside("/data", "../x.mds", listed_in="index.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gpufeed.errors.DataError: index.json lists '../x.mds', which climbs out with '..': ... inside /data; ...
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import DataError, GpufeedError

__all__ = ["NAME_MAX", "PATH_MAX", "Root", "check_name", "inside"]

_DRIVE = re.compile(r"^[A-Za-z]:")
# Linux's limits on a name in a directory and on a whole path (every file system it mounts keeps to the first): a
# longer name is refused here, naming its entry, not by the OS as a raw error (or, downloading, as a network fault)
NAME_MAX = 255
PATH_MAX = 4096


def check_name(name: object) -> str | None:
    """Why ``name`` cannot be a relative path below a root, from its text alone (None: it can). Covers what a
    remote URL joined with it needs too: no ``..``, no absolute path, no Windows drive or separator."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a file name"
    if not name or name.strip("/") in ("", "."):
        return "names no file"
    if "\0" in name:
        return "holds a NUL byte"
    if name.startswith("/"):
        return "is an absolute path"
    if _DRIVE.match(name) or "\\" in name:
        return "is a Windows path (a drive letter or a backslash)"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if any(len(os.fsencode(part)) > NAME_MAX for part in parts):  # the OS would refuse it (ENAMETOOLONG)
        return f"has a part longer than a file name may be ({NAME_MAX} bytes)"
    return None


def inside(
    root: str | os.PathLike[str],
    name: object,
    *,
    listed_in: str | os.PathLike[str],
    error: type[GpufeedError] = DataError,
    links: bool = True,
    fix: str = "the file is damaged or crafted: write it again with the tool that made it",
) -> Path:
    """``root / name``, refused unless it stays inside ``root``.

    Args:
        root: the directory the name is relative to (a dataset, a cache entry, a remote's local cache).
        name: the name as the data gave it (a shard's basename, an array's file).
        listed_in: the file the name was read from, for the message.
        error: the error type to raise (a DataError for datasets, a CacheError for cache entries).
        links: also resolve symlinks (of ``root`` and of what exists of the joined path) and refuse a result
            outside the resolved root: for trees gpufeed writes or fills (a cache, a stream's local). False for a
            user's own tree (an image folder may link its images from another disk): the name alone is checked.
        fix: what to do, ending the message.
    """
    return Path(Root(root, links).join(name, listed_in=listed_in, error=error, fix=fix))


class Root:
    """A root that many names are joined to (an index's thousands of shards): :func:`inside` for each, with the
    root and each folder below it resolved once, a name's own file only when it is a link (one ``lstat``): 20,000
    shard names took 3.4 s through ``os.path.realpath`` and ``pathlib`` each, 0.4 s so, on a loaded 2-core machine.

    Example:
        >>> shards = Root("/data/set")
        >>> [shards.join(n, listed_in="index.json") for n in ("a/0.mds", "a/1.mds")]
        ['/data/set/a/0.mds', '/data/set/a/1.mds']
    """

    def __init__(self, root: str | os.PathLike[str], links: bool = True) -> None:
        self.root, self.links = os.fspath(root), links
        self._real = os.path.realpath(self.root) if links else ""
        self._prefix = self._real.rstrip(os.sep) + os.sep  # what every real path below the root starts with
        self._dirs: dict[str, str] = {}  # a folder below the root (as named) -> its real path

    def join(
        self,
        name: object,
        *,
        listed_in: str | os.PathLike[str],
        error: type[GpufeedError] = DataError,
        fix: str = "the file is damaged or crafted: write it again with the tool that made it",
    ) -> str:
        """``root / name`` as a string (see :func:`inside`)."""
        why = check_name(name)
        shown = f"{listed_in} lists {name!r}, which"
        if why is not None:
            raise error(f"{shown} {why}: a name read from data must stay inside {self.root}; {fix}")
        path = os.path.join(self.root, str(name))
        if len(os.fsencode(path)) >= PATH_MAX:
            raise error(
                f"{shown} is {len(os.fsencode(path)):,} bytes long below {self.root}, longer than a path may be "
                f"({PATH_MAX:,} bytes); {fix}"
            )
        if not self.links:
            return path
        folder, _, base = str(name).rstrip("/").rpartition("/")
        real_dir = self._dirs.get(folder)
        if real_dir is None:
            real_dir = self._dirs[folder] = os.path.realpath(os.path.join(self.root, folder))
        # the name's own file resolved only when it is a link (one lstat); else it is where its folder is
        candidate = os.path.join(real_dir, base)
        real = os.path.realpath(candidate) if os.path.islink(candidate) else candidate
        if not real.startswith(self._prefix):
            raise error(
                f"{shown} resolves to {real} through a symbolic link: a name read from data must stay inside "
                f"{self._real}; {fix}"
            )
        return path
