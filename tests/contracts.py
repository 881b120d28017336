"""Contracts every loader kind keeps, written once and run against each kind (as torchdata's
``run_test_save_load_state`` runs against every node).

``check_resume(make_loader)``: a state saved at any point resumes in a fresh loader with exactly the batches the
uninterrupted run had left, and the loader that was interrupted goes on as a trainer expects.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch

SAVE_POINTS = ("midpoint", "epoch edge", "epoch end", "break", "midpoint of epoch 1")


def check_resume(make_loader: Callable[[], Any], *, at: tuple[str, ...] = SAVE_POINTS) -> None:
    """Check the resume contract of the loaders ``make_loader()`` builds, each fresh and alike.

    The reference is one uninterrupted loader's first three epochs. Then, for each save point in ``at``, a new
    loader is interrupted there and its ``state_dict()`` saved (through ``torch.save`` and ``torch.load`` with
    ``weights_only=True``, as a trainer's checkpoint); a fresh loader that loads it must yield the rest of that
    epoch and then the next one bit for bit (images and labels, every view, soft labels: whatever a batch holds),
    and a new ``for`` on the interrupted loader itself must serve the epoch after the one it was in. The save
    points, for epochs of ``n`` batches (at least 3):

    - ``"midpoint"``: after ``n // 2`` batches drawn with ``next()``, the iterator kept: it yields the rest of
      epoch 0 and the state resumes there;
    - ``"epoch edge"``: right after epoch 0's last batch, its iterator not yet exhausted: the state resumes at
      epoch 1;
    - ``"epoch end"``: after a ``for`` over all of epoch 0;
    - ``"break"``: after a ``for`` that breaks after batch 1 (the preemption pattern: a flag, ``break``, save):
      the state resumes epoch 0 at batch 2, while a new ``for`` on the interrupted loader serves epoch 1;
    - ``"midpoint of epoch 1"``: as ``"midpoint"``, in the epoch after a full one.

    The state is taken at the save point and serialized only after the interrupted loader went on, so a state
    that shares live objects with its loader fails too.
    """
    unknown = set(at) - set(SAVE_POINTS)
    assert not unknown, f"unknown save points {sorted(unknown)}: the contract has {SAVE_POINTS}"
    reference = make_loader()
    epochs = [_epoch(reference) for _ in range(3)]
    n = len(epochs[0])
    assert n >= 3, f"an epoch of {n} batches: make epochs of 3 or more"
    assert [len(e) for e in epochs] == [len(reference)] * 3, f"len(loader) is {len(reference)}, epochs yield {n}"
    for point in at:
        loader = make_loader()
        served, on = 0, []  # the epoch the interrupted loader was in, and the batches it yielded of it
        if point == "midpoint of epoch 1":
            _same_batches(_epoch(loader), epochs[0], f"{point}: epoch 0")
            served = 1
        if point in ("midpoint", "midpoint of epoch 1"):
            it = iter(loader)
            on = [_clone(next(it)) for _ in range(n // 2)]
            state, position = loader.state_dict(), (served, n // 2)
            on += _epoch(it)  # the interrupted iterator keeps going: the rest of its epoch
        elif point == "epoch edge":
            it = iter(loader)
            on = [_clone(next(it)) for _ in range(n)]
            state, position = loader.state_dict(), (1, 0)
        elif point == "epoch end":
            on = _epoch(loader)
            state, position = loader.state_dict(), (1, 0)
        elif point == "break":
            for step, batch in enumerate(loader):
                on.append(_clone(batch))
                if step == 1:
                    break
            state, position = loader.state_dict(), (0, 2)
        assert (state["epoch"], state["batch"]) == position, f"{point}: saved at {state['epoch'], state['batch']}"
        _same_batches(on, epochs[served][: len(on)], f"{point}: the interrupted loader's epoch {served}")
        next_for = f"{point}: a new for on the interrupted loader (epoch {served + 1})"
        _same_batches(_epoch(loader), epochs[served + 1], next_for)
        after = loader.state_dict()["epoch"], loader.state_dict()["batch"]
        assert after == (served + 2, 0), f"{next_for}: then at {after}"

        fresh = make_loader()
        fresh.load_state_dict(_checkpointed(state))
        resumed = _epoch(fresh) + _epoch(fresh)  # the rest of the saved epoch, then the next
        epoch, batch = position
        _same_batches(resumed, epochs[epoch][batch:] + epochs[epoch + 1], f"{point}: resumed at {position}")


def _checkpointed(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _epoch(loader: Any) -> list[Any]:
    return [_clone(batch) for batch in loader]


def _clone(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, list | tuple):
        return type(batch)(_clone(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _clone(v) for k, v in batch.items()}
    return batch


def _same_batches(got: list[Any], expected: list[Any], what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches, expected {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        _same(a, b, f"{what}, batch {i}")


def _same(a: Any, b: Any, where: str) -> None:
    """``a`` is ``b`` bit for bit: the same structure, and tensors of one dtype, shape and bytes."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), f"{where}: {type(a).__name__}, expected a tensor"
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (
            f"{where}: {a.dtype} {tuple(a.shape)}, expected {b.dtype} {tuple(b.shape)}"
        )
        assert torch.equal(_bits(a), _bits(b)), f"{where}: {_differing(a, b)} of {b.numel()} values differ"
    elif isinstance(b, list | tuple):
        assert isinstance(a, list | tuple) and len(a) == len(b), f"{where}: {a!r:.80}, expected {len(b)} parts"
        for k, (u, v) in enumerate(zip(a, b, strict=True)):
            _same(u, v, f"{where}[{k}]")
    elif isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for k in b:
            _same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, f"{where}: {a!r}, expected {b!r}"


_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values as integers of its width: NaNs and signed zeros compared by their bits."""
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point and not t.dtype.is_complex:
        return t.view(_SAME_WIDTH[t.element_size()])
    return t


def _differing(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((_bits(a) != _bits(b)).sum())
