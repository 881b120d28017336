"""The slow path, taken only when asked: the original per-sample pipeline in DataLoader workers.

``accelerate(..., fallback="prefetch")`` returns a :class:`FallbackLoader` when the transform has
a random op gpufeed cannot batch. It keeps gpufeed's epoch order (a pure function of seed and
epoch), never forks workers from a process with CUDA state, and overlaps the copies with
:func:`gpufeed.prefetch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler, default_collate

from .augment.functional import convert_dtype
from .device import usable_cores
from .errors import StateError
from .ingest import _with_transform
from .plan import Plan
from .prefetch import prefetch
from .sampling import derive_seed, epoch_order
from .validate import Guarded, SampleFailure, as_int, check_epoch

__all__ = ["FallbackLoader"]


def _collate(items: list[Any]) -> Any:
    """torch's default collate, or the first sample's failure in the batch's place (raised in the parent)."""
    failed = next((item for item in items if isinstance(item, SampleFailure)), None)
    return failed if failed is not None else default_collate(items)


class _EpochSampler(Sampler[int]):
    def __init__(self, n: int, seed: int, shuffle: bool) -> None:
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def __iter__(self) -> Iterator[int]:
        return iter(epoch_order(self.seed, self.epoch, self.n, self.shuffle).tolist())

    def __len__(self) -> int:
        return self.n


class FallbackLoader:
    """Per-sample torchvision transforms in DataLoader workers, batches copied ahead to ``device``."""

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
    ) -> None:
        ds = Guarded(_with_transform(dataset, transform), type(dataset).__name__)
        check_epoch(len(ds) // batch_size if drop_last else 1, batch_size, len(ds))
        cores = usable_cores()
        workers = min(8, cores) if num_workers is None else num_workers
        kwargs: dict[str, Any] = {}
        if workers > 0:
            # Persistent: worker start-up (seconds with forkserver) is paid once, not every epoch.
            kwargs.update(persistent_workers=True, prefetch_factor=4)
            if torch.cuda.is_initialized():
                kwargs["multiprocessing_context"] = "forkserver"  # forked workers + live CUDA state crash
        self.sampler = _EpochSampler(len(ds), seed, shuffle)
        self.loader = DataLoader(
            ds,
            batch_size=batch_size,
            sampler=self.sampler,
            drop_last=drop_last,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            collate_fn=_collate,
            generator=torch.Generator().manual_seed(derive_seed(seed, 1)),
            **kwargs,
        )
        self.device, self.dtype, self.channels_last = device, dtype, channels_last
        self._epoch = 0
        self._in_epoch = False
        self.plan = Plan(
            cached=(),
            batched=(),
            storage=f"none: per-sample in {workers} DataLoader workers, then prefetch",
            stored_shape=(),
            stored_dtype="-",
            bytes=0,
            ingest="none",
            notes=(reason,),
        )

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch = as_int(epoch, "epoch", 0)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        self.sampler.epoch, self._epoch = self._epoch, self._epoch + 1
        self._in_epoch = True
        try:
            for batch in prefetch(self.loader, self.device):
                if isinstance(batch, SampleFailure):
                    raise batch.exception()
                x, y = batch
                if isinstance(x, torch.Tensor) and self.dtype is not None:
                    x = convert_dtype(x, self.dtype)
                if isinstance(x, torch.Tensor) and self.channels_last and x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                yield x, y
        finally:
            self._in_epoch = False

    def state_dict(self) -> dict[str, Any]:
        if self._in_epoch:
            raise StateError("the per-sample fallback can be saved between epochs only; call state_dict() after one")
        return {"version": 1, "fallback": True, "epoch": self._epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("fallback") is not True:
            raise StateError("this state was not saved by a fallback loader; rebuild the loader the same way")
        epoch = state.get("epoch")
        if type(epoch) is not int or epoch < 0:
            raise StateError(f"state has epoch={epoch!r}; expected an int >= 0")
        self._epoch = epoch
