"""A remote's ``index.json`` and ``gpufeed.json``, fetched into ``local`` by gpufeed before the engine is made:
each wait bounded by ``download_timeout``, the index checked before anything reads a name in it.

NOTE [ A remote's index: fetched by gpufeed, checked, then the engine's ]
The engine downloads ``index.json`` in its constructor, ``download_retry`` attempts of the storage client's own
(botocore: 3 attempts, each a ``read_timeout`` of ``download_timeout``): a frozen remote held a construction 9 s
at ``download_timeout=1`` with ``download_retry=2``, and an outside trial's 25-30 s at 5. And it reads every
shard name in it as a path below ``local`` and below the remote's prefix: a crafted ``../x`` downloaded a file
outside ``local``. So gpufeed fetches the index first, on a thread of its own waited for at most
``download_timeout`` (:class:`FileFetch`; the client's retries go on in the background and their file is removed),
into a temporary name; parses it and checks every shard name to stay inside ``local``
(:meth:`gpufeed.mds.index.Index.paths`); and only then puts it in place, where the engine's constructor finds it
and downloads nothing. ``gpufeed.json`` is fetched at the same time, within the same wait: a remote that does not
answer fails in one ``download_timeout``. A cached ``index.json`` is compared with the remote's (a dataset
converted again since is refused); a remote that cannot be reached leaves the cached copy in use, with a
warning naming the remote and the cause.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ..errors import CacheWriteError, ConfigError, DataError, StorageError
from .downloads import is_missing, storage_cause
from .index import Index

__all__ = [
    "REMOTE_MARK",
    "FileFetch",
    "check_mark",
    "downloader",
    "fetch_index",
    "read_meta",
    "storage_error",
    "write_mark",
]

REMOTE_MARK = "gpufeed-remote.json"  # in a remote's local: which remote it caches


class FileFetch:
    """Files of the remote downloaded one after the other on a thread of their own, each into its temporary name
    (NOTE [ A remote's index: ... ]); the caller waits for each at most until a deadline.

    Example::

        fetch = FileFetch(downloader, [("s3://bucket/data/index.json", "/scratch/cache/.index.json.123.tmp")], 60)
        path = fetch.wait(0, time.monotonic() + 60)  # the file, the client's error, or TimeoutError
    """

    def __init__(self, downloader: Any, files: list[tuple[str, str]], timeout: float) -> None:
        self.files, self.timeout = files, timeout
        self.errors: list[BaseException | None] = [None] * len(files)
        self._done = [threading.Event() for _ in files]
        self._lock = threading.Lock()
        self._abandoned = False
        args = (downloader,)
        threading.Thread(target=self._run, args=args, name="gpufeed-stream-index", daemon=True).start()

    def _run(self, downloader: Any) -> None:
        for i, (url, tmp) in enumerate(self.files):
            if self._abandoned:
                break
            try:
                downloader.download(url, tmp, self.timeout)
            except BaseException as e:  # kept for wait()
                self.errors[i] = e
            with self._lock:
                self._done[i].set()
                if self._abandoned:  # no one waits for it any more: leave nothing behind
                    _unlink(tmp)
        try:
            downloader.clean_up()
        except Exception:  # its client's own tidying: nothing of gpufeed's depends on it
            pass

    def wait(self, i: int, deadline: float) -> str:
        """File ``i`` once downloaded; the client's error, or a TimeoutError at ``deadline`` (``time.monotonic()``)."""
        self._done[i].wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if not self._done[i].is_set():
                self._abandoned = True
                raise TimeoutError(f"no answer within download_timeout={self.timeout:g} s")
        error, tmp = self.errors[i], self.files[i][1]
        if error is not None:
            _unlink(tmp)
            raise error
        return tmp

    def abandon(self) -> None:
        """Not needed any more: the files not taken are removed (now, or when their download ends)."""
        with self._lock:
            self._abandoned = True
            for done, (_, tmp) in zip(self._done, self.files, strict=True):
                if done.is_set():
                    _unlink(tmp)


def downloader(remote: str, timeout: float) -> Any:
    """The engine's downloader of ``remote``'s scheme, its client made now (``botocore`` loads its models: up to a
    second the first time, on a loaded machine), before any wait for the network starts."""
    from streaming.base.storage.download import CloudDownloader

    made = CloudDownloader.get(remote)
    create = getattr(made, "_create_s3_client", None)  # S3's client is made lazily, at the first download
    if callable(create):
        try:
            create(timeout=timeout)
        except Exception:  # no credentials yet, an older engine: the download makes it as it always did
            pass
    return made


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def storage_error(
    remote: str, local: str, timeout: float, name: str, e: BaseException, span: tuple[int, int] | None = None
) -> StorageError:
    """The typed error of a file of ``remote`` that could not be fetched into ``local``: ``index.json`` or
    ``gpufeed.json`` (``span`` None: nothing was served yet), or a shard holding samples ``span``."""
    what, fix = storage_cause(e)
    where = f"{remote.rstrip('/')}/{name}"
    if span is None:
        subject = f"{name} of the MDS dataset {remote}"
        resume = "nothing was served yet: gf.stream again once it answers"
    else:
        subject = f"shard {name} (samples {span[0]:,}..{span[1]:,})"
        resume = (
            "the loader's state_dict() now holds the position of the batch that needed it: save it, and "
            "load_state_dict(state) on a new gf.stream (or on this loader) resumes there once the remote serves again"
        )
    return StorageError(
        f"{subject} could not be fetched from {where} into {local}: {what} ({type(e).__name__}: {e}; "
        f"download_retry attempts and the client's retries within download_timeout={timeout:g} s). "
        f"{fix[0].upper()}{fix[1:]}; {resume}"
    )


def check_mark(local: str, remote: str) -> None:
    """A ConfigError if ``local`` caches another remote than ``remote`` (its :data:`REMOTE_MARK`): the engine would
    keep that one's index and shards and serve them as ``remote``'s."""
    mark = Path(local, REMOTE_MARK)
    try:
        recorded = json.loads(mark.read_text()).get("remote")
    except FileNotFoundError:
        return  # a new local, or one filled before marks
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, str):  # written atomically (write_mark): damaged or not gpufeed's
        raise ConfigError(
            f"{mark} does not say which remote local={local} caches (it is not gpufeed's record of it): if local holds "
            f"{remote}'s shards, delete {mark} and run again; else give this one another local"
        )
    if recorded != remote:
        raise ConfigError(
            f"local={local} caches the dataset {recorded}, not {remote}: give this one a local of its own (or leave "
            "local out: gpufeed then picks one per remote), or empty it"
        )


def write_mark(local: str, remote: str) -> None:
    """Record in ``local`` that it caches ``remote`` (:func:`check_mark`): written to a temporary name and renamed, so
    that it is whole or absent, and never written through a link planted in its place."""
    tmp = os.path.join(local, f".{REMOTE_MARK}.{os.getpid()}.tmp")
    try:
        Path(tmp).write_text(json.dumps({"remote": remote}))
        os.replace(tmp, os.path.join(local, REMOTE_MARK))
    except OSError as e:
        _unlink(tmp)
        raise CacheWriteError(
            f"cannot write {os.path.join(local, REMOTE_MARK)} ({e.strerror or e}): local={local} is full or not "
            "writable; free space in it or give another local"
        ) from None


def _parse(data: bytes, source: str) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{source} is not JSON ({e}); it is not an MDS index") from None


def fetch_index(
    local: str, remote: str, timeout: float, image_key: str, label_key: str | None
) -> tuple[Index, dict[str, Any]]:
    """``remote``'s index (checked, then in ``local``) and its ``gpufeed.json`` (``{}`` for a user's own MDS), in
    one wait of at most ``timeout`` (NOTE [ A remote's index: fetched by gpufeed, checked, then the engine's ]).

    Raises:
        StorageError: the remote did not deliver the index (and ``local`` holds none), or its ``gpufeed.json``.
        DataError: the index is not one, or names a file outside ``local``.
        ConfigError: the index differs from the one ``local`` caches.
    """
    base, tag = remote.rstrip("/"), f"{os.getpid()}.{threading.get_ident()}"
    cached, meta_path = Path(local, "index.json"), Path(local, "gpufeed.json")
    files = [(f"{base}/index.json", os.path.join(local, f".index.json.{tag}.tmp"))]
    if not meta_path.exists():
        files.append((f"{base}/gpufeed.json", os.path.join(local, f".gpufeed.json.{tag}.tmp")))
    client = downloader(remote, timeout)
    deadline = time.monotonic() + timeout  # one wait for both files
    fetch = FileFetch(client, files, timeout)
    try:
        try:
            fresh: str | None = fetch.wait(0, deadline)
        except Exception as e:
            if not cached.exists():
                raise storage_error(remote, local, timeout, "index.json", e) from e
            fresh = None  # unreachable now (offline, no credentials): the cached copy is what there is, with a warning
            what, fix = storage_cause(e)
            warnings.warn(
                f"{base}/index.json could not be fetched ({what}: {type(e).__name__}: {e}): reading the copy cached "
                f"in {cached}, which may be older than the remote's; shards not cached fail when read. {fix[0].upper()}"
                f"{fix[1:]}",
                stacklevel=4,
            )
        if fresh is not None:
            data = Path(fresh).read_bytes()
            if cached.exists() and data != cached.read_bytes():
                raise ConfigError(
                    f"local={local} holds an index.json that differs from {remote}'s (the dataset was converted or "
                    "written again since it was cached): empty local (its shards are of the old version) or give "
                    "another, so that the new one is fetched"
                )
            Index(_parse(data, f"{base}/index.json"), f"{base}/index.json", image_key, label_key).paths(local)
            if not cached.exists():
                os.replace(fresh, cached)  # checked: the engine may read it now
        index = Index.load(cached, image_key, label_key)  # its names checked by the caller (Index.paths)
        if len(files) > 1:
            try:
                got = fetch.wait(1, deadline)
            except Exception as e:
                if is_missing(e):  # a user's own MDS (on S3 the client says 404, not FileNotFoundError)
                    return index, {}
                raise storage_error(remote, local, timeout, "gpufeed.json", e) from e
            os.replace(got, meta_path)
        return index, read_meta(local)
    finally:
        fetch.abandon()


def read_meta(local: str) -> dict[str, Any]:
    """``local``'s ``gpufeed.json`` (written by ``gpufeed convert``: classes, source, format, ...); ``{}`` when it
    has none (a user's own MDS)."""
    path = Path(local, "gpufeed.json")
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not JSON ({e}); rewrite it with gpufeed convert, or remove it") from None
    return meta if isinstance(meta, dict) else {}
