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
from torch.utils.data import DataLoader, Sampler

from .augment.functional import convert_dtype
from .device import usable_cores
from .errors import StateError
from .ingest import _with_transform
from .plan import Plan
from .prefetch import prefetch
from .sampling import derive_seed, epoch_order

__all__ = ["FallbackLoader"]


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
        ds = _with_transform(dataset, transform)
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
        self._epoch = epoch

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        self.sampler.epoch, self._epoch = self._epoch, self._epoch + 1
        self._in_epoch = True
        try:
            for x, y in prefetch(self.loader, self.device):
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
        if not state.get("fallback"):
            raise StateError("this state was not saved by a fallback loader; rebuild the loader the same way")
        self._epoch = int(state["epoch"])
