"""Where entries live: the cache root and an entry's directory under it (read at call time, never at import)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir", "entry_path"]


def default_cache_dir() -> Path:
    """``$GPUFEED_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpufeed``, else ``~/.cache/gpufeed`` (read at call time)."""
    if os.environ.get("GPUFEED_CACHE_DIR"):
        return Path(os.environ["GPUFEED_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gpufeed"


def entry_path(name: str, key: str, root: str | Path | None = None) -> Path:
    """Where the entry for ``key`` lives under ``root`` (default: :func:`default_cache_dir`); ``name`` (the
    source's kind, e.g. its class) makes the directory readable to a person listing the root."""
    return Path(root or default_cache_dir()).expanduser() / f"{name.lower()}-{key[:20]}"
