"""Public exception types.

Every message names the argument (or sample), the offending value and the fix, e.g.
``ConfigError("batch_size=0 must be >= 1")``. Each type also derives from the builtin a
caller would catch without knowing gpufeed (``ValueError``, ``TypeError``, ``RuntimeError``).
"""

from __future__ import annotations

__all__ = [
    "CacheNotWrittenWarning",
    "CacheError",
    "CacheWriteError",
    "ConfigError",
    "DataError",
    "DeviceError",
    "GpufeedError",
    "NotADataLoaderError",
    "StateError",
    "StorageError",
    "UnsupportedTransformError",
    "WorkerError",
]


class GpufeedError(Exception):
    """Base class of every error gpufeed raises on purpose."""


class ConfigError(GpufeedError, ValueError):
    """An argument has a value gpufeed cannot use (``batch_size < 1``, ``padding < 0``, ...)."""


class DataError(GpufeedError, ValueError):
    """The data itself is unusable: wrong rank or dtype, NaN, labels out of range, empty."""


class DeviceError(GpufeedError, RuntimeError):
    """A device is unknown or not available on this machine, or tensors sit on different devices."""


class StateError(GpufeedError, RuntimeError):
    """A loader state cannot be restored (taken with another configuration, or loaded mid-epoch)."""


class StorageError(GpufeedError, RuntimeError):
    """A stream's remote did not deliver a shard (or its index): unreachable, silent past ``download_timeout``, or
    without the object (deleted, not uploaded). The message names the shard, the remote and what to do; the
    position of the batch that needed it stays in the loader's ``state_dict()``, so ``load_state_dict()`` resumes
    there once the remote serves again."""


class WorkerError(GpufeedError, RuntimeError):
    """A ``DataLoader`` worker of the per-sample fallback died (a signal such as the out-of-memory killer's
    SIGKILL, or an exit); the message names the worker, the position kept and how to continue."""


class NotADataLoaderError(GpufeedError, AttributeError):
    """A ``DataLoader`` attribute a gpufeed loader does not have, read by code written for ``DataLoader``
    (``accelerator.skip_first_batches`` reads ``dataset``); the message names gpufeed's way to do it. An
    ``AttributeError``, so ``hasattr`` and ``getattr(loader, name, default)`` still answer as before."""


class UnsupportedTransformError(ConfigError):
    """A transform gpufeed can neither cache nor run batched; the message lists what it supports."""


class CacheError(GpufeedError, RuntimeError):
    """A cache on disk is incomplete, corrupt or foreign; the message names the file and the remedy."""


class CacheWriteError(CacheError):
    """A cache could not be written (disk full, no permission, read-only location); nothing partial is left.

    The message names the path, the bytes needed and the remedy. :func:`gpufeed.accelerate` catches
    it and keeps the data in memory (with a warning); :func:`gpufeed.build_cache` raises it.
    """


class CacheNotWrittenWarning(UserWarning):
    """``accelerate`` kept the data in memory because its cache could not be written; ``error`` says why (the
    :class:`CacheWriteError` a caller that needs the entry, ``gpufeed cache build``, raises)."""

    def __init__(self, message: str, error: CacheWriteError) -> None:
        super().__init__(message)
        self.error = error
