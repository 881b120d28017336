"""An MDS dataset on the command line: ``--data s3://bucket/prefix`` (any remote the engine reads) or ``--data DIR``
holding an MDS ``index.json``, read by :func:`gpufeed.stream`.

What names a stream is decided here without importing the engine (seconds of imports): a URL whose scheme is one
of the engine's downloaders (:data:`SCHEMES`, checked against the installed engine by the tests), or a directory
with an ``index.json``. A local directory is local-only data (never evicted, no engine object) unless ``--local``
names a cache: then the directory is the remote, fetched into the cache as an object store would be.

The recipes are the image folders' (:mod:`gpufeed.data.images`) at ``--image-size``: ``RandomResizedCrop`` first for
training (all of it batched), ``Resize`` + ``CenterCrop`` for evaluation (run per sample as torchvision runs them,
the rest batched), the evaluation loader serving every sample (``drop_last=False``, in order).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torchvision.transforms as T

from ..errors import ConfigError, DataError
from ..mds.urls import SCHEMES, check_url, is_mds_dir, is_stream, is_url
from .images import folder_eval, folder_train

__all__ = ["SCHEMES", "StreamSource", "is_mds_dir", "is_stream", "is_url"]


@dataclass(frozen=True)
class StreamSource:
    """One MDS dataset of a run and how to read it: ``remote`` None is local-only data in ``local``; else fetched
    from ``remote`` into ``local`` (None: gpufeed's cache directory) under ``cache_limit`` bytes. Nothing is opened
    until :meth:`open` (under torchrun, after the process group exists)."""

    remote: str | None
    local: str | None
    cache_limit: int | None = None
    image_size: int = 224
    train: bool = True

    @classmethod
    def of(cls, data: str, local: str | None, cache_limit: int | None, image_size: int, train: bool) -> StreamSource:
        """``--data`` (or ``--val-data``) with ``--local`` and ``--cache-limit`` as the CLI reads them."""
        check_url(data)
        if is_url(data):
            return cls(data, local, cache_limit, image_size, train)
        path = str(Path(data).expanduser().resolve())
        if not is_mds_dir(path):
            raise DataError(f"{data}: no index.json, so not an MDS dataset; convert a folder with gpufeed convert")
        if local is None:
            if cache_limit is not None:
                raise ConfigError(
                    f"--cache-limit with the local MDS dataset {data}: its shards are the only copy and are never "
                    "evicted; drop --cache-limit, or add --local CACHE to read it as a remote fetched into CACHE"
                )
            return cls(None, path, None, image_size, train)
        if Path(local).expanduser().resolve() == Path(path):
            raise ConfigError(f"--local {local} is --data itself: drop --local to read the dataset where it is")
        return cls(path, str(Path(local).expanduser().resolve()), cache_limit, image_size, train)

    def describe(self) -> str:
        if self.remote is None:
            return f"MDS dataset {self.local} (local)"
        where = self.local or "gpufeed's cache directory"
        limit = f", cache limit {self.cache_limit:,} bytes" if self.cache_limit is not None else ""
        return f"MDS dataset {self.remote}, fetched into {where}{limit}"

    def samples(self) -> int | None:
        """The samples its ``index.json`` lists when it can be read without a download (a directory), else None."""
        where = self.local if self.remote is None else self.remote
        if where is None or is_url(where):
            return None
        try:
            index = json.loads((Path(where) / "index.json").read_text())
            return sum(int(shard["samples"]) for shard in index["shards"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{where}/index.json is not an MDS index ({type(e).__name__}: {e})") from None

    def transform(self) -> T.Compose:
        return folder_train(self.image_size) if self.train else folder_eval(self.image_size)

    def open(
        self,
        global_batch_size: int,
        *,
        device: Any = None,
        seed: int = 0,
        channels_last: bool = False,
        num_classes: int | None = None,
    ) -> Any:
        """The :class:`~gpufeed.loading.stream.StreamLoader` (shuffled, whole global batches for training; in order,
        every sample for evaluation); its ``shards.close()`` releases ``local``."""
        from ..pipeline.stream import stream

        return stream(
            self.remote,
            self.local,
            transform=self.transform(),
            global_batch_size=global_batch_size,
            shuffle=self.train,
            drop_last=self.train,  # evaluation: every sample, as the engine's iteration gives them
            seed=seed,
            device=device,
            channels_last=channels_last,
            num_classes=num_classes,
            cache_limit=self.cache_limit,
        )
