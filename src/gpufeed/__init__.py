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

from . import augment
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
    UnsupportedTransformError,
    WorkerError,
)
from .findings import Finding
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
from .version import __version__ as __version__

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
