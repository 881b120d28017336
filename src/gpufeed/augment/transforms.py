"""Batched augmentation transforms: small callables over ``(N, C, H, W)`` batches.

Each transform draws its own parameters for every sample in one call (``sample``) and applies
them with a pure function from :mod:`gpufeed.augment.functional` (``apply``). Random transforms
take randomness only from the ``generator=`` passed in, never from torch's global RNG, so a
loader can make every batch reproducible from its seed: a ``torch.Generator`` (one stream per batch),
or a :class:`~gpufeed.augment.keyed.KeyedDraws` (draws keyed by seed, epoch and sample id, so that a
sample is augmented the same in any batch; the draw functions in :mod:`gpufeed.augment.params` take either).

This module holds the base classes, the value ops that :class:`Compose` fuses with the crops and flips
(``Normalize``, ``ConvertDtype``) and ``Compose`` itself; the crops and flips are in :mod:`.crop_flip`, the
erasing ops in :mod:`.erasing`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError, DataError, DeviceError
from ..store.ragged import Ragged
from . import chunks as C
from . import functional as F
from . import geometry as G
from .fusion import NotCompiled
from .keyed import KeyedDraws
from .moves import compose, fused_moves
from .params import Draws
from .paths import host_path

__all__ = [
    "BatchTransform",
    "Compose",
    "ConvertDtype",
    "GeometricTransform",
    "Normalize",
    "takes_ragged",
]

Params = dict[str, Any]


def _check_generator(generator: Draws | None, x: torch.Tensor | Ragged, op: str) -> Draws:
    """The op's draws, or a typed error: none given, or on another device than the batch (keyed: or another
    number of ids than samples)."""
    if generator is None:
        raise ConfigError(
            f"{op} is random and needs generator=torch.Generator(device={x.device.type!r}).manual_seed(SEED) "
            "(or gpufeed.augment.KeyedDraws(seed, epoch, ids) for draws keyed per sample); "
            "gpufeed never draws from torch's global RNG"
        )
    if isinstance(generator, KeyedDraws):
        if generator.device != x.device:
            raise DeviceError(
                f"{op}: KeyedDraws' ids are on {str(generator.device)!r} but the batch is on {str(x.device)!r}; "
                f"move them: KeyedDraws(seed, epoch, ids.to({str(x.device)!r}))"
            )
        if len(generator) != len(x):
            raise ConfigError(
                f"{op}: KeyedDraws holds {len(generator)} ids for a batch of {len(x)} samples; give one id per sample"
            )
        return generator
    if generator.device.type != x.device.type:
        raise DeviceError(
            f"{op}: generator is on {generator.device.type!r} but the batch is on {x.device.type!r}; "
            f"create it with torch.Generator(device={x.device.type!r})"
        )
    return generator


def _check_input(x: object, op: BatchTransform) -> None:
    if isinstance(x, Ragged):
        if not op.ragged_input:
            raise DataError(
                f"{type(op).__name__} needs images of one size, but this batch holds images of different sizes: "
                "put RandomResizedCrop first (it draws each image's box from that image's size)"
            )
        return
    F.check_batch(x)


class BatchTransform:
    """Base class: ``out = t(batch, generator=g)`` equals ``t.apply(batch, t.sample(batch, g))``."""

    random: bool = True

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        """Draw this transform's parameters for every sample of ``x`` (on ``x.device``), from a generator or keyed
        draws (through :mod:`gpufeed.augment.params`' draw functions, which take either)."""
        return {}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        """Apply the transform with given per-sample parameters (deterministic)."""
        raise NotImplementedError

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) of the output for inputs of this size (crops and resizes change it)."""
        return height, width

    def describe(self) -> str:
        """How a person reads this op in a plan (its repr, unless that shows internals)."""
        return repr(self)

    ragged_input = False  # True for an op that takes images of different sizes (a Ragged batch)
    one_size_output = False  # True for an op whose output has one size whatever its input's (RandomResizedCrop)
    fuses_tail = False  # True for an op that can run the flips and Normalize after it in its own loops

    def apply_tail(
        self, x: torch.Tensor | Ragged, params: Params, flips: Sequence[tuple[str, torch.Tensor]], normalize: Any
    ) -> torch.Tensor:
        """``apply``, then the flips (their axes and masks) and ``normalize`` (Normalize's mean, std and reciprocal,
        or None), as one op (``fuses_tail``), or :class:`~gpufeed.augment.fusion.NotCompiled` before any work."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, generator: Draws | None = None) -> torch.Tensor:
        _check_input(x, self)
        if not self.random:
            return self.apply(x, {})
        return self.apply(x, self.sample(x, _check_generator(generator, x, type(self).__name__)))


class GeometricTransform(BatchTransform):
    """A transform that only moves pixels (crop, flip): :class:`Compose` fuses a run of them into one gather."""

    flips: str | None = None  # a flip's axis ("cols", "rows"): an op with ``fuses_tail`` can read it in its taps

    def draw(self, n: int, height: int, width: int, device: torch.device, generator: Draws) -> Params:
        """Draw parameters for ``n`` samples of size ``(height, width)``; needs no pixels."""
        raise NotImplementedError

    def index_map(self, params: Params, height: int, width: int) -> G.IndexMap:
        """Where each output pixel reads from, for inputs of size ``(height, width)``."""
        raise NotImplementedError

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        return self.draw(x.shape[0], x.shape[2], x.shape[3], x.device, generator)

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return F.remap(x, self.index_map(params, x.shape[2], x.shape[3]))


@dataclass(frozen=True)
class Normalize(BatchTransform):
    """``(x - mean) / std`` per channel; uint8 input is divided by 255 first (``ToTensor``).

    Example:
        >>> Normalize([0.5], [0.5])(torch.full((1, 1, 1, 1), 255, dtype=torch.uint8)).item()
        1.0
    """

    mean: Sequence[float]
    std: Sequence[float]
    dtype: torch.dtype = torch.float32
    reciprocal: bool = False  # uint8 input scaled by * (1/255), as transforms.v2.ToDtype does
    random = False

    def __post_init__(self) -> None:
        mean, std = tuple(float(m) for m in self.mean), tuple(float(s) for s in self.std)
        if len(mean) != len(std) and 1 not in (len(mean), len(std)):
            raise ConfigError(f"mean={self.mean!r} and std={self.std!r} must have the same length")
        if any(s == 0 for s in std):
            raise ConfigError(f"std={self.std!r} must not contain 0")
        if not all(math.isfinite(v) for v in (*mean, *std)):  # every pixel would be NaN, or 0 for an infinite std
            raise ConfigError(f"Normalize: mean={self.mean!r} and std={self.std!r} must be finite numbers")
        if not self.dtype.is_floating_point:
            raise ConfigError(f"dtype={self.dtype} must be a floating dtype")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        return F.normalize(x, self.mean, self.std, self.dtype, self.reciprocal)

    def describe(self) -> str:
        scale = "x * (1/255)" if self.reciprocal else "x / 255"
        return f"Normalize(mean={self.mean}, std={self.std}; uint8 scaled by {scale} first, as your ToTensor/ToDtype)"


@dataclass(frozen=True)
class ConvertDtype(BatchTransform):
    """Change dtype with torchvision's ``ConvertImageDtype`` scaling (uint8 -> float divides by 255)."""

    dtype: torch.dtype = torch.float32
    reciprocal: bool = False  # uint8 -> float by * (1/255), as transforms.v2.ToDtype does
    random = False
    ragged_input = True  # per element: images of different sizes convert as they are (ToTensor before a crop)

    def apply(self, x: torch.Tensor | Ragged, params: Params) -> torch.Tensor:
        if isinstance(x, Ragged):
            return Ragged(F.convert_dtype(x.data, self.dtype, self.reciprocal), x.starts, x.shapes, x.hwc)  # type: ignore[return-value]
        return F.convert_dtype(x, self.dtype, self.reciprocal)

    def describe(self) -> str:
        name = str(self.dtype).replace("torch.", "")
        scale = " (uint8 scaled by x * (1/255), as ToDtype)" if self.reciprocal else " (uint8 scaled by x / 255)"
        return f"to {name}" + (scale if self.dtype.is_floating_point else "")


class Compose(BatchTransform):
    """Apply transforms in order, all drawing from the one generator passed in (keyed draws: each op from its own
    stream, ``draws.child(position)``, position in the flattened list).

    Consecutive crops and flips are fused: their index maps are composed and the batch is read
    once, which gives the same pixels as applying them one by one. A nested ``Compose`` is
    flattened into its transforms (the same draws, in the same order).

    Example:
        >>> from gpufeed.augment import RandomCrop, RandomHorizontalFlip
        >>> aug = Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), Normalize([0.5] * 3, [0.25] * 3)])
        >>> aug(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), generator=torch.Generator().manual_seed(0)).dtype
        torch.float32
    """

    def __init__(self, transforms: Sequence[BatchTransform]) -> None:
        transforms = list(transforms)
        for i, t in enumerate(transforms):
            if not isinstance(t, BatchTransform):
                raise ConfigError(
                    f"transforms[{i}]={t!r} is not a gpufeed.augment transform; "
                    "batched ops take (N, C, H, W) tensors and a generator"
                )
        flat: list[BatchTransform] = []
        for t in transforms:  # a nested Compose contributes its ops
            flat += t.transforms if isinstance(t, Compose) else [t]
        self.transforms: list[BatchTransform] = flat
        self.random = any(t.random for t in self.transforms)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        for t in self.transforms:
            height, width = t.output_size(height, width)
        return height, width

    def __call__(self, x: torch.Tensor, generator: Draws | None = None) -> torch.Tensor:
        if self.transforms:
            _check_input(x, self.transforms[0])
        if self.random:
            generator = _check_generator(generator, x, "Compose")
        if isinstance(generator, KeyedDraws):  # one draw of the caller's stream per call, as a generator advances:
            generator = generator.spawn()  # a second call (another view) draws anew; the ops' children come from it
        sources = [_op_draws(generator, k, t) for k, t in enumerate(self.transforms)]
        drawn: dict[int, Params] = {}  # a tail's flips, drawn for a fused resize that then did not run
        if isinstance(x, Ragged):  # ops that take it, up to the one that makes the batch one size; then as usual
            for k, t in enumerate(self.transforms):
                _check_input(x, t)
                params = t.sample(x, sources[k]) if t.random else {}
                tail = _fused_tail(x, k, params, self.transforms, sources, drawn) if t.fuses_tail else None
                x, after = tail if tail is not None else (t.apply(x, params), k + 1)
                if not isinstance(x, Ragged):
                    if after == len(self.transforms):
                        return x
                    _check_input(x, self.transforms[after])
                    return self._dense(x, after, sources, drawn)
            return x
        return self._dense(x, 0, sources, drawn)

    def _dense(
        self, x: torch.Tensor, first: int, sources: list[Draws | None], drawn: dict[int, Params]
    ) -> torch.Tensor:
        """The ops from ``first`` on a batch of one size, each drawing from its source (``sources[k]``: the one
        generator, or keyed, op ``k``'s own stream), or taking what was drawn for it (``drawn``)."""
        n, _, h, w = x.shape
        ops = self.transforms
        pending: list[tuple[GeometricTransform, Params, int, int]] = []  # the crops and flips not yet applied
        k = first
        while k < len(ops):
            t, source = ops[k], sources[k]
            if isinstance(t, GeometricTransform):
                params = drawn.pop(k) if k in drawn else t.draw(n, h, w, x.device, source)  # type: ignore[arg-type]
                pending.append((t, params, h, w))
                h, w = t.output_size(h, w)
                k += 1
                continue
            if pending:
                x, normalized = _move(x, pending, t if isinstance(t, Normalize) else None)
                pending = []
                if normalized:
                    k += 1
                    continue
            params = t.sample(x, source) if t.random else {}  # type: ignore[arg-type]
            tail = _fused_tail(x, k, params, ops, sources, drawn) if t.fuses_tail else None
            if tail is not None:
                x, k = tail
            else:
                x = t.apply(x, params)
                k += 1
            h, w = x.shape[-2:]  # a resize changes the size the next crop or flip draws for
        return _move(x, pending)[0] if pending else x

    def __repr__(self) -> str:
        body = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose([{body}\n])"


def _op_draws(generator: Draws | None, position: int, op: BatchTransform) -> Draws | None:
    """What op ``position`` of a Compose draws from: the one generator (its stream shared in order, as always),
    or keyed, the op's own child stream, so that what one op draws (or does not draw, on a batch where it applies
    to no sample) never moves another op's draws."""
    if isinstance(generator, KeyedDraws) and op.random:
        return generator.child(position)
    return generator


def _fused_tail(
    x: torch.Tensor | Ragged,
    k: int,
    params: Params,
    ops: list[BatchTransform],
    sources: list[Draws | None],
    drawn: dict[int, Params],
) -> tuple[torch.Tensor, int] | None:
    """Op ``k`` (``fuses_tail``: a resize) with the flips after it and a Normalize after those, as one op: the
    result and the next op's place; None where it does not run so (no tail; no compiler), the flips' draws then
    kept in ``drawn`` for the ops that run one by one. The flips draw as they would after the resize, in order
    (for its output size: an op that takes a Ragged batch makes one size whatever the input's)."""
    end = k + 1
    while end < len(ops) and isinstance(ops[end], GeometricTransform) and ops[end].flips:  # type: ignore[attr-defined]
        end += 1
    last = ops[end] if end < len(ops) else None
    then = last if isinstance(last, Normalize) else None
    if (end == k + 1 and then is None) or (then is not None and then.dtype != torch.float32):
        return None
    out_h, out_w = ops[k].output_size(*((x.shape[2], x.shape[3]) if isinstance(x, torch.Tensor) else (0, 0)))
    for j in range(k + 1, end):
        drawn[j] = ops[j].draw(len(x), out_h, out_w, x.device, sources[j])  # type: ignore[attr-defined]
    flips = [(ops[j].flips, drawn[j]["mask"]) for j in range(k + 1, end)]  # type: ignore[attr-defined]
    normalize = (then.mean, then.std, then.reciprocal) if then is not None else None
    try:
        out = ops[k].apply_tail(x, params, flips, normalize)
    except NotCompiled:
        return None
    for j in range(k + 1, end):
        del drawn[j]
    return out, end + (then is not None)


def _move(
    x: torch.Tensor, pending: list[tuple[GeometricTransform, Params, int, int]], then: Normalize | None = None
) -> tuple[torch.Tensor, bool]:
    """``x`` through the ``pending`` crops and flips (their composed maps: one read of the batch, two where two
    paddings' fills differ), and whether the ``Normalize`` that follows (``then``) was applied too: on the device's
    path compiled into one gather where the compiler runs (:mod:`.moves`), else as :func:`_remap` does."""
    if not host_path(x):
        uint8_float = then is not None and x.dtype == torch.uint8 and then.dtype == torch.float32
        normalize = (then.mean, then.std, then.reciprocal) if uint8_float else None  # type: ignore[union-attr]
        try:
            return fused_moves(x, pending, normalize), normalize is not None
        except NotCompiled:
            pass
    x, m = compose(x, pending, lambda y, part: _remap(y, part)[0])
    return _remap(x, m, then)


def _remap(x: torch.Tensor, m: G.IndexMap, then: Normalize | None = None) -> tuple[torch.Tensor, bool]:
    """``x`` through the crops and flips of ``m``, and whether the ``Normalize`` that follows (``then``) was
    applied too: on the CPU, a chunk of samples at a time, each output row one window of the batch, and each
    chunk normalised while it is in the cache (see :mod:`gpufeed.augment.chunks`)."""
    if not host_path(x):
        return F.remap(x, m), False
    fill = F.constant(m.fill, x, "fill") if m.fill is not None else None
    if then is None or x.dtype != torch.uint8:
        return C.remap_chunked(x, m, fill), False
    stats = F.float_constants(then.mean, then.std, x.shape[1])
    return C.remap_chunked(x, m, fill, (*stats, then.reciprocal, then.dtype)), True


def takes_ragged(transform: BatchTransform | None) -> bool:
    """Whether ``transform`` makes images of different sizes one size before any op that needs one size:
    ops that take them (a dtype conversion) up to one that makes them one size (RandomResizedCrop)."""
    ops = transform.transforms if isinstance(transform, Compose) else [transform] if transform is not None else []
    for op in ops:
        if not op.ragged_input:
            return False
        if op.one_size_output:
            return True
    return False
