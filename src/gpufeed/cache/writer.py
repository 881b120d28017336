"""Write a cache atomically: a temporary directory, flushed, manifest last, then one rename.

NOTE [ Cache write order ]
1. Arrays are written into ``.<name>.building-<pid>-<rand>`` next to the target and fsynced.
2. The manifest is written last (to a temporary name, fsynced, renamed), so a directory with a
   manifest has complete arrays.
3. The temporary directory is renamed onto the target in one step (an old entry is moved aside
   first and removed after). A build killed at any point leaves only a ``.building`` directory,
   which no reader opens and the next build removes.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from .format import MANIFEST, ArraySpec, Manifest, block_hashes

__all__ = ["write_cache"]


def _checkpoint(phase: str) -> None:
    """A seam between the phases of a write; the fault-injection tests end the process here."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_builds(target: Path) -> None:
    for stale in target.parent.glob(f".{target.name}.building-*"):
        pid = stale.name.rsplit("-", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_cache(target: Path, key: str, arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> Manifest:
    """Write ``arrays`` (CPU tensors) and their manifest to the directory ``target``, atomically."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target)
    tmp = target.parent / f".{target.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        specs = {}
        for name, tensor in arrays.items():
            array = tensor.detach().cpu().contiguous().numpy()
            file = f"{name}.bin"
            with open(tmp / file, "wb") as f:
                f.write(memoryview(array).cast("B"))
                f.flush()
                os.fsync(f.fileno())
            specs[name] = ArraySpec(file, array.dtype.name, tuple(array.shape), array.nbytes, block_hashes(array))
            _checkpoint(f"wrote {file}")
        manifest = Manifest(key, specs, meta)
        staged = tmp / f"{MANIFEST}.tmp"
        with open(staged, "w") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, tmp / MANIFEST)
        _fsync_dir(tmp)
        _checkpoint("wrote manifest")
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
