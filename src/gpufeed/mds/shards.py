"""MDS shards, local or remote: the index, where a sample lives, and its image bytes and label.

The engine fetches, gpufeed reads. A remote dataset (``s3://``, ``gs://``, a plain directory, ...) is fetched
into ``local`` by the engine's ``StreamingDataset.prepare_shard`` (its downloads, its per-node cache accounting
shared by the node's ranks, its LRU eviction under ``cache_limit``); local-only data (``local`` alone) needs no
engine object at all. Either way gpufeed reads the samples itself, with ``pread`` on the shard file (the layout:
``index.py``), keeping only the two columns it serves; ``prefetch.py`` fetches shards ahead of the reader.
A shard's download, bounded by ``download_timeout`` and typed, is :mod:`.downloads`'.

NOTE [ Checking each sample against its sha1 ]
``gpufeed convert`` writes each image's sha1 (hex) beside it, and a digest of the image and its label (NOTE [ What a
sample's digests cover ] in ``digests.py``). A sample is checked as it is read (on the reader's thread; ``hashlib``
releases the GIL for buffers over 2 KiB; the label costs one more 8-byte update of the same hash), so a shard
damaged on the remote, in transit or on the local disk is a DataError naming the sample, its key and shard before
any of its bytes is served -- even bytes that still decode, or a label that is another class. Cost:
benchmarks/RESULTS.md (issue 30). Only datasets written by ``gpufeed convert`` (its ``gpufeed.json``) with a
``sha1`` column in every shard are checked: a column of that name in a user's own MDS may mean something else, and
such data is served as it is (``gf.stream`` says so once, and in ``loader.plan``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cache.location import default_cache_dir
from ..errors import ConfigError, DataError, GpufeedError, StorageError
from ..validate import as_int
from . import engine, shm
from .digests import coverage, label_bytes
from .downloads import Downloads, storage_cause
from .index import Index
from .local import check_local, make_local
from .plan import DOWNLOADERS_PER_RANK, block_size_for_cache, engine_cache_limit
from .remote import check_mark, fetch_index, read_meta, storage_error, write_mark

__all__ = ["Samples", "Shards", "default_local", "storage_cause"]

# NOTE [ One engine object per remote and local in a process ]
# Each StreamingDataset keeps a dozen shared-memory descriptors and blocks after it is collected (measured: 12 fds, 6
# blocks per construction), so a loader rebuilt per epoch (an evaluation loader) ran the process out of files after
# about 80 epochs; and the engine refuses a second object on a local directory in use. So the first reader of a
# (remote, local) in a process makes the engine object and gpufeed's lock on the directory, and keeps them for the
# process's life: every later reader of the same pair uses them, and closing a reader only stops it. Another process
# on the same local is refused, as before, until this one ends.
_OPEN: dict[tuple[str, str], tuple[Any, shm.RunLock]] = {}
RETRIES = 7  # re-fetches of a shard evicted between its fetch and its read, as the engine's get_item
# seconds a read trusts the engine's last touch of a shard: LRU order at that grain is plenty (a shuffle block keeps
# a shard in use for seconds), and each touch takes the engine's cache lock
TOUCH_EVERY = 0.25


@dataclass(frozen=True)
class Samples:
    """What :meth:`Shards.read` returns: ``images[i]`` (a file's bytes) and ``labels[i]`` of sample ``ids[i]``."""

    ids: np.ndarray
    images: list[bytes]
    labels: np.ndarray


def _same(a: str, b: str) -> bool:
    return os.path.exists(b) and os.path.samefile(a, b)


def default_local(remote: str) -> str:
    """Where a remote's shards are cached when no ``local`` is given: under gpufeed's cache directory, by URL."""
    return str(default_cache_dir() / "stream" / hashlib.sha1(remote.encode()).hexdigest()[:20])


class Shards:
    """The samples of an MDS dataset by global id: local-only (``local`` alone) or fetched from ``remote`` into
    ``local``. Thread-safe; :meth:`close` (or ``with``) when done.

    Args:
        local: the dataset's directory (local-only), or where a remote's shards are cached (default: under gpufeed's
            cache directory). Every rank of a node must construct with the same ``local`` at about the same time
            (the engine's ranks of a node meet in shared memory). Under torchrun, construct it after
            ``torch.distributed.init_process_group``: else the engine starts and ends a process group of its own in
            each construction (two in a row raced in a test: "Gloo connectFullMesh failed", the other rank hung).
        remote: where the dataset lives (``s3://bucket/prefix``, ``gs://...``, a directory, ...); None: local-only.
        image_key, label_key: the columns holding an image file's bytes and the integer label (None: no labels).
        cache_limit: bytes (or ``"64gb"``) the node's ``local`` may hold; remote data only.
        ranks_per_node: ranks sharing ``local`` (default ``LOCAL_WORLD_SIZE``, else 1); sizes the download margin.
        download_retry: the engine's attempts at a download.
        download_timeout: the most seconds a read (or the prefetcher) waits for a shard, the engine's
            ``download_retry`` attempts and the storage client's own retries included (each attempt's socket reads
            time out after this too); past it a StorageError (NOTE [ A shard's download: bounded, typed, ... ]).
        validate_hash: passed to the engine (its check of a downloaded shard against the index's hashes).

    A sample of a dataset ``gpufeed convert`` wrote is checked against its stored sha1 as it is read (``verify``;
    NOTE [ Checking each sample against its sha1 ]). Another job on the same ``local`` is refused (NOTE [ One job
    per local directory ] in ``shm.py``); the ranks of one job share it.

    Example::

        with Shards(remote="s3://bucket/imagenet-mds", local="/scratch/imagenet") as shards:
            batch = shards.read(plan.batch(0))   # batch.images: JPEG bytes, batch.labels: int64
    """

    def __init__(
        self,
        local: str | os.PathLike[str] | None = None,
        remote: str | None = None,
        *,
        image_key: str = "image",
        label_key: str | None = "label",
        cache_limit: int | str | None = None,
        ranks_per_node: int | None = None,
        download_retry: int = 2,
        download_timeout: float = 60.0,
        validate_hash: str | None = None,
    ) -> None:
        if local is None and remote is None:
            raise ConfigError("Shards needs local= (a local MDS dataset) or remote= (and optionally local=)")
        as_int(download_retry, "download_retry", 1)
        timeout_ok = isinstance(download_timeout, (int, float)) and not isinstance(download_timeout, bool)
        if not timeout_ok or download_timeout <= 0:
            raise ConfigError(f"download_timeout={download_timeout!r} must be a number of seconds > 0")
        self.remote = None if remote is None else str(remote)
        if self.remote is not None and local is None:
            local = default_local(self.remote)
        self.local = os.path.abspath(os.fspath(local))  # type: ignore[arg-type]
        if self.remote is not None and os.path.isdir(self.remote) and _same(self.remote, self.local):
            raise ConfigError(f"remote and local are the same directory ({self.local}): pass local= alone")
        self.ranks_per_node = ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.closed = False
        self._shared = False  # the engine object is in _OPEN (opened, or reused)
        self._lock: shm.RunLock | None = None
        self._ds: Any = None
        self._offsets: dict[int, np.ndarray] = {}
        self._paths: list[str] = []  # each shard's file, checked to stay inside local (Index.paths)
        self._touched: dict[int, float] = {}
        self.download_timeout = float(download_timeout)
        self._downloads = Downloads(self.download_timeout)  # NOTE [ A shard's download: bounded, typed, ... ]
        self.cache_limit: int | None = None
        self.engine_cache_limit: int | None = None
        if self.remote is None:
            if cache_limit is not None:
                raise ConfigError(
                    f"cache_limit={cache_limit!r} with local-only data ({self.local}): its shards are the only copy "
                    "and are never evicted; leave cache_limit out, or pass remote=<the data> and local=<a cache>"
                )
            check_local(self.local, None)
            self.index = Index.load(os.path.join(self.local, "index.json"), image_key, label_key)
            self._paths = self.index.paths(self.local)
            self.index.check_hash(validate_hash)
            self.meta = read_meta(self.local)
        else:
            try:
                self._open_remote(cache_limit, download_retry, download_timeout, validate_hash, image_key, label_key)
            except BaseException:  # a wrong image_key, an unreachable gpufeed.json: a retry must find local free
                self.close()
                raise
        classes = self.meta.get("classes")
        self.classes: list[str] | None = list(classes) if isinstance(classes, list) else None
        # NOTE [ What a sample's digests cover ] in digests.py: what this dataset lets the reader check
        labelled = self.index.columns[0].label is not None
        where = self.remote or self.local
        self.coverage = coverage(self.meta, self.index.has_digests, self.index.has_sample_digests, labelled, where)
        # NOTE [ Checking each sample against its sha1 ]: True for gpufeed's conversions; set False to skip it
        self.verify = self.coverage.images
        self.verify_labels = self.coverage.labels

    def _open_remote(
        self,
        cache_limit: int | str | None,
        retry: int,
        timeout: float,
        validate_hash: str | None,
        image_key: str,
        label_key: str | None,
    ) -> None:
        remote = str(self.remote)
        make_local(self.local, remote)
        check_mark(self.local, remote)
        shared = _OPEN.get((remote, self.local))
        if shared is not None:  # NOTE [ One engine object per remote and local in a process ]
            self._ds, self._lock = shared
            self._shared = True
        else:  # NOTE [ One job per local directory ] in shm.py: the claim, in local itself
            self._lock = shm.hold(self.local, self.ranks_per_node)
        # NOTE [ A remote's index: fetched by gpufeed, checked, then the engine's ]
        self.index, self.meta = fetch_index(self.local, remote, timeout, image_key, label_key)
        self._paths = self.index.paths(self.local)
        self.index.check_hash(validate_hash)
        if shared is None:
            try:
                # never iterated: batch_size and num_canonical_nodes only satisfy the constructor; the index is in
                # local already, so it downloads nothing
                self._ds = engine.dataset(
                    remote=remote,
                    local=self.local,
                    download_retry=retry,
                    download_timeout=timeout,
                    validate_hash=validate_hash,
                    batch_size=1,
                    num_canonical_nodes=1,
                )
            except ValueError as e:
                if "Reused local directory" in str(e):
                    raise ConfigError(
                        f"local={self.local} is in use by another reader of this machine (gpufeed or a "
                        "StreamingDataset in another process, or a StreamingDataset of yours in this one): end it, or "
                        "give this one another local"
                    ) from e
                raise
            except (GpufeedError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # the engine could not set local up (botocore's, google's, ... errors)
                raise self._storage_error("index.json", e) from e
            for stream in getattr(self._ds, "streams", ()):  # clients made now, not inside a shard's first wait
                made = getattr(getattr(stream, "_downloader", None), "_create_s3_client", None)
                if callable(made):
                    try:
                        made(timeout=timeout)
                    except Exception:  # made at the first download instead, as the engine does
                        pass
        if cache_limit is not None:
            self._set_cache_limit(engine.bytes_to_int(cache_limit))
        if shared is None:
            _OPEN[(remote, self.local)] = (self._ds, self._lock)
            self._shared = True
            write_mark(self.local, remote)

    def _set_cache_limit(self, limit: int) -> None:
        biggest = int(self.index.max_bytes.max())
        index_bytes = os.path.getsize(os.path.join(self.local, "index.json"))
        given = engine_cache_limit(limit, biggest, self.ranks_per_node)
        # the engine's own floor (index + 4 largest shards), after gpufeed's margin
        floor = index_bytes + 4 * biggest
        if given < floor:
            self.close()
            need = floor + limit - given
            raise ConfigError(
                f"cache_limit={limit:,} bytes is too small for this dataset: its index takes {index_bytes:,} bytes, "
                f"its largest shard {biggest:,}, and {self.ranks_per_node} rank(s) download up to "
                f"{DOWNLOADERS_PER_RANK * self.ranks_per_node} shards at once; give at least {need:,} bytes"
            )
        self.cache_limit, self.engine_cache_limit = limit, given
        # read at each download (prepare_shard), so set after construction: the index is known only then
        self._ds.cache_limit = given

    def shuffle_block_size(self, num_canonical_nodes: int) -> int | None:
        """A shuffle block that fits the cache limit (``plan.block_size_for_cache``); None without a limit."""
        if self.engine_cache_limit is None:
            return None
        index_bytes = os.path.getsize(os.path.join(self.local, "index.json"))
        usable = self.engine_cache_limit - index_bytes
        return block_size_for_cache(
            self.index.samples_per_shard,
            int(self.index.max_bytes.max()),
            usable,
            num_canonical_nodes,
            reserved=int(self.cache_limit or 0) - usable,  # the warning speaks of the user's cache_limit
        )

    def prepare(self, shard: int) -> None:
        """Make ``shard`` local (download it, evicting the coldest under the limit) and mark it used; for
        local-only data, ask the kernel to read it ahead.

        Raises:
            StorageError: the remote did not deliver it within ``download_timeout`` (NOTE [ A shard's download:
                bounded, typed, ... ]); a later read of the shard raises it again, without waiting.
        """
        if self._ds is not None:
            self._fetch(int(shard), reader=False)
            return
        if hasattr(os, "posix_fadvise"):
            try:
                fd = os.open(self._paths[shard], os.O_RDONLY)
            except OSError:
                return  # read() names the missing or unreadable file
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def _open(self, shard: int) -> int:
        path = self._paths[shard]
        if self._ds is not None and time.monotonic() - self._touched.get(shard, -TOUCH_EVERY) < TOUCH_EVERY:
            try:  # fetched and touched a moment ago: skip the engine's lock (about 100 us a call)
                return self._open_file(shard)
            except FileNotFoundError:
                pass
        for _ in range(1 + RETRIES):
            if self._ds is not None:
                # also touches the shard in the engine's LRU: a shard being read is not the coldest
                if os.path.exists(path):
                    self._prepare_inline(shard)  # here already: a touch, no network
                else:
                    self._fetch(shard, reader=True)
                self._touched[shard] = time.monotonic()
            try:
                return self._open_file(shard)
            except FileNotFoundError:
                if self._ds is None:
                    zipped = (self.index.shards[shard].get("zip_data") or {}).get("basename")
                    fix = (
                        f"it is compressed ({zipped}): pass remote={self.local} and local=<a cache directory>"
                        if zipped and os.path.exists(os.path.join(self.local, zipped))
                        else "the dataset is incomplete: convert or copy it again"
                    )
                    raise DataError(
                        f"shard file {path} (listed in {self.index.source}) does not exist; {fix}"
                    ) from None
                # evicted by another rank between its fetch and this open: fetch again
        raise DataError(
            f"shard {path} was evicted {1 + RETRIES} times before it could be read: cache_limit={self.cache_limit} is "
            "too small for this many ranks and this shuffle block; raise it or lower shuffle_block_size"
        )

    def _open_file(self, shard: int) -> int:
        """Shard ``shard``'s file, open for reading: a FileNotFoundError as it is (the caller fetches it or names
        it), a DataError naming the shard when its path holds no readable file (a directory, a link loop)."""
        path = self._paths[shard]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise
        except OSError as e:
            why = e.strerror or str(e)
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
            why = "it is a directory, not a file" if os.path.isdir(path) else "it is not a regular file"
        fix = (
            f"end the run and delete it (the next run fetches the shard again from {self.remote})"
            if self.remote is not None
            else "the dataset is damaged: convert or copy it again"
        )
        raise DataError(f"shard file {path} (listed in {self.index.source}) cannot be read ({why}); {fix}")

    def _prepare_inline(self, shard: int) -> None:
        try:
            self._ds.prepare_shard(int(shard), blocking=True)
        except (GpufeedError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            raise self._fetch_error(shard, e) from e

    def _fetch(self, shard: int, *, reader: bool) -> None:
        """``shard`` local within ``download_timeout``, or its typed error (:meth:`Downloads.wait`)."""
        try:
            self._downloads.wait(self._ds, shard, reader=reader)
        except (GpufeedError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            raise self._fetch_error(shard, e) from e

    def _fetch_error(self, shard: int, e: BaseException) -> GpufeedError:
        """The typed error of a failed download of ``shard`` (the engine's raw one as its cause)."""
        if isinstance(e, GpufeedError):
            return e
        if isinstance(e, ValueError) and "Attempted shard eviction" in str(e):
            return ConfigError(
                f"shard {self.index.basenames[shard]} does not fit in local={self.local} under cache_limit="
                f"{self.cache_limit or 0:,} bytes: the engine found nothing of its own to evict ({e}). Another job "
                "on the same local (each keeps its own accounting) or files put there by hand fill it: give each job "
                "its own local, or raise cache_limit"
            )
        return self._storage_error(self.index.basenames[shard], e, shard)

    def _storage_error(self, name: str, e: BaseException, shard: int | None = None) -> StorageError:
        span = None if shard is None else (int(self.index.starts[shard]), int(self.index.ends[shard]) - 1)
        return storage_error(str(self.remote), self.local, self.download_timeout, name, e, span)

    def _read_shard(self, shard: int, positions: np.ndarray) -> list[tuple[bytes, int]]:
        fd = self._open(shard)
        try:  # an open file stays readable even if it is evicted now
            offsets = self._offsets.get(shard)
            count = int(self.index.samples_per_shard[shard])
            if offsets is None:
                head = os.pread(fd, 4 * (count + 2), 0)
                if len(head) < 4 * (count + 2) or int.from_bytes(head[:4], "little") != count:
                    name = self.index.basenames[shard]
                    raise DataError(f"shard {name} does not hold the {count} samples its index lists")
                offsets = np.frombuffer(head, dtype="<u4", offset=4).astype(np.int64)
                self._offsets[shard] = offsets
            out = []
            columns = self.index.columns[shard]
            for position in positions.tolist():
                begin, end = int(offsets[position]), int(offsets[position + 1])
                try:
                    record = os.pread(fd, end - begin, begin) if end >= begin else b""
                    if len(record) != end - begin:
                        raise ValueError(f"bytes {begin}..{end} are not in the file")
                    image, label, digest, stored = columns.parse(record)
                except (ValueError, struct.error, UnicodeDecodeError) as e:
                    sample = int(self.index.starts[shard]) + position
                    raise DataError(
                        f"sample {sample} (shard {self.index.basenames[shard]}, position {position}) is corrupt: {e}"
                    ) from None
                if self.verify and digest is not None:  # NOTE [ Checking each sample against its sha1 ]
                    h = hashlib.sha1(image)
                    actual = h.hexdigest()
                    if actual.encode() != digest:
                        raise self._mismatch(shard, position, record, digest, actual)
                    if self.verify_labels and stored is not None:  # NOTE [ What a sample's digests cover ]
                        h.update(label_bytes(label))
                        if h.hexdigest().encode() != stored:
                            raise self._mismatch(shard, position, record, stored, h.hexdigest(), label)
                out.append((image, label))
            return out
        finally:
            os.close(fd)

    def _mismatch(
        self, shard: int, position: int, record: bytes, digest: bytes, actual: str, label: int | None = None
    ) -> DataError:
        sample = int(self.index.starts[shard]) + position
        name = self.index.basenames[shard]
        key = self.index.columns[shard].key_of(record)
        fix = (
            f"the cached copy is damaged, or the remote's: end the run and delete {os.path.join(self.local, name)} "
            f"(the next run fetches it again from {self.remote}); if that fails the same way, convert the dataset "
            "again and upload it"
            if self.remote is not None
            else "copy the shard again from where the dataset came from, or convert the dataset again"
        )
        what = (
            "its image bytes do not match the sha1 gpufeed convert stored with them"
            if label is None
            else f"its label {label} does not match the digest gpufeed convert stored over its image and label (the "
            "image matches its own sha1: the label's bytes are damaged, and it would be learned as another class)"
        )
        return DataError(
            f"sample {sample} (key {key!r}, shard {name}, position {position}): {what} (stored "
            f"{digest.decode(errors='replace')[:12]}..., read {actual[:12]}...): the shard file "
            f"{self._paths[shard]} is corrupt, and the sample is not served. {fix[0].upper()}{fix[1:]}"
        )

    def read(self, ids: np.ndarray | Sequence[int]) -> Samples:
        """Image bytes and labels of global sample ids, in the order given (each shard opened once)."""
        if self.closed:
            raise ConfigError(f"these Shards of {self.local} are closed: open them again to read")
        ids = np.asarray(ids, dtype=np.int64)
        shard_of, position = self.index.locate(ids)
        images: list[bytes] = [b""] * len(ids)
        labels = np.empty(len(ids), dtype=np.int64)
        order = np.argsort(shard_of, kind="stable")
        bounds = np.flatnonzero(np.diff(shard_of[order])) + 1
        for group in np.split(order, bounds) if len(ids) else []:
            got = self._read_shard(int(shard_of[group[0]]), position[group])
            for slot, (image, label) in zip(group.tolist(), got, strict=True):
                images[slot], labels[slot] = image, label
        return Samples(ids, images, labels)

    def close(self) -> None:
        """Stop reading; idempotent. A remote's engine object stays for the next reader of the same remote and local
        in this process (NOTE [ One engine object per remote and local in a process ]); one that failed to open is
        dropped and ``local`` released."""
        self.closed = True
        shared, self._ds = self._shared, None
        if self._lock is not None and not shared:
            self._lock.release()
        self._lock = None

    def __enter__(self) -> Shards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
