"""A shard's download, bounded and typed: what :class:`~gpufeed.mds.shards.Shards` waits for when a shard is not local.

NOTE [ A shard's download: bounded, typed, raised where it is needed ]
The engine downloads in ``prepare_shard``: its ``download_retry`` attempts, each the storage client's own retries
(botocore: 3 attempts of a ``read_timeout`` of ``download_timeout`` each), so a silent remote held a read for
``download_retry x 3 x download_timeout`` and more (outside trials: 30 s, once 150 s, with ``download_timeout=10``),
and its errors came out raw (botocore's ``EndpointConnectionError``, ``ClientError``). So gpufeed runs each
download on a thread of its own (:meth:`Shards._fetch`) and waits for it at most ``download_timeout``: that is the
whole wait of a read (or of the prefetcher) for a shard, the engine's attempts and the client's retries inside it.
Past it, or on the engine's error, a :class:`~gpufeed.errors.StorageError` names the shard, the remote, the cause
and the fix (a download still running goes on in the background and serves a later read). One download per shard
at a time in a process: the prefetcher and the reader wait on the same one, and a failure of the prefetcher's is
kept until the reader needs that shard, which raises it without a second wait -- in the batch that needed the shard,
so the loader's ``state_dict()`` holds that batch's position and ``load_state_dict()`` resumes there. A shard
whose file is in ``local`` is touched inline (no thread: no network); one evicted by another rank between that
check and the touch is downloaded by the touch, the one wait that only the engine's own timeouts bound.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["Downloads", "is_missing", "storage_cause"]


class _Fetch:
    """One download of a shard in progress or ended (NOTE [ A shard's download: bounded, typed, ... ])."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.timed_out = False  # the prefetcher's wait ran out: the read that needs the shard raises it at once


def is_missing(e: BaseException) -> bool:
    """The remote answered that the object is not there (a deleted shard; a dataset without ``gpufeed.json``)."""
    if isinstance(e, FileNotFoundError):
        return True
    response = getattr(e, "response", None)  # botocore's ClientError
    code = str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""
    names = {c.__name__ for c in type(e).__mro__}
    return code in ("404", "NoSuchKey", "NotFound") or bool(names & {"NotFound", "ResourceNotFoundError"})


def storage_cause(e: BaseException) -> tuple[str, str]:
    """What went wrong with a download, and what to do, from the storage client's exception (any engine downloader:
    matched by the exception's names, not by importing each client).

    Example:
        >>> storage_cause(FileNotFoundError("shard.00003.mds"))[0]
        'the remote has no such object'
    """
    names = " ".join(c.__name__ for c in type(e).__mro__)
    response = getattr(e, "response", None)
    code = str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""
    if is_missing(e):
        return "the remote has no such object", (
            "it was deleted or never uploaded, or the dataset there was rewritten: upload the shard again (or "
            "convert and upload the dataset again, then give a fresh local)"
        )
    if code in ("403", "AccessDenied", "AllAccessDisabled") or "Forbidden" in names or "PermissionError" in names:
        return "the remote refused access", "check the credentials and the bucket's policy (or requester-pays setting)"
    if "Timeout" in names or "timed out" in str(e):
        return "the remote did not answer in time", "check the remote and the network, or raise download_timeout"
    if "Connection" in names or "Endpoint" in names or isinstance(e, (ConnectionError, OSError)):
        return "the remote could not be reached", (
            "check the network, the endpoint (S3_ENDPOINT_URL for another S3 endpoint) and that the store is up"
        )
    return "the download failed", "check the remote, its credentials and the network"


class Downloads:
    """The downloads of one reader's shards: one thread per shard at a time, each wait at most ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._fetches: dict[int, _Fetch] = {}
        self._lock = threading.Lock()

    def wait(self, ds: Any, shard: int, *, reader: bool) -> None:
        """Wait at most ``timeout`` for ``shard`` to be local, downloading it with ``ds.prepare_shard`` on a thread
        unless a download of it is under way in this process (NOTE [ A shard's download: bounded, typed, ... ]).
        ``reader``: the caller is the read that needs the shard, which takes a failed download's error over (the
        next wait is a new try); the prefetcher's leaves it for that read. Raises the download's own error, or a
        TimeoutError (the caller types them)."""
        with self._lock:
            fetch = self._fetches.get(shard)
            if fetch is not None and reader and fetch.timed_out and not fetch.done.is_set():
                fetch.timed_out = False  # this read reports the prefetcher's timeout; a later one waits again
                raise self._timeout()
            if fetch is None:
                fetch = self._fetches[shard] = _Fetch()
                thread = threading.Thread(
                    target=self._download, args=(ds, shard, fetch), name="gpufeed-stream-fetch", daemon=True
                )
                thread.start()
        finished = fetch.done.wait(self.timeout)
        if finished and fetch.error is None:
            return
        if not finished and not reader:
            fetch.timed_out = True
        if finished and reader:
            with self._lock:
                if self._fetches.get(shard) is fetch:
                    del self._fetches[shard]
        error = fetch.error if finished else self._timeout()
        assert error is not None
        raise error

    def _timeout(self) -> TimeoutError:
        return TimeoutError(f"no shard within {self.timeout:g} s")

    def _download(self, ds: Any, shard: int, fetch: _Fetch) -> None:
        try:
            ds.prepare_shard(int(shard), blocking=True)
        except BaseException as e:  # kept for the read that needs the shard (_fetch)
            fetch.error = e
        else:
            with self._lock:
                if self._fetches.get(shard) is fetch:
                    del self._fetches[shard]
        finally:
            fetch.done.set()
