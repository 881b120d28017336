"""Which epoch and batch a loader serves next: the contract DeviceLoader and FallbackLoader share.

NOTE [ When an epoch is claimed ]
- ``iter(loader)`` only makes an iterator. The epoch is *claimed* when its first batch is taken:
  trainers such as Lightning call ``iter()`` once to check a loader and throw the iterator away,
  which must not cost an epoch.
- Claiming advances the loader to the next epoch, so a loop that never calls ``set_epoch`` still
  sees a new order each pass.
- An iteration interrupted part-way -- its iterator dropped (``break``, Lightning's
  ``limit_train_batches``) or an exception raised through it (a dead worker) -- ends its epoch in
  this process: a new ``for`` on the same loader serves the next epoch. But the position where it
  stopped is remembered: ``state_dict()`` records (that epoch, the batches served), so a fresh loader
  that loads it finishes the epoch first (the preemption pattern: a SIGTERM handler sets a flag, the
  loop breaks, the state is saved, the job exits; as torchdata's ``StatefulDataLoader``). A new
  iteration, ``set_epoch`` or ``load_state_dict`` forgets it; a trainer that shortened the epoch on
  purpose resumes with ``set_epoch(e + 1)`` (Lightning does), which starts the next epoch.
  ``set_epoch(e, batch=n)`` (or ``load_state_dict(loader.state_dict())``) continues the interrupted
  epoch in the same process.
- ``loader.epoch`` is the epoch being iterated up to and including its last batch, then the next one.
  An epoch whose batches have all been handed out holds nothing more: a new iteration started then
  (its iterator not yet exhausted) claims the next epoch, not a side pass.
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

import contextlib
import os
import sys
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ConfigError, DataError, NotADataLoaderError, StateError
from ..sampling import derive_seed, gather_remainder, real_counts
from ..threads import ThreadChoice
from ..validate import MAX_EPOCH, as_epoch, as_flag, as_int
from .config import EpochConfig
from .identity import differences

if TYPE_CHECKING:
    from ..read.wrappers import SourceWatch

_MIX_STREAM = 0x4D4958  # "MIX": keeps the mixing draws apart from every other stream of the seed

__all__ = [
    "STATE_VERSION",
    "EpochLoader",
    "check_explicit_world",
    "check_world",
    "resume_position",
]

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
    config: EpochConfig  # what fixes the sequence of batches
    _explicit_world: bool  # rank and world_size were given, not read from the process group
    mix: Any = None  # batch-level MixUp / CutMix (gpufeed.augment.mix), applied to every batch served
    # load_state_dict's default for strict= (NOTE [ What a state belongs to ] in gpufeed.loading.identity): a trainer
    # calls load_state_dict(state) itself, so this is where its user says that a changed transform is on purpose.
    strict_state: bool = True
    _stopped: tuple[int, int] | None = None  # (epoch, batches served) of an interrupted epoch, until a new claim
    # set at construction by accelerate(): the dataset was read once; a transform or labels replaced since are refused
    source_watch: SourceWatch | None = None
    # False: batches are the images alone (a Hugging Face dataset read with label_key=None); labels are not served
    labelled: bool = True
    # accelerate(batch_keys=...): each batch as a dict under these keys (a Hugging Face loop's batch["pixel_values"])
    batch_keys: tuple[str, ...] | None = None

    def _mixed(self, batch: Any, epoch: int, index: int) -> Any:
        """``batch`` mixed by ``mix``, with draws from (seed, epoch, rank, batch): a resumed epoch mixes alike."""
        if self.mix is None:
            return batch
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], torch.Tensor)):
            raise DataError(f"mix= needs (images, labels) batches; this loader yields {type(batch).__name__}")
        c = self.config
        rng = np.random.default_rng(derive_seed(c.seed, epoch, c.rank, index, _MIX_STREAM))
        # torch's threads as chosen for the loader's own ops (NOTE [ Torch's threads on a busy machine ])
        threads: ThreadChoice | None = getattr(self, "_threads", None)  # the loader's, where it has one
        with threads.step(len(batch[0]), timed=False) if threads else contextlib.nullcontext():
            x, y = self.mix(batch[0], batch[1], rng)
        return (x, y) if isinstance(batch, tuple) else [x, y]

    def _start_epochs(self) -> None:
        self._epoch, self._offset = 0, 0  # what the next claimed iteration serves
        # The claimed epoch's position, shared with its iterator, until the iterator is exhausted or dropped,
        # or set_epoch / load_state_dict detach it.
        self._live: _Position | None = None
        self._stopped = None
        self._built_pid = os.getpid()  # a loader iterated in another process was copied there (ddp_spawn)

    @property
    def sampler(self) -> _EpochControl:
        return _EpochControl(self)

    # Lightning reads ``batch_sampler`` of every evaluation loader (to warn about shuffling); None: batches
    # come from the loader itself, as a DataLoader built with batch_size=None says.
    batch_sampler = None

    @property
    def real_counts(self) -> tuple[int, ...]:
        """Per batch of the iteration in progress (or of the next one), counted from its first batch as
        ``enumerate(loader)`` counts: how many of the batch's first samples are real, the rest repeats that pad
        the epoch (``even=True`` or ``"pad"``); see :func:`gpufeed.sampling.real_counts`. An iteration resumed
        part-way (a loaded state, ``set_epoch(e, batch=n)``) begins at its own batch, so index 0 is that one."""
        c = self.config
        counts = real_counts(c.n, c.batch_size, c.rank, c.world_size, c.drop_last, c.even, c.shard)
        live = self._live
        return counts[live.start if live is not None and not live.done else self._offset :]

    def __len__(self) -> int:
        raise NotImplementedError

    def _batches(self, epoch: int, start: int, side: bool = False) -> Iterator[Any]:
        """The batches of ``epoch`` from batch ``start`` on; ``side``: while another iteration runs."""
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch being iterated (up to and including its last batch), or the one the next iteration serves."""
        live = self._live
        return live.epoch if live is not None and not live.done else self._epoch

    def set_epoch(self, epoch: int, batch: int | None = None) -> None:
        """Serve ``epoch`` on the next iteration (as ``DistributedSampler.set_epoch``); see NOTE [ When an
        epoch is claimed ] for ``batch`` and for a position loaded from a state."""
        epoch = as_epoch(epoch)
        if batch is not None:
            offset = as_int(batch, "batch", 0)
            if offset > len(self):
                raise ConfigError(f"batch={offset} is past the end of an epoch of {len(self)} batches")
        else:
            offset = self._offset if epoch == self._epoch else 0  # keep a position loaded for this epoch
        self._live, self._stopped = None, None  # a running iteration serves the rest of its epoch, detached
        self._epoch, self._offset = epoch, offset

    def __iter__(self) -> Iterator[Any]:
        return _Epoch(self)

    def _claim(self) -> tuple[_Position, bool]:
        """The position a new iteration serves, and whether it is a side pass (NOTE [ When an epoch is claimed ])."""
        check_world(self.config.world_size, self._explicit_world, type(self).__name__)
        check_explicit_world(self.config, self._explicit_world, self._built_pid, type(self).__name__)
        if self.source_watch is not None:
            self.source_watch.check()
        live = self._live_position()
        if live is not None:
            return _Position(live.epoch, 0, done=True), True
        self._stopped = None
        self._live = _Position(self._epoch, self._offset, start=self._offset)
        self._epoch, self._offset = self._epoch + 1, 0
        return self._live, False

    def _live_position(self) -> _Position | None:
        """The claimed epoch, while it still has batches to hand out."""
        live = self._live
        return live if live is not None and not live.done and live.next_batch < len(self) else None

    def _interrupted(self, position: _Position) -> None:
        """``position``'s iteration was dropped or failed part-way: remember where, for ``state_dict``."""
        if self._live is position and position.next_batch < len(self):
            self._stopped = (position.epoch, position.next_batch)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: the epoch and the next batch within it, plus what fixes them."""
        from dataclasses import asdict

        epoch, batch = self._saved_position()
        state = {"version": STATE_VERSION, "loader": self.kind, "epoch": epoch, "batch": batch, **asdict(self.config)}
        from ..version import __version__

        return {**state, **self._batch_forms(), "fingerprint": {**self._fingerprint(), "gpufeed": __version__}}

    def _saved_position(self) -> tuple[int, int]:
        """``(epoch, next batch)`` a state records: the running epoch's, an interrupted one's, or the next one's."""
        live = self._live_position()
        if live is not None:
            return live.epoch, live.next_batch
        if self._stopped is not None:  # NOTE [ When an epoch is claimed ]: an interrupted epoch resumes there
            return self._stopped
        return self._epoch, self._offset

    def _batch_forms(self) -> dict[str, Any]:
        """What else fixes the batches served: the mixing and the number of views."""
        return {"mix": repr(self.mix) if self.mix is not None else None, "views": int(getattr(self, "views", 1))}

    def _fingerprint(self) -> dict[str, Any]:
        """What the batches are made of and how, as ``gpufeed.loading.identity`` describes them (subclasses fill it)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], strict: bool | None = None) -> None:
        """Continue from ``state`` (saved on any rank of the same world size): the next iteration yields
        exactly the batches the saved run had left.

        A state of other data or another pipeline is refused, naming what differs (NOTE [ What a state
        belongs to ] in :mod:`gpufeed.loading.identity`); ``strict=False`` (default: ``loader.strict_state``) loads
        its position anyway, for a pipeline changed on purpose. The order's configuration must always match.
        """
        from dataclasses import asdict

        check_state(state, self.kind)
        strict = self.strict_state if strict is None else as_flag(strict, "strict")
        from ..version import __version__

        saved = dict(state["fingerprint"]) if isinstance(state.get("fingerprint"), dict) else {}
        mine = self._fingerprint()
        if saved.pop("gpufeed", __version__) != __version__ and saved.get("transform") != mine.get("transform"):
            # Another gpufeed release may describe the same ops otherwise (a new field in an op's repr): the data
            # keys still guard the state, the transform's description is only reported.
            warnings.warn(
                f"state: saved by gpufeed {state['fingerprint'].get('gpufeed')} (this is {__version__}) with "
                f"transform={saved.pop('transform')!r}; this loader has transform={mine['transform']!r}: check that "
                "it is the same pipeline",
                stacklevel=2,
            )
        # States saved before these were recorded have none of them; each key is compared where both have it.
        found = differences(state, self._batch_forms()) + differences(saved, mine)
        if strict and found:
            raise StateError(
                f"state: {'; '.join(found)}. It belongs to other data or another pipeline, and the resumed batches "
                "would differ from the saved run's: build the loader as it was (images and pixels: the dataset and "
                "the cached part of its transform; dataset and samples, for the per-sample fallback: the dataset's "
                "files, arrays, labels and a Subset's or random_split's indices; transform, dtype, channels_last: "
                "the batched part). If you "
                "changed it on purpose, load the position anyway with loader.load_state_dict(state, strict=False), "
                "or set loader.strict_state = False before a trainer (Lightning, Accelerate) loads it"
            )
        # after the data's check: a configuration that differs because the data does (its length) names the data
        epoch, offset = resume_position(state, self.kind, asdict(self.config), len(self))
        self._live, self._stopped = None, None  # as set_epoch: a running iteration is detached, not cut short
        self._epoch, self._offset = epoch, offset

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes the loader lacks. Code written for a DataLoader reads these; a typed error
        # names gpufeed's way (still an AttributeError, so hasattr() and getattr(loader, name, default) work).
        if name == "dataset":  # accelerator.skip_first_batches(loader, n) reads it first, to rebuild a DataLoader
            raise NotADataLoaderError(
                f"{type(self).__name__} has no .dataset: it is not a torch DataLoader, so Accelerate's "
                "skip_first_batches cannot rebuild it. To skip the first n batches of an epoch, call "
                "loader.set_epoch(epoch, batch=n) and iterate the loader itself (a state loaded with "
                "load_state_dict, e.g. by accelerator.load_state, already resumes mid-epoch)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass
class _Position:
    """Where a claimed epoch stands: the next batch it yields, and whether it no longer holds the loader's
    bookkeeping (exhausted, its iterator dropped or failed; a side pass never holds it)."""

    epoch: int
    next_batch: int
    done: bool = False
    start: int = 0  # the batch the iteration began at (a resumed epoch begins part-way)


def _as_dict(batch: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``batch`` (images, or a tuple of parts) as ``{key: part}``, the keys in order."""
    parts = (batch,) if len(keys) == 1 else tuple(batch)
    if len(parts) != len(keys):
        raise DataError(f"batch_keys={keys} names {len(keys)} parts; the batches have {len(parts)}")
    return dict(zip(keys, parts, strict=True))


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
        if self._source is None or p.next_batch >= self.total:  # exhausted, or failed before (as a generator)
            p.done = True
            self._release()
            raise StopIteration
        try:
            batch = self.loader._mixed(next(self._source), p.epoch, p.next_batch)
            if not self.loader.labelled:
                batch = batch[0]
            if self.loader.batch_keys is not None:
                batch = _as_dict(batch, self.loader.batch_keys)
        except BaseException:  # a dead worker, a sample that raised, Ctrl-C: this iteration is over
            self._stop()
            raise
        p.next_batch += 1
        # Still this epoch's (loader.epoch reads it) until exhausted; Accelerate keeps it registered until then.
        self.end_of_dataloader = p.next_batch >= self.total
        return batch

    def _stop(self) -> None:
        """Dropped or failed part-way: the loader remembers where (NOTE [ When an epoch is claimed ])."""
        p = self.position
        if p is not None and not p.done:
            p.done = True
            self.loader._interrupted(p)
        self._release()

    def _release(self) -> None:
        self._source = None
        if self._accelerate is not None:
            (state, view), self._accelerate = self._accelerate, None
            state._remove_dataloader(view)

    def __del__(self) -> None:
        # Dropped part-way (``break``): the epoch is over for the bookkeeping, and Accelerate must not keep
        # it as its active loader.
        try:
            self._stop()
        except Exception:  # at interpreter shutdown there is nothing left to clean up
            pass


class _AccelerateView:
    """What Accelerate's GradientState holds while an epoch runs. It reads the iterator through a weak
    reference: a strong one would keep a dropped iterator alive, and with it its epoch."""

    def __init__(self, it: _Epoch) -> None:
        self._it = weakref.ref(it)
        # gather_for_metrics keeps this many samples of the last gathered batch (-1: all of them)
        c = it.loader.config
        self.remainder = gather_remainder(c.n, c.batch_size, c.world_size, c.even, c.drop_last)

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


def check_explicit_world(config: Any, explicit: bool, built_pid: int, what: str) -> None:
    """``rank=``/``world_size=`` given, but the process group says this process is another rank: two ranks would
    train on the same share, silently. A loader built in one process and copied into every rank (Lightning's
    ddp_spawn pickles it) is the usual way there. ``world_size=1`` (every rank everything) is always allowed, and so
    is another world size set in this very process (the data-parallel ranks of a model-parallel job)."""
    if not explicit or config.world_size == 1:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    copied = built_pid != os.getpid()
    if (rank, world) == (config.rank, config.world_size) or (world != config.world_size and not copied):
        return
    where = " in another process and copied here (as Lightning's ddp_spawn does)" if copied else ""
    raise ConfigError(
        f"this {what} was built{where} with rank={config.rank}, world_size={config.world_size}, but it is iterated "
        f"by rank {rank} of a process group of {world}: ranks would train on the same share. Build the loader in "
        "each process after the group exists (in Lightning's train_dataloader(), after Accelerator()) and leave "
        "rank= and world_size= out so it reads them, or pass rank=dist.get_rank(), world_size=dist.get_world_size()"
    )


def check_state(state: Any, loader: str) -> None:
    """A StateError unless ``state`` is a loader state of this version, saved by a ``loader`` ("device" or
    "fallback") loader: what must hold before anything in it is compared."""
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


def resume_position(state: Any, loader: str, config: dict[str, Any], batches: int) -> tuple[int, int]:
    """``(epoch, batch)`` to continue from a saved ``state``; a StateError if it cannot be resumed here.

    ``loader`` ("device" or "fallback") and ``config`` (what fixes the sequence) must match what the
    state was saved with, type for type (``seed=123.0`` is not the seed 123), except the rank: the
    position is the same on every rank. ``batches`` is the number of batches in an epoch of this rank.
    """
    check_state(state, loader)
    if state.get("world_size", 1) != config["world_size"]:
        epoch, batch = state.get("epoch"), state.get("batch")
        if type(epoch) is int and type(batch) is int and batch > 0:
            way = f"loader.set_epoch({epoch + 1}) (the rest of epoch {epoch}, from batch {batch} on, is skipped)"
        else:  # at an epoch's start: that epoch is the next one whole
            way = f"loader.set_epoch({epoch if type(epoch) is int else 0})"
        raise StateError(
            f"state was saved with world_size={state.get('world_size')} but this run has "
            f"world_size={config['world_size']}: per-rank positions do not map onto another world size; "
            f"continue from the next epoch start instead with {way}"
        )
    for key, current in config.items():
        # any rank's state resumes every rank; the chunk size (picked from the device and the images' size) changes
        # no batch since each sample's draws are its own (NOTE [ Keyed draws in every loader ] in .loader)
        if key in ("rank", "chunk_batches"):
            continue
        if type(state.get(key)) is not type(current) or state.get(key) != current:  # 123.0 is not the seed 123
            raise StateError(
                f"state has {key}={state.get(key)!r} but this loader has {key}={current!r}; "
                "resume needs the same data and configuration"
            )
    epoch, batch = state.get("epoch"), state.get("batch")
    last = MAX_EPOCH - 1 if batch == batches else MAX_EPOCH  # a finished epoch resumes at the next one
    if type(epoch) is not int or not 0 <= epoch < last or type(batch) is not int or not 0 <= batch <= batches:
        raise StateError(
            f"state has epoch={epoch!r}, batch={batch!r}; expected an int epoch in [0, 2**63) and an int batch in "
            f"[0, {batches}]: it is not a state this loader saved (pass the dict loader.state_dict() returned)"
        )
    return (epoch + 1, 0) if batch == batches else (epoch, batch)
