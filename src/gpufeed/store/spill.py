"""A private memory-mapped copy of data that has no cache entry, for the ``mmap`` tier.

The copy lives in ``$TMPDIR/gpufeed-mmap-<pid>-<rand>/`` and is removed when its loader is
collected or the process exits normally. A process killed outright (SIGKILL, a scheduler's time
limit) cannot remove it, so each new spill first removes those of processes that are gone --
recognised by their name and by holding nothing but a gpufeed entry or its build leftovers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

from ..cache.format import is_gpufeed_entry
from ..cache.manage import is_leftover
from ..cache.reader import open_entry
from ..cache.writer import write_cache

__all__ = ["spill"]

_PREFIX = "gpufeed-mmap-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _ours(directory: Path) -> bool:
    try:
        children = list(directory.iterdir())
    except OSError:
        return False
    return all((c.name == "entry" and is_gpufeed_entry(c)) or is_leftover(c) for c in children)


def remove_dead_spills(tmp: Path | None = None) -> list[Path]:
    """Remove the spills of processes that no longer run; returns what was removed."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid = d.name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)) and d.is_dir() and _ours(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def spill(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``images`` and ``labels`` written to a private file and memory-mapped; the file goes with the mapping.

    Raises :class:`~gpufeed.errors.CacheWriteError` (nothing left behind) when it cannot be written.
    """
    remove_dead_spills()
    directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    try:
        write_cache(directory / "entry", "temporary", {"images": images, "labels": labels}, {"temporary": True})
        mapped = open_entry(directory / "entry", verify=False)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    images = mapped.arrays["images"]
    weakref.finalize(images, shutil.rmtree, directory, True)  # the loader holds the mapped images
    return images, mapped.labels
