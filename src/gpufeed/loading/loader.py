"""DeviceLoader: a dataset resident on one device, served as augmented batches.

Per epoch: the order comes from :func:`gpufeed.sampling.epoch_order` (CPU, pure), is sent to the
device once, and the batches are produced a *chunk* of several batches at a time: one gather from
the resident store, one call of the batched transform, one dtype/layout conversion. Chunking
amortises kernel launches (the per-batch cost on a GPU is launch overhead, not bandwidth); the
batches handed out are slices of the chunk. Nothing in an epoch reads a device value on the host.

Storage: the images live on the device (``storage="device"``, the fast case), in pinned host
memory (``"pinned"``) or wherever the caller's tensor is, e.g. a memory-mapped file (``"mmap"``).
For the host tiers a chunk is gathered on the CPU into pinned memory and copied ahead of use by
:func:`gpufeed.prefetch`; the transform still runs on the device, with the same chunks and seeds,
so every tier yields the same batches.

Randomness: NOTE [ Keyed draws in every loader ]. Each sample's augmentation is drawn from its own key,
(seed, epoch, sample id) (:class:`~gpufeed.augment.keyed.KeyedDraws`, as ``gf.stream`` draws), not from a stream per
chunk: a sample gets the same crop, flip and colour whatever chunk, batch, position, rank or world size serves it
and on the CPU as on a GPU (a chunk size picked from the device and image size no longer changes what is drawn),
and any batch can be recomputed from the configuration alone, which is what makes mid-epoch resume exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..augment import fusion
from ..augment.functional import convert_dtype
from ..augment.keyed import KeyedDraws
from ..augment.mix import as_mix
from ..augment.transforms import BatchTransform, takes_ragged
from ..device import resolve_device
from ..errors import ConfigError, DataError
from ..options import BatchOptions
from ..sampling import derive_seed, epoch_order, local_indices, rank_indices
from ..store import Store, as_store
from ..store.base import STORAGE_TIERS
from ..store.dense import pinned, pinned_gather
from ..threads import ThreadChoice, torch_threads
from ..validate import as_int, as_views, check_epoch, check_labels, check_transform, label_tensor
from .config import EpochConfig, distributed_rank
from .epochs import EpochLoader
from .hostmem import keep_freed_buffers
from .identity import data_identity, describe
from .prefetch import prefetch
from .takeover import Takeover

if TYPE_CHECKING:
    from ..read.wrappers import SourceWatch
    from .plan import Plan

__all__ = ["DeviceLoader"]

# Stored bytes gathered per chunk. On a GPU the cost of a batch is kernel launches, so chunks are
# large; on a CPU the cost is memory traffic, and a chunk that stays in cache is 2-4x faster.
_CHUNK_BYTES = {"cuda": 32 << 20, "cpu": 1 << 20}
_MAX_CHUNK_BATCHES = 32

Transform = Callable[..., torch.Tensor]


class DeviceLoader(EpochLoader):
    """Yield ``(images, labels)`` batches from tensors held on ``device``, augmented there.

    Args:
        images: ``(N, C, H, W)`` uint8 (preferred) or floating tensor or numpy array, or a
            :class:`~gpufeed.store.base.Store` (images of different sizes: a Ragged or Encoded store).
        labels: ``(N, ...)`` class indices or targets.
        batch_size: samples per batch.
        shuffle: visit samples in a random order, a pure function of (seed, epoch, N).
        drop_last: drop the ragged last batch (the only samples ever skipped).
        transform: a batched transform called as ``transform(x, generator=g)``, e.g.
            ``gpufeed.augment.Compose([...])``.
        device: where the data lives and batches are made; ``None``: CUDA if available, else CPU.
        seed: seeds the order and the augmentation.
        dtype: the images' output dtype (uint8 -> float scales to [0, 1] as ``ToTensor`` does);
            ``None`` keeps the transform's output.
        channels_last: return images in ``torch.channels_last`` memory format.
        num_classes: if given, integer labels must lie in ``[0, num_classes)``.
        chunk_batches: batches gathered and transformed per call; ``None`` picks a size from the
            sample size. Part of what fixes the augmentation, so it is saved in ``state_dict``.
        storage: where the images are kept: ``"device"`` (copied there once), ``"pinned"`` (page-
            locked host memory) or ``"mmap"`` (the caller's CPU tensor as it is, e.g. from
            ``np.memmap``). The batches are the same for every tier.
        rank, world_size: this process's share of each epoch; by default read from
            ``torch.distributed`` when it is initialised, else one rank.
        even: ``True`` (training): every rank gets the same number of batches, dropping whole batches with
            ``drop_last``; without it laid out as ``"pad"`` (the same shapes on every rank, batch for batch).
            ``"pad"`` (evaluation): every sample once, then repeats at the very end so that every rank
            gets the same number of full batches (a collective per batch never waits); the repeats are
            known: Accelerate's ``gather_for_metrics`` drops them, and :attr:`real_counts` says how many
            of each batch's first samples are real. ``False`` (evaluation): every sample exactly once
            across ranks, no repeats, but ranks may get different numbers of batches.
        shard: ``"full"``: every rank holds the whole dataset and takes a different share of the
            same global order each epoch. ``"local"``: each rank holds only samples ``rank::world_size``
            (a 1/world_size of the memory) and shuffles within them, so samples never change rank.
        plan: what :func:`gpufeed.accelerate` decided and why (``print(loader.plan)``); ``None`` for a loader
            made directly.
        source_watch: the dataset objects ``accelerate`` read once
            (:class:`gpufeed.read.wrappers.SourceWatch`): an epoch after their transform or labels were replaced
            is refused.

    Each pass is the next epoch, claimed when its first batch is taken; :meth:`set_epoch` picks one
    explicitly, :meth:`state_dict` / :meth:`load_state_dict` resume mid-epoch (a state saved on any
    rank resumes every rank; one saved after a ``break`` finishes the interrupted epoch). See NOTE [ When
    an epoch is claimed ] in :mod:`gpufeed.loading.epochs`. A state of other data or another transform is refused
    (``load_state_dict(state, strict=False)`` overrides): NOTE [ What a state belongs to ] in
    :mod:`gpufeed.loading.identity`.

    Example:
        >>> import torch
        >>> loader = DeviceLoader(torch.zeros(10, 1, 4, 4, dtype=torch.uint8), torch.arange(10),
        ...                       batch_size=4, drop_last=True, device="cpu")
        >>> len(loader), [y.tolist() for _, y in loader][0] != [y.tolist() for _, y in loader][0]
        (2, True)
    """

    def __init__(
        self,
        images: torch.Tensor | np.ndarray | Store,
        labels: torch.Tensor | np.ndarray,
        batch_size: int = 256,
        shuffle: bool = True,
        drop_last: bool = False,
        transform: Transform | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        dtype: torch.dtype | None = torch.float32,
        channels_last: bool = False,
        *,
        num_classes: int | None = None,
        chunk_batches: int | None = None,
        storage: str = "device",
        rank: int | None = None,
        world_size: int | None = None,
        even: bool | str = True,
        shard: str = "full",
        mix: Any = None,
        views: int | Sequence[BatchTransform] = 1,
        plan: Plan | None = None,
        source_watch: SourceWatch | None = None,
    ) -> None:
        options = BatchOptions(
            batch_size, shuffle, drop_last, seed, dtype, channels_last, rank, world_size, even, shard
        )  # checked once, as accelerate and FallbackLoader check theirs
        batch_size, seed, even = options.batch_size, options.seed, options.even
        labels = label_tensor(labels, "labels")
        # views as transforms (DINO's global and local crops): each view its own transform
        view_transforms = list(views) if isinstance(views, (list, tuple)) else None
        if view_transforms is not None:
            if len(view_transforms) < 2 or not all(isinstance(t, BatchTransform) for t in view_transforms):
                raise ConfigError("views: give an int, or two or more gpufeed transforms (one per view)")
            transform = view_transforms[0]
        store = as_store(images)
        if store.ragged:  # images of different sizes: the first op must make them one size
            if not all(isinstance(t, BatchTransform) and takes_ragged(t) for t in view_transforms or [transform]):
                raise ConfigError(
                    "images of different sizes need a transform that starts with RandomResizedCrop (it draws each "
                    "image's box from that image's size and makes the batch one size)"
                )
        store.check()
        n = len(store)
        check_labels(labels, n, num_classes)
        if transform is not None:
            check_transform(transform)
        self.device = resolve_device(device)
        if storage not in STORAGE_TIERS:
            raise ConfigError(f"storage={storage!r} must be one of {STORAGE_TIERS}")
        if storage != "device" and store.device.type != "cpu":
            raise ConfigError(f"storage={storage!r} keeps images on the host, but they are on {store.device}")
        if chunk_batches is not None:
            chunk_batches = as_int(chunk_batches, "chunk_batches", 1)
        else:
            batch_bytes = max(1, int(batch_size * store.sample_bytes))  # decoded: what a chunk takes
            budget = _CHUNK_BYTES.get(self.device.type, _CHUNK_BYTES["cuda"])
            chunk_batches = max(1, min(_MAX_CHUNK_BATCHES, budget // batch_bytes))
        rank, world_size = distributed_rank(options.rank, options.world_size)
        self.config = EpochConfig(
            n, batch_size, options.shuffle, options.drop_last, seed, chunk_batches, rank, world_size, even, shard
        )
        # What a state belongs to (NOTE [ What a state belongs to ] in gpufeed.loading.identity): taken from the whole
        # dataset, before a local shard keeps a part, so that a state saved on any rank matches every rank.
        self._data_id = data_identity(store, labels)
        if shard == "local" and world_size > 1:  # keep only this rank's samples
            local = torch.arange(rank, n, world_size)
            store, labels = store.select(local).compact(), labels.index_select(0, local)
        self.transform = transform
        self.mix = as_mix(mix, num_classes)
        self.view_transforms = view_transforms
        self.views = len(view_transforms) if view_transforms is not None else as_views(views)
        if view_transforms is None and self.views > 1 and (transform is None or not getattr(transform, "random", True)):
            raise ConfigError(f"views={self.views} draws each view's own augmentation: it needs a random transform")
        if self.views > 1 and self.mix is not None:
            raise ConfigError("mix= mixes one batch of images with its labels; with views > 1 mix each view yourself")
        self.dtype = dtype
        self.channels_last = options.channels_last
        self.storage = storage
        # Never written to. The device tier copies once (no copy when already there); encoded bytes stay on the host.
        self.store = store.placed(storage, self.device)
        self.labels = _placed_labels(labels, self.store, storage, self.device)
        self._explicit_world = options.explicit_world
        self._start_epochs()
        self._threads = ThreadChoice(device=self.device)  # its choice carries from epoch to epoch
        self._length: int | None = None
        self.source_watch = source_watch  # accelerate's: a dataset transform or labels replaced later is refused
        check_epoch(n, batch_size, options.drop_last, world_size, even, local=shard == "local")
        start = time.monotonic()
        with fusion.watch() as fused:  # the transform's first run queues its fused ops' compile (in the background)
            probe = self._probe()
        self.takeover = Takeover(fused.fused, start)  # when the fused kernels took over (for the plan)
        self.host_memory_note: str | None = None
        if self.device.type == "cpu" and probe is not None:
            # each chunk of batches is a fresh buffer (and ragged images are made image by image): freed ones
            # reused, not page-faulted in again (256x256 batches: 3x faster); see gpufeed.loading.hostmem
            chunk_bytes = self.config.chunk_batches * batch_size * probe[0].nbytes
            self.host_memory_note = keep_freed_buffers(chunk_bytes)
        # what accelerate() decided and why (gpufeed.loading.plan), completed with what only the loader knows: the
        # placed store's layout (its decoder follows the tier) and the note on its chunks' buffers
        self._plan = plan and replace(
            plan, layout=self.store.describe(), notes=(*plan.notes, *filter(None, [self.host_memory_note]))
        )

    @property
    def compile_note(self) -> str | None:
        """The fused kernels' state, live: compiling in the background, or since which batch they serve (or why
        not); None where nothing compiles."""
        return self.takeover.note()

    @property
    def plan(self) -> Plan | None:
        """What accelerate() decided and why, with the fused kernels' state as it is now (``print(loader.plan)``)."""
        note = self.compile_note
        if self._plan is None or note is None:
            return self._plan
        return replace(self._plan, notes=(*self._plan.notes, note))

    @plan.setter
    def plan(self, plan: Plan | None) -> None:
        self._plan = plan

    @property
    def images(self) -> Any:
        """The stored images as given: the ``(N, C, H, W)`` tensor of dense data, else the Ragged / Encoded store
        (:attr:`store` is the :class:`~gpufeed.store.base.Store` either way)."""
        return self.store.images

    def _probe(self) -> torch.Tensor | None:
        """Run the transform once on two samples, so a bad argument (a mean of the wrong length, a crop
        larger than the image) fails here and not in the middle of the first epoch, and a fused op compiles here,
        once under each thread count the epochs may use (:meth:`~gpufeed.threads.ThreadChoice.counts`); their
        batch."""
        if self.transform is None:
            return None
        ids = torch.arange(min(2, len(self.store)))
        x = self.store.batch(ids, self.device)
        draws = KeyedDraws(self.config.seed, 0, ids.to(self.device))
        try:
            out = None
            for threads in self._threads.counts():  # each count an epoch may run it with: a fused op compiles for each
                with torch_threads(threads):
                    for view in range(1, len(self.view_transforms or [])):  # every view's pipeline, not only the first
                        self._finish(x, draws, view=view)
                    out = self._finish(x, draws)
            return out
        except TypeError as e:
            if "KeyedDraws" not in str(e):
                raise
            raise ConfigError(
                f"the transform {describe(self.transform)} passes its generator= to torch's own random functions "
                f"({str(e).splitlines()[0]}); gpufeed hands each op a KeyedDraws, each sample's own draws "
                "(NOTE [ Keyed draws in every loader ]): draw with gpufeed.augment.params' rand, randint, randn, "
                "coin or uniform, which take a KeyedDraws or a torch.Generator"
            ) from e

    def _fingerprint(self) -> dict[str, Any]:
        """The data and the batched pipeline a state of this loader belongs to."""
        transforms = self.view_transforms if self.view_transforms is not None else [self.transform]
        pipeline = {"transform": " | ".join(describe(t) for t in transforms), "dtype": str(self.dtype)}
        return {**self._data_id, **pipeline, "channels_last": self.channels_last}

    def __len__(self) -> int:
        if self._length is None:
            self._length = -(-self._indices(0, shuffle=False).shape[0] // self.config.batch_size)
        return self._length

    def _indices(self, epoch: int, shuffle: bool | None = None) -> torch.Tensor:
        """This rank's samples for ``epoch``, in visiting order (indices into the resident store)."""
        c = self.config
        shuffle = c.shuffle if shuffle is None else shuffle
        if c.shard == "local":
            local = len(self.store)
            # derive_seed(seed, rank): each rank shuffles its own samples with its own stream.
            order = epoch_order(derive_seed(c.seed, c.rank), epoch, local, shuffle)
            return local_indices(order, c.batch_size, c.n, c.world_size, c.drop_last, c.even)
        order = epoch_order(c.seed, epoch, c.n, shuffle)
        return rank_indices(order, c.batch_size, c.rank, c.world_size, c.drop_last, c.even)

    kind = "device"

    def _batches(self, epoch: int, start: int, side: bool = False) -> Iterator[tuple[Any, torch.Tensor]]:
        """The batches of ``epoch`` from batch ``start`` on: slices of transformed chunks."""
        k, bs = self.config.chunk_batches, self.config.batch_size
        skip = start % k  # batches of the first chunk already served before a resume
        for _, x, y in self._chunks(epoch, start // k):
            for j in range(skip * bs, y.shape[0], bs):
                if isinstance(x, list):  # views: ([view 1, view 2, ...], labels)
                    yield [v[j : j + bs] for v in x], y[j : j + bs]
                else:
                    yield x[j : j + bs], y[j : j + bs]
            skip = 0

    def _chunks(self, epoch: int, first: int) -> Iterator[tuple[int, Any, torch.Tensor]]:
        """Yield ``(chunk index, images, labels)`` from chunk ``first`` on, transformed, on the device (the
        images a list of views when ``views`` > 1)."""
        c = self.config
        order = self._indices(epoch)
        span = c.chunk_batches * c.batch_size
        chunks = range(first, -(-order.shape[0] // span))
        ragged = self.store.ragged  # selected on the host, by the store's metadata
        on_host = self.store.device.type == "cpu" and self.device.type != "cpu"
        raw: Iterable[tuple[int, Any, torch.Tensor]]
        if on_host and not ragged:
            # Gathered on the CPU straight into pinned memory, copied ahead on a side stream.
            chunks_ahead = ((k, *self._pinned_chunk(order[k * span : (k + 1) * span])) for k in chunks)
            raw = prefetch(chunks_ahead, self.device)
        else:
            if self.device.type == "cuda" and not ragged:
                order = order.pin_memory().to(self.device, non_blocking=True)  # once per epoch, no host sync
            raw = ((k, *self._gather(order[k * span : (k + 1) * span])) for k in chunks)
        ids = self._sample_ids(order)  # NOTE [ Keyed draws in every loader ]

        def finished() -> Iterator[tuple[int, Any, torch.Tensor]]:
            for k, x, y in raw:
                draws = (
                    KeyedDraws(c.seed, epoch, ids[k * span : (k + 1) * span]) if self.transform is not None else None
                )
                with fusion.watch() as ran:  # compiled, or eager while the fused kernels compile
                    if self.views == 1:
                        out: Any = self._finish(x, draws)
                    else:  # the same images, view 0 drawing as a single view would, the others from their own streams
                        out = [self._finish(x, draws, v) for v in range(self.views)]
                self.takeover.after(epoch, k * c.chunk_batches, ran)
                yield k, out, y

        # on the CPU each chunk's gather, transform and conversion under the torch thread count that runs them
        # fastest now (NOTE [ Torch's threads on a busy machine ] in gpufeed.threads)
        yield from self._threads.steps(finished(), (min(span, order.shape[0] - k * span) for k in chunks))

    def _sample_ids(self, order: torch.Tensor) -> torch.Tensor:
        """The epoch's sample ids, in visiting order, on the device (copied once per epoch, from pinned memory: no
        copy per chunk, no host sync): each sample's index in the whole dataset (a local shard's samples, stored
        as ``rank, rank + world, ...``, keep theirs)."""
        c = self.config
        ids = order * c.world_size + c.rank if c.shard == "local" and c.world_size > 1 else order
        if ids.device != self.device:
            ids = (ids.pin_memory() if self.device.type == "cuda" else ids).to(self.device, non_blocking=True)
        return ids

    def _gather(self, idx: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """The chunk at ``idx`` on the device: its images as the transform takes them, and its labels."""
        labels = self.labels.index_select(0, idx.to(self.labels.device)).to(self.device)
        return self.store.batch(idx, self.device), labels

    def _pinned_chunk(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk at ``idx`` (host indices) of a dense host store, in pinned memory, for a copy ahead."""
        return self.store.pinned_batch(idx), pinned_gather(self.labels, idx)

    def _finish(self, x: Any, draws: KeyedDraws | None, view: int = 0) -> torch.Tensor:
        count = len(x)
        if self.transform is not None:
            assert draws is not None
            transform = self.view_transforms[view] if self.view_transforms is not None else self.transform
            x = transform(x, generator=draws if view == 0 else draws.child(("view", view)))
            if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[0] != count:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise DataError(f"transform returned {got} for a batch of {count}; it must keep the batch axis")
        if self.dtype is not None:
            x = convert_dtype(x, self.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def _placed_labels(labels: torch.Tensor, store: Store, storage: str, device: torch.device) -> torch.Tensor:
    """The labels where the chunks are gathered from: beside the images on the device (and for a store served
    from host bytes, whose chunks are decoded onto it), pinned beside pinned images (a dense chunk is gathered into
    pinned memory and copied ahead), else where they are."""
    if storage == "device" or store.device == device or store.host_bytes:
        return labels.to(device)
    if storage == "pinned" and device.type == "cuda":
        return pinned(labels)
    return labels
