"""StreamLoader: an MDS dataset (local, or fetched from an object store) served as augmented batches.

NOTE [ A stream's batch, step by step ]
Per epoch, the order is the engine's (:func:`gpufeed.mds.plan.plan_epoch`: its partition and shuffle, from the
index alone), planned from the position the epoch starts at. Then, per batch of this rank:

1. in a reader thread (:class:`~gpufeed.loading.ahead.Ahead`, ``ahead`` batches in advance): the samples' bytes
   and labels read from their shards (:class:`~gpufeed.mds.shards.Shards`; a
   :class:`~gpufeed.mds.prefetch.Prefetcher` fetches the next shards meanwhile), each image's decoded size read
   from its header, and the batch decoded at once (:func:`gpufeed.store.encoded.decode`: CPU threads, or nvJPEG on
   a GPU on a side stream) into a ragged batch on the device;
2. in the consumer: the transform, with draws keyed by (seed, epoch, sample id)
   (:class:`~gpufeed.augment.keyed.KeyedDraws`), so a sample's crop is the same whichever rank, batch or position
   serves it; then the dtype and layout. On the CPU the decoded batch's buffer is then handed back for a later
   batch (:class:`~gpufeed.loading.hostmem.Recycled`), unless what was served lies in it: a transform keeps no
   reference to its input.

NOTE [ Positions in global batches ]
The epoch/position bookkeeping is :class:`~gpufeed.loading.epochs.EpochLoader`'s, with one change of unit: a
"batch" is a global batch (``global_batch_size`` samples over all ranks), and ``len(loader)`` the global batches
of an epoch, the same on every rank and at every world size. So a state (:mod:`gpufeed.mds.state`: epoch and
``sample_in_epoch = batch x global_batch_size``) saved at one world size resumes at another: the plan from that
position holds exactly the global batches the saved run had left, and keyed draws give their samples the same
pixels.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..augment.functional import convert_dtype
from ..augment.keyed import KeyedDraws
from ..augment.mix import as_mix
from ..augment.transforms import BatchTransform, takes_ragged
from ..device import resolve_device
from ..errors import ConfigError, DataError, StateError
from ..mds.engine import release
from ..mds.plan import EpochPlan, Layout, StreamSettings, check_layout, plan_epoch, plan_share, stream_length
from ..mds.prefetch import Prefetcher
from ..mds.shards import Samples, Shards
from ..mds.state import load_stream_state, stream_state
from ..read.files import header_shape
from ..store.encoded import Encoded, decode
from ..store.ragged import Ragged
from ..threads import ThreadChoice, torch_threads
from ..validate import as_flag, as_int, as_seed, as_views, check_transform
from .ahead import Ahead
from .config import EpochConfig
from .epochs import EpochLoader
from .hostmem import Recycled
from .identity import describe, differences
from .plan import Plan
from .stream_samples import SampleOps

__all__ = ["StreamLoader", "encoded_batch", "process_layout"]

_JPEG = b"\xff\xd8\xff"
_KNOWN_SIZES = 1 << 23  # samples up to which their sizes are kept (64 MiB); past it, each header is read each time


def encoded_batch(samples: Samples, ids: np.ndarray, known: np.ndarray | None = None) -> Encoded:
    """The samples' image bytes as an :class:`Encoded` store, each image's decoded size from its header; errors
    name the sample id. ``known``: ``(height, width)`` by sample id, 0 where not yet read; the headers read here
    are written to it (a sample's bytes are the same every epoch; were they not, the decode checks the size it
    gets against this one and names the sample)."""
    lengths = torch.tensor([len(b) for b in samples.images], dtype=torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths
    joined = bytearray().join(samples.images)  # one copy, writable: torch.frombuffer shares it without a warning
    data = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
    seen = known[ids].tolist() if known is not None else [(0, 0)] * len(ids)
    rows = []
    for i, b, (h, w) in zip(ids, samples.images, seen, strict=True):
        if not h:  # PIL's header: 40 us an image
            _, h, w = header_shape(io.BytesIO(b), f"sample {int(i)}")
            if known is not None:
                known[i] = h, w
        rows.append((3, h, w))
    shapes = torch.tensor(rows, dtype=torch.int64).view(-1, 3)
    jpeg = torch.tensor([b[:3] == _JPEG for b in samples.images], dtype=torch.bool)
    return Encoded(data, starts, lengths, shapes, jpeg, index=torch.from_numpy(np.asarray(ids, dtype=np.int64)))


def process_layout() -> Layout:
    """This process's place: the process group's rank and size when it exists (ranks per node from torchrun's
    ``LOCAL_WORLD_SIZE``), else torchrun's variables, else one rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        per_node = os.environ.get("LOCAL_WORLD_SIZE")
        if per_node is None and world > 1:
            raise ConfigError(
                f"a process group of {world} ranks, but LOCAL_WORLD_SIZE is not set: launch with torchrun (it sets "
                "it), set LOCAL_WORLD_SIZE to the ranks on each node, or pass layout=Layout.of_rank(rank, world, "
                "ranks_per_node)"
            )
        return Layout.of_rank(dist.get_rank(), world, int(per_node or 1))
    return Layout.from_env()


class StreamLoader(EpochLoader):
    """Yield ``(images, labels)`` batches of an MDS dataset in the engine's order, decoded and augmented in
    batches. Built by :func:`gpufeed.stream`, which converts a torchvision transform and opens the shards.

    Args:
        shards: the dataset (:class:`~gpufeed.mds.shards.Shards`); the loader reads it, the caller closes it.
        settings: what fixes the order (:class:`~gpufeed.mds.plan.StreamSettings`: the global batch size, the
            canonical nodes, the shuffle); the global batch stays fixed when the world size changes.
        transform: gpufeed's batched ops; without ``per_sample`` they start with ``RandomResizedCrop`` (the images
            come at their own sizes).
        per_sample: the deterministic start of an evaluation recipe (``Resize``, ``CenterCrop``), run on each
            sample as torchvision runs it (:class:`SampleOps`); then ``transform`` (may be None) on the batch.
        drop_last: True (training): whole global batches (NOTE [ The epoch's tail ... ] in
            :mod:`gpufeed.mds.plan`). False (evaluation): each rank's whole engine share, as ``StreamingDataset``
            yields it: every sample at least once, the last batch possibly smaller, every rank the same number of
            batches; the engine's few padding repeats come last, and :attr:`real_counts` says how many to score.
        device: where batches are decoded and augmented; ``None``: CUDA if available, else CPU.
        seed: the augmentation's seed (the order's is ``settings.shuffle_seed``).
        dtype, channels_last, num_classes, mix, views: as for :class:`~gpufeed.DeviceLoader`.
        layout: this rank's place (:class:`~gpufeed.mds.plan.Layout`); by default from the process group and
            torchrun's ``LOCAL_WORLD_SIZE``.
        ahead: batches read and decoded ahead of the one in use; prefetch_shards: shards fetched ahead.
        explicit_order: the order settings the caller chose (a resumed state's differing ones are then warned of).

    Epochs, ``set_epoch``, ``break`` and resume follow NOTE [ When an epoch is claimed ] in
    :mod:`gpufeed.loading.epochs`, counted in global batches (NOTE [ Positions in global batches ]).
    """

    kind = "stream"

    def __init__(
        self,
        shards: Shards,
        settings: StreamSettings,
        transform: BatchTransform | None,
        *,
        per_sample: SampleOps | None = None,
        drop_last: bool = True,
        device: str | torch.device | None = None,
        seed: int = 0,
        dtype: torch.dtype | None = torch.float32,
        channels_last: bool = False,
        num_classes: int | None = None,
        layout: Layout | None = None,
        mix: Any = None,
        views: int = 1,
        ahead: int = 2,
        prefetch_shards: int = 4,
        explicit_order: frozenset[str] = frozenset(),
        plan: Plan | None = None,
    ) -> None:
        if transform is not None and not isinstance(transform, BatchTransform):
            check_transform(transform)
            raise ConfigError(f"transform={transform!r} is not a gpufeed op; gf.stream converts torchvision's")
        if per_sample is None and (transform is None or not takes_ragged(transform)):
            raise ConfigError(
                f"transform={transform!r}: a stream's images come at their own sizes, so the transform must start "
                "with RandomResizedCrop (it draws each image's box from that image's size and makes the batch one size)"
            )
        self.shards, self.per_sample = shards, per_sample
        self._shapes: np.ndarray | None = None  # (height, width) by sample id, 0 until its header is read
        self.transform: Callable[..., torch.Tensor] | None = transform  # it takes ragged batches too
        self.drop_last = as_flag(drop_last, "drop_last")
        # images the per-sample part leaves of different sizes are a ragged batch only for a transform that makes
        # them one size (RandomResizedCrop first); else SampleOps.batch names the two sizes
        self._makes_one_size = transform is not None and takes_ragged(transform)
        self.device = resolve_device(device)
        self.seed = as_seed(seed)  # NOTE [ Seeds, epochs and batch sizes: one range at every entry ]
        self.dtype = dtype
        self.channels_last = as_flag(channels_last, "channels_last")
        self.layout = layout if layout is not None else process_layout()
        self._explicit_world = layout is not None
        self.views = as_views(views)
        if self.views > 1 and (transform is None or not transform.random):
            raise ConfigError(f"views={self.views} draws each view's own augmentation: it needs a random transform")
        self.mix = as_mix(mix, num_classes)
        if self.views > 1 and self.mix is not None:
            raise ConfigError("mix= mixes one batch of images with its labels; with views > 1 mix each view yourself")
        self.num_classes = None if num_classes is None else as_int(num_classes, "num_classes", 1)
        self.labelled = shards.index.columns[0].label is not None  # else batches are images alone
        if self.mix is not None and not self.labelled:
            raise ConfigError("mix= mixes images with their labels, but this dataset has no label column (label_key)")
        self.ahead = as_int(ahead, "ahead", 1)
        self._buffers = Recycled(self.ahead + 2)  # the batches in flight: those queued, the one made, the one used
        self._threads = ThreadChoice(device=self.device)  # torch's threads for the transform on the CPU
        self.prefetch_shards = as_int(prefetch_shards, "prefetch_shards", 1)
        self.explicit_order = explicit_order
        self.initial_physical_nodes = self.layout.num_nodes  # the run's first node count (a state may say another)
        self._use(settings)
        self._start_epochs()
        self._probe()
        self.plan = plan

    def _use(self, settings: StreamSettings) -> None:
        """Take ``settings`` (at construction, or adopted from a state): the layout checked against them, the
        epoch's length and the configuration the bookkeeping reads."""
        layout = self.layout
        check_layout(settings, layout.num_nodes, layout.ranks_per_node, self.initial_physical_nodes)
        index = self.shards.index
        short = self.drop_last and index.num_samples < settings.global_batch_size  # whole batches need one at least
        if index.num_samples <= settings.num_canonical_nodes or short:
            raise ConfigError(
                f"the dataset has {index.num_samples} samples: it needs more than num_canonical_nodes="
                f"{settings.num_canonical_nodes}"
                + (f" and, for whole batches, at least global_batch_size={settings.global_batch_size}" if short else "")
            )
        self.settings = settings
        self.batch_size = settings.batch_size(layout.world_size)  # this rank's share of a global batch
        # what the bookkeeping reads: a "batch" is a global batch (NOTE [ Positions in global batches ])
        if self.drop_last:
            self._length = stream_length(index.num_samples, settings.num_canonical_nodes) // settings.global_batch_size
            served = self._length * settings.global_batch_size
        else:  # the engine's share: every rank the same count, so the same number of batches
            share = len(self.epoch_plan(0).ids)
            self._length, served = -(-share // self.batch_size), share * layout.world_size
        self.config = EpochConfig(
            served, self.batch_size, settings.shuffle, self.drop_last, self.seed, 1, layout.rank, layout.world_size,
            even=self.drop_last,
        )  # fmt: skip

    def __len__(self) -> int:
        return self._length

    def _probe(self) -> None:
        """Two samples through the transform now, so a bad argument fails here, not in the first epoch, and a fused
        op compiles here, under each thread count the epochs may use (:meth:`~gpufeed.threads.ThreadChoice.counts`)."""
        item = self._decoded(np.arange(min(2, self.shards.index.num_samples)))
        for threads in self._threads.counts():
            with torch_threads(threads):
                self._finish(item, epoch=0)

    def epoch_plan(self, epoch: int, batch: int = 0) -> EpochPlan:
        """This rank's ids of ``epoch`` from global batch ``batch`` on."""
        s = self.settings
        how = plan_epoch if self.drop_last else plan_share
        return how(
            self.shards.index.samples_per_shard, s, self.layout, epoch, batch * s.global_batch_size,
            self.initial_physical_nodes,
        )  # fmt: skip

    def _batches(self, epoch: int, start: int, side: bool = False) -> Iterator[Any]:
        plan = self.epoch_plan(epoch, start)
        if plan.num_batches != len(self) - start:  # every rank must stop after the same batch
            raise ConfigError(
                f"epoch {epoch} plans {plan.num_batches} batches from batch {start}, not {len(self) - start}: this "
                f"engine release ({' '.join(release())}) plans otherwise than gpufeed expects"
            )
        fetch = Prefetcher(self.shards, plan.ids, ahead=self.prefetch_shards)
        size = plan.batch_size

        def make(k: int) -> tuple[torch.Tensor, Any, torch.Tensor, Any]:
            item = self._decoded(plan.batch(k))
            fetch.advance((k + 1) * size)
            return item

        reader = Ahead(make, plan.num_batches, self.ahead, name="gpufeed-stream-read")
        try:
            for item in reader:
                with self._threads.step(len(item[0])):  # NOTE [ Torch's threads on a busy machine ] (gpufeed.threads)
                    batch = self._finish(item, epoch)
                x = item[1]
                if self.per_sample is None and x.data.device.type == "cpu":  # the decoded images' buffer, for a next
                    images = batch[0] if isinstance(batch[0], list) else [batch[0]]
                    self._buffers.give(x.data, [*images, batch[1]])
                del item, x
                yield batch
        finally:
            reader.close()
            fetch.close()

    def _decoded(self, ids: np.ndarray) -> tuple[torch.Tensor, Any, torch.Tensor, Any]:
        """(ids, ragged images, labels, event) of one batch on the device; ``event``: a CUDA event the consumer
        waits on (the decode ran on the reader's stream), else None."""
        samples = self.shards.read(ids)
        if self._shapes is None and self.shards.index.num_samples <= _KNOWN_SIZES:  # sizes by sample id, read once
            self._shapes = np.zeros((self.shards.index.num_samples, 2), dtype=np.int32)
        if self.num_classes is not None and self.labelled:
            bad = np.flatnonzero((samples.labels < 0) | (samples.labels >= self.num_classes))
            if bad.size:
                i = bad[0]
                raise DataError(
                    f"sample {int(ids[i])} has label {int(samples.labels[i])}, not in [0, num_classes="
                    f"{self.num_classes}): check label_key and num_classes"
                )
        ids_t, labels = torch.from_numpy(np.array(ids, dtype=np.int64)), torch.from_numpy(samples.labels)
        if self.per_sample is not None:
            x: Any = self.per_sample.batch(samples.images, ids, ragged=self._makes_one_size)
            if self.device.type != "cuda":
                return ids_t.to(self.device), x.to(self.device), labels.to(self.device), None
        else:
            encoded = encoded_batch(samples, ids, self._shapes)
            if self.device.type != "cuda":
                # on every core, as the consumer's transform (Pillow's boxes) is: the two share them. With one
                # core left to the consumer, RandomResizedCrop(224)'s stream ran 540-600 img/s on 2 cores, on every
                # core 640-650 (benchmarks/stream_throughput.py)
                x = decode(encoded, self.device, out=self._buffers.take(encoded.pixel_bytes))
                return ids_t.to(self.device), x, labels.to(self.device), None
        with torch.cuda.device(self.device), torch.cuda.stream(self._side_stream()):
            if self.per_sample is not None:  # a dense batch, or a ragged one (an op after makes it one size)
                x = replace(x, data=x.data.pin_memory()) if isinstance(x, Ragged) else x.pin_memory()
                x = x.to(self.device, non_blocking=True)
            else:
                x = decode(replace(encoded, data=encoded.data.pin_memory()), self.device)
            ids_t = ids_t.pin_memory().to(self.device, non_blocking=True)
            labels = labels.pin_memory().to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        return ids_t, x, labels, event

    def _side_stream(self) -> Any:
        stream = getattr(self, "_stream", None)
        if stream is None:
            with torch.cuda.device(self.device):
                stream = self._stream = torch.cuda.Stream(self.device)
        return stream

    def _finish(self, item: tuple[torch.Tensor, Any, torch.Tensor, Any], epoch: int) -> Any:
        ids, x, labels, event = item
        if event is not None:  # NOTE [ Stream ownership in prefetch ] in gpufeed.loading.prefetch, steps 3-4
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(event)
            for t in (ids, x.data if isinstance(x, Ragged) else x, labels):
                t.record_stream(consumer)
        draws = KeyedDraws(self.seed, epoch, ids)
        if self.views == 1:
            images: Any = self._view(x, draws)
        else:  # view 0 draws as a single view would; the others from their own streams
            images = [self._view(x, draws if v == 0 else draws.child(("view", v))) for v in range(self.views)]
        return images, labels  # EpochLoader drops the labels of an unlabelled stream (label_key=None)

    def _view(self, x: Ragged | torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        count = len(x)
        if self.transform is None:
            assert isinstance(x, torch.Tensor)  # SampleOps.batch stacks when nothing runs batched
            return self._converted(x)
        out = self.transform(x, generator=draws)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != count:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise DataError(f"transform returned {got} for a batch of {count}; it must keep the batch axis")
        return self._converted(out)

    def _converted(self, out: torch.Tensor) -> torch.Tensor:
        if self.dtype is not None:
            out = convert_dtype(out, self.dtype)
        if self.channels_last and out.dim() == 4:
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    @property
    def real_counts(self) -> tuple[int, ...]:
        """Per batch of the iteration in progress (or of the next one), counted from its first batch: how many of the
        batch's first samples are real. Training: every one. Evaluation (``drop_last=False``): the engine's padding
        repeats come last in each rank's share, so scoring ``x[:n]`` of each batch scores every sample once over
        the ranks (NOTE [ The epoch's tail ... ] in :mod:`gpufeed.mds.plan`)."""
        live = self._live
        epoch, start = (live.epoch, live.start) if live is not None and not live.done else (self._epoch, self._offset)
        return tuple(self.epoch_plan(epoch, start).real_counts())

    def close(self) -> None:
        """Stop reading the dataset (its shards) and free the decoded batches' buffers kept for the next epoch;
        idempotent. ``with gf.stream(...) as loader:`` closes at the end."""
        self.shards.close()
        self._buffers.clear()

    def __enter__(self) -> StreamLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ------------------------------------------------------------------------------------------------

    def _pipeline(self) -> dict[str, Any]:
        return {
            "transform": describe(self.transform),
            "per_sample": describe(self.per_sample),
            "drop_last": self.drop_last,
            "dtype": str(self.dtype),
            "channels_last": self.channels_last,
            **self._batch_forms(),
        }

    def _fingerprint(self) -> dict[str, Any]:
        return {"dataset": self.shards.index.fingerprint, **self._pipeline()}

    def state_dict(self) -> dict[str, Any]:
        """The stream state (:mod:`gpufeed.mds.state`: the engine's five keys nested in ``state["engine"]``)
        at the next global batch, plus the pipeline it belongs to; JSON-able, valid at any world size."""
        epoch, batch = self._saved_position()
        index = self.shards.index
        state = stream_state(
            self.settings,
            epoch=epoch,
            sample_in_epoch=batch * self.settings.global_batch_size,
            initial_physical_nodes=self.initial_physical_nodes,
            fingerprint=index.fingerprint,
            num_samples=index.num_samples,
            seed=self.seed,
            engine_release=" ".join(release()),
        )
        return {**state, "pipeline": self._pipeline()}

    def load_state_dict(self, state: dict[str, Any], strict: bool | None = None) -> None:
        """Continue from ``state`` (this loader's, saved at any world size, or a ``StreamingDataLoader``'s): the next
        iteration serves exactly the global batches the saved run had left.

        The saved run's order settings (canonical nodes, shuffle seed, algorithm, block) are taken over, as the
        engine does; one the caller set otherwise is warned of. A state of another dataset, global batch size or seed
        is a StateError; another pipeline too, unless ``strict=False`` (default ``loader.strict_state``).
        """
        index = self.shards.index
        resume = load_stream_state(
            state, self.settings, fingerprint=index.fingerprint, num_samples=index.num_samples, seed=self.seed
        )
        strict = self.strict_state if strict is None else as_flag(strict, "strict")
        saved = state.get("pipeline")
        found = differences(saved, self._pipeline()) if isinstance(saved, dict) else []
        if strict and found:
            raise StateError(
                f"state: {'; '.join(found)}. The resumed batches would differ from the saved run's: build the loader "
                "as it was, or load the position anyway with loader.load_state_dict(state, strict=False)"
            )
        chosen = sorted(set(resume.adopted) & self.explicit_order)
        if chosen:
            said = ", ".join(f"{k}={resume.adopted[k][1]!r} (you passed {resume.adopted[k][0]!r})" for k in chosen)
            warnings.warn(f"state: continuing the saved run's order with {said}", stacklevel=2)
        initial = resume.initial_physical_nodes or self.layout.num_nodes
        previous = (self.settings, self.initial_physical_nodes)
        self.initial_physical_nodes = initial
        try:
            self._use(resume.settings)
        except ConfigError:
            self.settings, self.initial_physical_nodes = previous
            self._use(self.settings)
            raise
        batch = resume.sample_in_epoch // resume.settings.global_batch_size
        epoch, batch = (resume.epoch + 1, 0) if batch >= len(self) else (resume.epoch, batch)
        self._live, self._stopped = None, None  # as set_epoch: a running iteration is detached, not cut short
        self._epoch, self._offset = epoch, batch
