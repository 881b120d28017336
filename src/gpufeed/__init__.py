"""gpufeed: keep a PyTorch GPU fed.

Example:
    >>> import torch, gpufeed as gf
    >>> from gpufeed import augment as A
    >>> images = torch.zeros(10, 3, 32, 32, dtype=torch.uint8)
    >>> loader = gf.DeviceLoader(images, torch.arange(10), batch_size=4, device="cpu",
    ...                          transform=A.Compose([A.RandomCrop(32, padding=4), A.RandomHorizontalFlip()]))
    >>> [tuple(x.shape) for x, _ in loader]
    [(4, 3, 32, 32), (4, 3, 32, 32), (2, 3, 32, 32)]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# `gf.diagnose` is the function, and gpufeed.diagnose also the module that defines it: the import system binds a
# submodule to its package's attribute once, when the submodule is first loaded. Imported here, before anything
# else can load that module, the function then takes the name for good, as every other module's import of
# gpufeed.diagnose finds it loaded. (It is cheap: what it imports is needed by the rest anyway.)
from .diagnose import Report, diagnose
from .errors import (
    CacheError,
    CacheWriteError,
    ConfigError,
    DataError,
    DeviceError,
    GpufeedError,
    NotADataLoaderError,
    StateError,
    StorageError,
    UnsupportedTransformError,
    WorkerError,
)
from .findings import Finding
from .version import __version__ as __version__

if TYPE_CHECKING:  # what the names below are, for type checkers and editors; at run time they load on first use
    from . import augment
    from .loading.fallback import FallbackLoader
    from .loading.loader import DeviceLoader
    from .loading.plan import Plan
    from .loading.prefetch import prefetch
    from .loading.stream import StreamLoader
    from .pipeline.accelerate import accelerate
    from .pipeline.build import build_cache
    from .pipeline.stream import stream
    from .store.entry import Cache, open_cache
    from .tune import LoaderConfig, tune_dataloader

# The rest of the public API, each name loaded from its module on first access (PEP 562): `import gpufeed` then
# costs little beyond `import torch` for a process that uses a part of it (the CLI, a rank, a watched script).
_LAZY = {
    "Cache": ".store.entry",
    "DeviceLoader": ".loading.loader",
    "FallbackLoader": ".loading.fallback",
    "LoaderConfig": ".tune",
    "Plan": ".loading.plan",
    "StreamLoader": ".loading.stream",
    "accelerate": ".pipeline.accelerate",
    "build_cache": ".pipeline.build",
    "open_cache": ".store.entry",
    "prefetch": ".loading.prefetch",
    "stream": ".pipeline.stream",
    "tune_dataloader": ".tune",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once: later accesses do not come here
        return value
    if not name.startswith("__"):
        # a submodule (gf.augment, gf.sampling, ...), as the eager imports used to leave bound; the import binds it
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Cache",
    "CacheError",
    "CacheWriteError",
    "ConfigError",
    "DataError",
    "DeviceError",
    "DeviceLoader",
    "FallbackLoader",
    "Finding",
    "GpufeedError",
    "LoaderConfig",
    "NotADataLoaderError",
    "Plan",
    "Report",
    "StateError",
    "StorageError",
    "StreamLoader",
    "UnsupportedTransformError",
    "WorkerError",
    "accelerate",
    "augment",
    "build_cache",
    "diagnose",
    "open_cache",
    "prefetch",
    "stream",
    "tune_dataloader",
]
