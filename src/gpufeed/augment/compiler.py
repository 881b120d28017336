"""The compiler's environment, checked in milliseconds before any compile: ``GPUFEED_COMPILE``, a C++ compiler (the
CPU) or Triton (a GPU), and a writable Inductor cache; and where Inductor keeps its cache on disk.

A compile that cannot succeed took 48-70 s on the 2-core machine before it failed (dynamo traced, AOTAutograd and
Inductor lowered, then the C++ compile or the write into the cache failed): :func:`missing` finds those causes first,
with ``shutil.which`` and ``os.access``, and says each for what it is (an unwritable cache is not a missing compiler).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from ..errors import ConfigError

__all__ = ["cache_dir", "cache_usage", "missing", "setting"]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def setting() -> bool:
    """``GPUFEED_COMPILE``: whether fused functions compile (unset: yes). Accepts 0/1, false/true, no/yes, off/on in
    any case; anything else is a :class:`~gpufeed.errors.ConfigError` naming the variable (a typo such as ``flase``
    must not leave the compiler on).

    Example:
        >>> os.environ["GPUFEED_COMPILE"] = "Off"; setting()
        False
        >>> del os.environ["GPUFEED_COMPILE"]; setting()
        True
    """
    value = os.environ.get("GPUFEED_COMPILE")
    if value is None:
        return True
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(
        f"GPUFEED_COMPILE={value!r} is not a switch: set it to 0, false, no or off to run the eager ops (the same "
        "pixels), or to 1, true, yes or on (the default) to compile the fused kernels in the background"
    )


def cache_dir() -> Path:
    """The folder Inductor writes its compiled kernels and graphs to: ``TORCHINDUCTOR_CACHE_DIR``, else its default
    (``<tempdir>/torchinductor_<user>``); read without creating it, and without importing Inductor (2-6 s) where it
    is not imported yet: as its ``cache_dir_utils`` computes it."""
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given:
        return Path(given).absolute()
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if utils is not None:
        return Path(utils.default_cache_dir()).absolute()
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)).absolute()


def cache_usage() -> tuple[Path, int]:
    """Inductor's cache folder and the bytes its files take (0 where it does not exist)."""
    root = cache_dir()
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:  # removed while walked (another process's compile cleaning its temporaries)
                continue
    return root, total


def missing(device: torch.device) -> str | None:
    """Why nothing can compile on ``device``'s type, found without compiling (milliseconds), or None: no C++
    compiler on the PATH (the CPU), no Triton (a GPU), or Inductor's cache folder not writable. Said as the
    cause and its fix, for a warning."""
    if device.type == "cpu":
        compilers = _cpp_compilers()
        if not any(shutil.which(c) for c in compilers):
            return (
                f"no C++ compiler: Inductor looks for {' or '.join(compilers)} (CXX) on the PATH; install one "
                "(apt install g++) or set CXX to one"
            )
    elif device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "no Triton for this GPU: pip install triton (torch's own release pins it), on a GPU of compute 7.0+"
    root = cache_dir()
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return (
            f"Inductor's cache folder {root} is not writable (it keeps the compiled kernels there); set "
            "TORCHINDUCTOR_CACHE_DIR to a folder you can write"
        )
    return None


def _cpp_compilers() -> list[str]:
    """The compilers Inductor's C++ backend would try, as it lists them (``torch._inductor.config.cpp.cxx``: ``CXX``
    when it was imported, else g++; clang++ on macOS), without the conda download it only makes when asked. Read
    from its config where it is imported already, else as it would read it: importing it takes 2-5 s, which the
    caller's first batch must not wait for."""
    inductor = sys.modules.get("torch._inductor.config")
    given = inductor.cpp.cxx if inductor is not None else (None, os.environ.get("CXX", _DEFAULT_CXX))
    names = [c for c in (given if isinstance(given, (list, tuple)) else (given,)) if c]
    return names or [_DEFAULT_CXX]


_DEFAULT_CXX = "clang++" if sys.platform == "darwin" else "g++"
