"""Which epoch and batch a loader serves next: the contract DeviceLoader and FallbackLoader share.

NOTE [ When an epoch is claimed ]
- ``iter(loader)`` only makes an iterator. The epoch is *claimed* when its first batch is taken:
  trainers such as Lightning call ``iter()`` once to check a loader and throw the iterator away,
  which must not cost an epoch.
- Claiming advances the loader to the next epoch, so a loop that never calls ``set_epoch`` still
  sees a new order each pass.
- An iterator dropped part-way (``break``, Lightning's ``limit_train_batches``) ends its epoch:
  ``state_dict()`` then says what the next iteration will serve (the next epoch), not where the
  abandoned one stopped.
- While an iteration is in progress (its iterator still referenced and not exhausted), a second
  one -- ``next(iter(loader))`` inside the loop to log a batch, ``zip(loader, loader)`` -- is a
  side pass: it serves the same epoch from its start, as a ``DataLoader`` whose sampler's epoch
  has not changed would, and moves no bookkeeping. Neither iteration loses a batch.
- ``set_epoch(e)`` serves epoch ``e`` next, from its start -- or from the position a loaded state
  holds for that same epoch, so a trainer that calls ``set_epoch`` on resume (Lightning does,
  through ``loader.sampler.set_epoch``) continues mid-epoch. ``set_epoch(e, batch=n)`` starts
  ``n`` batches in (what ``accelerator.skip_first_batches`` does for a ``DataLoader``).
  ``set_epoch`` and ``load_state_dict`` never cut an iteration short (a ``DataLoader``'s running
  iterator does not see its sampler's new epoch either): it is detached, serves the rest of its
  epoch, and ``state_dict()`` follows what was set.

A state saved on any rank resumes every rank of the same world size: the position (epoch, batch)
is the same on all of them, and the rank is not part of what fixes the sequence.

Under Hugging Face Accelerate (when an ``Accelerator`` exists in the process), the epoch iterator
registers with Accelerate's ``GradientState`` as its own loaders do, so ``gradient_state.
end_of_dataloader`` turns true on an epoch's last batch and gradient accumulation syncs there.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import ConfigError, DataError, StateError
from .sampling import derive_seed
from .validate import as_int

_MIX_STREAM = 0x4D4958  # "MIX": keeps the mixing draws apart from every other stream of the seed

__all__ = ["STATE_VERSION", "EpochLoader", "check_world", "resume_position"]

STATE_VERSION = 1


class _EpochControl:
    """``loader.sampler``: where trainers look for ``set_epoch`` (Lightning calls it every epoch). Made on
    each access, never stored: the loader stays free of reference cycles, picklable and deep-copyable."""

    def __init__(self, loader: EpochLoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class EpochLoader:
    """Epoch and position bookkeeping; subclasses set ``kind``, ``config``, ``_explicit_world`` and
    implement ``__len__`` (batches per epoch on this rank) and ``_batches(epoch, start)``."""

    kind: str
    config: Any  # loader._Config: what fixes the sequence of batches
    _explicit_world: bool  # rank and world_size were given, not read from the process group
    mix: Any = None  # batch-level MixUp / CutMix (gpufeed.augment.mix), applied to every batch served

    def _mixed(self, batch: Any, epoch: int, index: int) -> Any:
        """``batch`` mixed by ``mix``, with draws from (seed, epoch, rank, batch): a resumed epoch mixes alike."""
        if self.mix is None:
            return batch
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], torch.Tensor)):
            raise DataError(f"mix= needs (images, labels) batches; this loader yields {type(batch).__name__}")
        c = self.config
        rng = np.random.default_rng(derive_seed(c.seed, epoch, c.rank, index, _MIX_STREAM))
        x, y = self.mix(batch[0], batch[1], rng)
        return (x, y) if isinstance(batch, tuple) else [x, y]

    def _start_epochs(self) -> None:
        self._epoch, self._offset = 0, 0  # what the next claimed iteration serves
        # The claimed epoch's position, shared with its iterator, until the iterator is exhausted or dropped,
        # or set_epoch / load_state_dict detach it.
        self._live: _Position | None = None

    @property
    def sampler(self) -> _EpochControl:
        return _EpochControl(self)

    def __len__(self) -> int:
        raise NotImplementedError

    def _batches(self, epoch: int, start: int, side: bool = False) -> Iterator[Any]:
        """The batches of ``epoch`` from batch ``start`` on; ``side``: while another iteration runs."""
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the one the next iteration will serve."""
        live = self._live_position()
        return live.epoch if live is not None else self._epoch

    def set_epoch(self, epoch: int, batch: int | None = None) -> None:
        """Serve ``epoch`` on the next iteration (as ``DistributedSampler.set_epoch``); see NOTE [ When an
        epoch is claimed ] for ``batch`` and for a position loaded from a state."""
        epoch = as_int(epoch, "epoch", 0)
        if batch is not None:
            offset = as_int(batch, "batch", 0)
            if offset > len(self):
                raise ConfigError(f"batch={offset} is past the end of an epoch of {len(self)} batches")
        else:
            offset = self._offset if epoch == self._epoch else 0  # keep a position loaded for this epoch
        self._live = None  # a running iteration serves the rest of its epoch, detached
        self._epoch, self._offset = epoch, offset

    def __iter__(self) -> Iterator[Any]:
        return _Epoch(self)

    def _claim(self) -> tuple[_Position, bool]:
        """The position a new iteration serves, and whether it is a side pass (NOTE [ When an epoch is claimed ])."""
        check_world(self.config.world_size, self._explicit_world, type(self).__name__)
        live = self._live_position()
        if live is not None:
            return _Position(live.epoch, 0, done=True), True
        self._live = _Position(self._epoch, self._offset)
        self._epoch, self._offset = self._epoch + 1, 0
        return self._live, False

    def _live_position(self) -> _Position | None:
        return self._live if self._live is not None and not self._live.done else None

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: the epoch and the next batch within it, plus what fixes them."""
        from dataclasses import asdict

        live = self._live_position()
        epoch, batch = (live.epoch, live.next_batch) if live is not None else (self._epoch, self._offset)
        state = {"version": STATE_VERSION, "loader": self.kind, "epoch": epoch, "batch": batch, **asdict(self.config)}
        return {**state, **self._batch_forms()}

    def _batch_forms(self) -> dict[str, Any]:
        """What else fixes the batches served: the mixing and the number of views."""
        return {"mix": repr(self.mix) if self.mix is not None else None, "views": int(getattr(self, "views", 1))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (saved on any rank of the same world size): the next iteration yields
        exactly the batches the saved run had left."""
        from dataclasses import asdict

        epoch, offset = resume_position(state, self.kind, asdict(self.config), len(self))
        for key, mine in self._batch_forms().items():  # states saved before these were recorded have neither
            if key in state and state[key] != mine:
                raise StateError(
                    f"state: saved with {key}={state[key]!r}, but this loader has {key}={mine!r}; the resumed "
                    "batches would differ from the saved run's: build the loader as it was"
                )
        self._live = None  # as set_epoch: a running iteration is detached, not cut short
        self._epoch, self._offset = epoch, offset


@dataclass
class _Position:
    """Where a claimed epoch stands: the next batch it yields, and whether it no longer holds the loader's
    bookkeeping (exhausted, or its iterator dropped; a side pass never holds it)."""

    epoch: int
    next_batch: int
    done: bool = False


class _Epoch:
    """One epoch of an :class:`EpochLoader`, claimed at its first batch (NOTE [ When an epoch is claimed ])."""

    end_of_dataloader = False  # read (through _AccelerateView) by Accelerate's GradientState

    def __init__(self, loader: EpochLoader) -> None:
        self.loader, self.total = loader, len(loader)
        self.position: _Position | None = None
        self._source: Iterator[Any] | None = None
        self._accelerate: Any = None

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        if self.position is None:  # the first batch claims the epoch
            self.position, side = self.loader._claim()
            self._source = self.loader._batches(self.position.epoch, self.position.next_batch, side)
            self._accelerate = _gradient_state(self)
        p = self.position
        if p.next_batch >= self.total:
            p.done = True
            self._release()
            raise StopIteration
        batch = self.loader._mixed(next(self._source), p.epoch, p.next_batch)  # type: ignore[arg-type]
        p.next_batch += 1
        self.end_of_dataloader = p.next_batch >= self.total
        # At the end the position is the next epoch's start; Accelerate keeps this registered until exhausted.
        p.done = p.done or self.end_of_dataloader
        return batch

    def _release(self) -> None:
        self._source = None
        if self._accelerate is not None:
            (state, view), self._accelerate = self._accelerate, None
            state._remove_dataloader(view)

    def __del__(self) -> None:
        # Dropped part-way (``break``): the epoch is over for the bookkeeping, and Accelerate must not keep
        # it as its active loader.
        try:
            if self.position is not None:
                self.position.done = True
            self._release()
        except Exception:  # at interpreter shutdown there is nothing left to clean up
            pass


class _AccelerateView:
    """What Accelerate's GradientState holds while an epoch runs. It reads the iterator through a weak
    reference: a strong one would keep a dropped iterator alive, and with it its epoch."""

    remainder = -1  # gather_for_metrics: unknown padding, keep every gathered sample

    def __init__(self, it: _Epoch) -> None:
        self._it = weakref.ref(it)

    @property
    def end_of_dataloader(self) -> bool:
        it = self._it()
        return it is None or it.end_of_dataloader


def _gradient_state(it: _Epoch) -> tuple[Any, _AccelerateView] | None:
    """Accelerate's GradientState and the view of ``it`` registered as its active loader, if an Accelerator exists."""
    state_module = sys.modules.get("accelerate.state")  # never imported here: only if the user did
    if state_module is None:
        return None
    state = state_module.GradientState()
    if not state.initialized:
        return None
    view = _AccelerateView(it)
    state._add_dataloader(view)  # what Accelerate's own DataLoaderShard does when its iteration starts
    return state, view


def check_world(world_size: int, explicit: bool, what: str) -> None:
    """A loader sharded for one process, iterated in a process group of several: every rank would train on
    the whole dataset. Refused unless ``rank``/``world_size`` were given on purpose."""
    if explicit or world_size != 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ConfigError(
            f"this {what} was built before torch.distributed was initialised, so it holds the whole dataset for one "
            f"process, but it is iterated in a group of {dist.get_world_size()} processes: every rank would train on "
            "every sample. Build it after the process group exists (in Lightning's train_dataloader(), after "
            "Accelerator()), or pass rank= and world_size= (rank=0, world_size=1 to give every rank everything)"
        )


def resume_position(state: Any, loader: str, config: dict[str, Any], batches: int) -> tuple[int, int]:
    """``(epoch, batch)`` to continue from a saved ``state``; a StateError if it cannot be resumed here.

    ``loader`` ("device" or "fallback") and ``config`` (what fixes the sequence) must match what the
    state was saved with, type for type (``seed=123.0`` is not the seed 123), except the rank: the
    position is the same on every rank. ``batches`` is the number of batches in an epoch of this rank.
    """
    if not isinstance(state, dict):
        raise StateError(
            f"state is a {type(state).__name__}, not the dict loader.state_dict() returned; pass that dict "
            "(e.g. torch.load(...)['loader'])"
        )
    if state.get("version") != STATE_VERSION:
        raise StateError(f"state version={state.get('version')!r} is not {STATE_VERSION}; it is not a loader state")
    if state.get("loader", "device") != loader:
        raise StateError(
            f"state was saved by a {state.get('loader')} loader but this is a {loader} loader (the batched path and "
            "the per-sample fallback augment differently); rebuild the loader the way it was saved"
        )
    if state.get("world_size", 1) != config["world_size"]:
        raise StateError(
            f"state was saved with world_size={state.get('world_size')} but this run has "
            f"world_size={config['world_size']}: per-rank positions do not map onto another world size; "
            f"continue from the next epoch instead with loader.set_epoch({state.get('epoch', 0) + 1})"
        )
    for key, current in config.items():
        if key == "rank":
            continue  # any rank's state resumes every rank
        if type(state.get(key)) is not type(current) or state.get(key) != current:  # 123.0 is not the seed 123
            raise StateError(
                f"state has {key}={state.get(key)!r} but this loader has {key}={current!r}; "
                "resume needs the same data and configuration"
            )
    epoch, batch = state.get("epoch"), state.get("batch")
    if type(epoch) is not int or epoch < 0 or type(batch) is not int or not 0 <= batch <= batches:
        raise StateError(f"state has epoch={epoch!r}, batch={batch!r}; expected epoch >= 0 and 0 <= batch <= {batches}")
    return (epoch + 1, 0) if batch == batches else (epoch, batch)
