"""The probed samples against each view's pipeline, before the dataset is read: what torchvision refuses, or
computes otherwise, on samples of their form (numpy arrays, tensors: :mod:`.translate.inputs`), their PIL mode
(:mod:`.translate.modes`) and their channel count (:mod:`gpufeed.augment.channels`, Normalize's values), and the
check of every sample's mode while the dataset is read (or on a cache hit: :func:`.entries.mode_check`). ``sample``
is the probe's :class:`gpufeed.pipeline.probe.Probe` (typed Any: the probe imports this module)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..augment.channels import fix_words, refusal_words
from ..errors import UnsupportedTransformError
from ..validate import UnbatchableError
from .translate import flatten, kind
from .translate.inputs import check_form
from .translate.modes import check_modes, mode_bound
from .translate.refusals import normalize_channels, refusal
from .translate.state import is_v2

__all__ = ["check_samples", "refuse_channels"]


def check_samples(views: Sequence[Sequence[Any]], sample: Any, source: str) -> Callable[[int, str | None], None] | None:
    """What each view meets on the probed samples' PIL mode (:func:`gpufeed.pipeline.translate.modes.check_modes`),
    and the check of every sample the read meets: where what the ops compute depends on the mode, each sample must
    have the mode they were built for (one of another mode is refused as its own mode is, else left to the
    fallback). Samples that are numpy arrays or tensors meet what :mod:`gpufeed.pipeline.translate.inputs` says."""
    first = f"{source}[{sample.modes[0][0]}]" if sample.modes else f"{source}[0]"
    for ops in views:
        check_form(ops, sample.form, first)
    if sample.mode is None:
        return None
    for ops in views:
        check_modes(ops, sample.mode, first)
    if not any(mode_bound(ops) for ops in views):
        return None
    check = functools.partial(_same_mode, views, sample.mode, first, source)
    for i, mode in sample.modes[1:]:
        check(i, mode)
    return check


def _same_mode(views: Sequence[Sequence[Any]], mode: str, first: str, source: str, i: int, got: str | None) -> None:
    if got == mode:
        return
    where = f"{source}[{i}]"
    if got is not None:
        for ops in views:
            check_modes(ops, got, where)
    raise UnbatchableError(
        f"{where} is a {got or 'non-PIL'} image but {first} a {mode} one, and the pipeline computes on PIL images "
        f"what depends on their mode: gpufeed batches one mode; convert every image to one mode in the dataset's "
        "loader (Image.open(f).convert('RGB')), or pass fallback='prefetch' to run your pipeline per sample"
    )


_CONTAINERS = ("RandomApply", "RandomChoice", "RandomOrder")
_TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "MaybeToTensor", "MaybePILToTensor")


def refuse_channels(ops: Sequence[Any], sample: Any, source: str) -> None:
    """Raise what torchvision raises for the images' channel count at each op's place in the pipeline (a PIL image
    or a tensor, v1 or v2: :func:`gpufeed.augment.channels.refusal_words`), before the dataset is read.

    Decided by the pipeline alone, never by a draw: a RandomGrayscale(p=0.1) that happened not to fire on the
    probed samples would still raise on the tenth image of an epoch."""
    if sample.channels is not None:
        where = f"{source}[{sample.modes[0][0] if sample.modes else 0}]"
        _walk_channels(ops, sample, sample.pil, sample.dtype, sample.channels, where)


def _walk_channels(ops: Sequence[Any], sample: Any, pil: bool, dtype: torch.dtype, channels: int, where: str) -> None:
    """:func:`refuse_channels` from one place on, the image being ``pil`` or a tensor of ``dtype`` there."""
    for op in ops:
        name = kind(op)
        if name in _CONTAINERS:  # their ops see the images as they are here (and may not change them)
            _walk_channels([inner for t in op.transforms for inner in flatten(t)], sample, pil, dtype, channels, where)
            continue
        if name == "Normalize" and not pil:
            _normalize_channels(op, dtype, channels, sample, where)
        said = refusal_words(name, op, channels, pil, is_v2(op))
        if said is not None:
            raise refusal(op, dtype, pil, said, fix_words(int(sample.channels or channels), sample.pil))
        if name in _TO_TENSOR:
            pil, dtype = False, torch.float32 if name in ("ToTensor", "MaybeToTensor") else dtype
        elif name in ("ToDtype", "ConvertImageDtype") and isinstance(getattr(op, "dtype", None), torch.dtype):
            dtype = op.dtype
        elif name == "Grayscale":
            channels = int(op.num_output_channels)


def _normalize_channels(op: Any, dtype: torch.dtype, channels: int, sample: Any, where: str) -> None:
    """Normalize's mean and std against the images' channel count (:func:`.translate.refusals.normalize_channels`)."""
    found = normalize_channels(op, channels)
    if found is None:
        return
    what, said = found
    n = len(op.mean) if isinstance(op.mean, (list, tuple)) else 1
    head = f"mean and std of {n} values on images of {channels} channels ({where} has {channels})"
    convert = (
        "; or convert the images to RGB (Image.open(f).convert('RGB'))" if sample.mode not in (None, "RGB") else ""
    )
    fix = f"give Normalize one value, or one per channel ({channels}){convert}"
    if what == "refused":
        raise refusal(op, dtype, False, f"{said}: {head}", fix)
    raise UnsupportedTransformError(
        f"{op!r}: {head}: {said}, which gpufeed does not batch; {fix}, or pass fallback='prefetch' to run your "
        "pipeline as it is"
    )
