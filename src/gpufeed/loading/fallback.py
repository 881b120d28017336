"""The slow path, taken only when asked: the original per-sample pipeline in DataLoader workers.

``accelerate(..., fallback="prefetch")`` returns a :class:`FallbackLoader` when the transform has
an op gpufeed cannot batch, or the images differ in size. It runs the user's dataset and
transform unchanged (no ingestion), and keeps gpufeed's contract:

- the order is :func:`gpufeed.sampling.epoch_order` of (seed, epoch), shared out to ranks by
  :func:`gpufeed.sampling.rank_indices` exactly as :class:`gpufeed.DeviceLoader` does (even or
  exactly-once), so the same ranks see the same samples under either loader;
- each sample's random transform runs with torch's, Python's and numpy's global generators seeded
  from (seed, epoch, index), and restored afterwards: a batch depends on nothing but those, not on
  the worker count or which worker ran it, so a state saved mid-epoch resumes bit for bit;
- workers are never forked from a process with CUDA state, and copies overlap compute through
  :func:`gpufeed.prefetch`;
- a worker that dies (SIGKILL from the out-of-memory killer, a crash) surfaces as a
  :class:`gpufeed.WorkerError` naming it; the iteration ends there as after a ``break`` (the state keeps
  the failed position), and the next iteration starts fresh workers. A persistent ``DataLoader`` left
  as it is would fail every later epoch: its one iterator keeps waiting for the dead worker.

NOTE [ Stopping the persistent workers ]
The persistent DataLoader's workers are stopped when the loader is collected, by a finalizer that holds the
DataLoader. Left to torch, a loader collected in a reference cycle (one that holds itself through a closure, a
trainer, a test's frame) stalled 5 s per worker: the garbage collector closes the index queues' feeder threads
with the rest of the cycle, before the iterator's ``__del__`` puts the sentinels that tell the workers to stop, so
each worker waits out its join timeout (measured: 10 s for 2 workers, plain torch DataLoaders too). Held by the
finalizer, the queues are alive when it runs, and the workers stop at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from ..augment.functional import convert_dtype
from ..augment.mix import as_mix
from ..errors import WorkerError
from ..options import BatchOptions
from ..read.samples import with_transform
from ..sampling import derive_seed, epoch_order, global_seed, rank_indices, seed_globals
from ..validate import Guarded, SampleFailure, as_workers, check_epoch
from ..workers import dead_workers, default_workers, loader_kwargs, stop_workers, workers_that_died
from .config import EpochConfig, distributed_rank
from .epochs import EpochLoader
from .identity import dataset_identity, describe
from .plan import Plan
from .prefetch import prefetch

__all__ = ["FallbackLoader"]


def _collate(items: list[Any]) -> Any:
    """torch's default collate, or the first sample's failure in the batch's place (raised in the parent)."""
    failed = next((item for item in items if isinstance(item, SampleFailure)), None)
    return failed if failed is not None else default_collate(items)


class _Held:
    """The persistent DataLoader, in a box its finalizer shares (NOTE [ Stopping the persistent workers ])."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def stop(self) -> None:
        stop_workers(getattr(self.loader, "_iterator", None))


class _Seeded(Dataset):
    """``dataset[i]`` for keys ``(epoch, i)``, with the global generators seeded from (seed, epoch, i).

    The caller's generator states are restored after each sample, so a fallback running in the
    main process (``num_workers=0``) leaves the user's global randomness as it found it.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, i = key
        seed = derive_seed(self.seed, epoch, i)
        if get_worker_info() is not None:  # a worker's generators are its own: seeded, with nothing to restore
            seed_globals(seed)
            return self.dataset[i]
        with global_seed(seed):
            return self.dataset[i]


class _Batches(Sampler[list[tuple[int, int]]]):
    """This rank's batches of one epoch, from batch ``start`` on, as lists of ``(epoch, index)`` keys."""

    def __init__(self, config: EpochConfig) -> None:
        self.config, self.epoch, self.start = config, 0, 0
        self.count = -(-self._indices(0).shape[0] // config.batch_size)

    def _indices(self, epoch: int) -> torch.Tensor:
        c = self.config
        order = epoch_order(c.seed, epoch, c.n, c.shuffle)
        return rank_indices(order, c.batch_size, c.rank, c.world_size, c.drop_last, c.even)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        # Computed now, not lazily: the DataLoader may read it later, after epoch and start moved on.
        epoch, bs = self.epoch, self.config.batch_size
        idx = self._indices(epoch).tolist()
        return iter([[(epoch, i) for i in idx[b * bs : (b + 1) * bs]] for b in range(self.start, self.count)])

    def __len__(self) -> int:
        return self.count


class FallbackLoader(EpochLoader):
    """Per-sample torchvision transforms in DataLoader workers, batches copied ahead to ``device``.

    Iterating again starts the next epoch; :meth:`set_epoch`, :meth:`state_dict` (mid-epoch too) and
    :meth:`load_state_dict` behave as :class:`gpufeed.DeviceLoader`'s.
    """

    def __init__(
        self,
        dataset: Any,
        transform: Any,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        device: torch.device,
        seed: int,
        *,
        dtype: torch.dtype | None,
        channels_last: bool,
        num_workers: int | None,
        reason: str,
        rank: int | None = None,
        world_size: int | None = None,
        even: bool | str = True,
        mix: Any = None,
    ) -> None:
        ds = Guarded(with_transform(dataset, transform), type(dataset).__name__)
        options = BatchOptions(batch_size, shuffle, drop_last, seed, dtype, channels_last, rank, world_size, even)
        rank, world_size = distributed_rank(rank, world_size)
        n = len(ds)
        self.config = EpochConfig(
            n, options.batch_size, options.shuffle, options.drop_last, options.seed, 1, rank, world_size, options.even
        )
        self.mix = as_mix(mix, None)
        self._sampler = _Batches(self.config)
        check_epoch(n, options.batch_size, options.drop_last, world_size, options.even)
        workers = default_workers() if num_workers is None else as_workers(num_workers)  # capped, as accelerate's
        self._seeded, self._workers, self._pin = _Seeded(ds, options.seed), workers, device.type == "cuda"
        self._held = _Held(self._data_loader(self._sampler, persistent=True))
        weakref.finalize(self, self._held.stop)  # NOTE [ Stopping the persistent workers ]
        self._shared_in_use = False  # the persistent loader's one iterator is serving an iteration
        self.device, self.dtype, self.channels_last = device, options.dtype, options.channels_last
        # What a state belongs to (NOTE [ What a state belongs to ] in gpufeed.loading.identity): no sample is read
        # for it (each costs a decode and a transform), only what the dataset holds per sample (files, arrays, ...).
        self._identity = {**dataset_identity(dataset), "transform": describe(transform)}
        self._explicit_world = options.explicit_world
        self._start_epochs()
        self.plan = Plan(
            cached=(),
            batched=(),
            storage="fallback",
            stored_shape=(),
            stored_dtype="-",
            bytes=0,
            ingest="none",
            notes=(reason,),
            device=str(device),
            workers=workers,
        )

    kind = "fallback"

    @property
    def loader(self) -> DataLoader:
        """The persistent DataLoader (replaced, with fresh workers, after a worker died)."""
        return self._held.loader

    @loader.setter
    def loader(self, loader: DataLoader) -> None:
        self._held.loader = loader

    def __len__(self) -> int:
        return len(self._sampler)

    def _fingerprint(self) -> dict[str, Any]:
        """The dataset and the per-sample pipeline a state of this loader belongs to."""
        return {**self._identity, "dtype": str(self.dtype), "channels_last": self.channels_last}

    def _data_loader(self, sampler: _Batches, persistent: bool) -> DataLoader:
        return DataLoader(
            self._seeded,
            batch_sampler=sampler,
            pin_memory=self._pin,
            collate_fn=_collate,
            **loader_kwargs(self._workers, persistent=persistent, prefetch_factor=4 if self._workers else None),
        )

    def _batches(self, epoch: int, start: int, side: bool = False) -> Iterator[Any]:
        # A persistent DataLoader has one iterator: a second iteration at once (a side pass, or one detached by
        # set_epoch) would reset it under the first. It gets a DataLoader of its own, its workers for that pass.
        if self._shared_in_use:
            sampler = _Batches(self.config)
            sampler.epoch, sampler.start = epoch, start
            return self._serve(self._data_loader(sampler, persistent=False), False, epoch, start, side)
        self._replace_dead_workers()  # one died in an earlier iteration (its error maybe raised outside it)
        self._sampler.epoch, self._sampler.start = epoch, start
        return self._serve(self.loader, True, epoch, start, side)

    def _replace_dead_workers(self) -> None:
        """A new persistent DataLoader (its workers start on first use) if a worker of the current one died:
        resetting its iterator would wait for the dead worker and fail every epoch from then on."""
        iterator = getattr(self.loader, "_iterator", None)  # where torch keeps a persistent DataLoader's iterator
        if iterator is not None and dead_workers(iterator):
            stop_workers(iterator)
            self.loader = self._data_loader(self._sampler, persistent=True)

    def _serve(self, loader: DataLoader, shared: bool, epoch: int, start: int, side: bool = False) -> Iterator[Any]:
        self._shared_in_use = self._shared_in_use or shared
        served, source = start, None
        try:
            source = iter(loader)
            for batch in prefetch(source, self.device):
                yield self._finish(batch)
                served += 1
        except Exception as e:
            dead = workers_that_died(source, e)
            if not dead:
                raise
            stop_workers(source)  # the others too: torch's own error would otherwise repeat on every later epoch
            if shared:
                self.loader = self._data_loader(self._sampler, persistent=True)
            if not side:
                after = (
                    f"the next iteration starts fresh ones and serves epoch {epoch + 1}, as after a break. "
                    f"loader.state_dict() keeps epoch {epoch} at batch {served}, and loader.set_epoch({epoch}, "
                    f"batch={served}) continues it in this process"
                )
            else:  # NOTE [ When an epoch is claimed ]: a side pass holds none of the loader's position
                after = "this iteration was a side pass and held none of the loader's position, which is unchanged"
            raise WorkerError(
                f"a DataLoader worker of the per-sample fallback died during epoch {epoch}, after {served} of its "
                f"{len(self)} batches were served: worker {'; worker '.join(dead)}. gpufeed stopped the other "
                f"workers; {after}. A SIGKILL is usually the out-of-memory killer: give the job more host memory "
                "or pass fewer workers (num_workers=)"
            ) from e
        finally:  # exhausted, failed, or the generator closed when its iteration was dropped
            if shared:
                self._shared_in_use = False

    def _finish(self, batch: Any) -> Any:
        """The batch as the DataLoader collated it; an ``(images, labels)`` pair gets ``dtype``/``channels_last``."""
        if isinstance(batch, SampleFailure):
            raise batch.exception()
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], torch.Tensor)):
            return batch  # a dict, a triple, ...: exactly what the DataLoader yields
        x, y = batch
        if self.dtype is not None:
            x = convert_dtype(x, self.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x, y) if isinstance(batch, tuple) else [x, y]
