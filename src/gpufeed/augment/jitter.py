"""ColorJitter's four adjustments in a per-sample order, fused: two passes over a uint8 RGB batch.

The eager ops (:mod:`.color`) follow torchvision's tensor kernels op for op; each adjustment there is a dozen
passes over the batch, and a GPU batch runs every adjustment in every slot to keep the one its order picks
(510 kernel-launching operators per batch). Here the same arithmetic runs per pixel in compiled functions
(:func:`gpufeed.augment.fusion.fused`): the ColorJitter + crop + flip + normalise recipe dispatches 61 launching
operators per batch on the GPU's path (benchmarks/launches.py), 13 of them the fused kernels.

- Brightness, contrast and saturation are one formula: torchvision's ``_blend(img, other, ratio)``, with
  ``other`` black (brightness: ``ratio * x + (1 - ratio) * 0`` is ``ratio * x``, bit for bit), the sample's mean
  gray (contrast) or the pixel's gray (saturation). With k adjustments enabled there are k slots; each is that
  blend with the slot's ratio, ``1 - ratio`` and kind per sample, read from small ``(N, k)`` tables; a slot that
  is not a blend for a sample (hue's, or one masked off) gets ratio 1 and rest 0, which leaves an integer value
  unchanged.
- Hue runs once per pixel: the blend slots before the sample's hue slot, then the HSV round trip, then the
  slots after it (each side masked by the tables).
- Contrast blends with the mean gray of the image as it is in contrast's slot: a first pass computes the image up
  to that slot and sums its gray per sample. The gray levels are integers: while their total is under 2**24 every
  partial sum is an integer float32 holds exactly, so the float32 sum is the same in any order, and equals torch's
  (checked: ``torch.mean`` is that sum over the pixel count). Larger images (over 65,793 pixels: 257 x 256) take
  the gray image from the first pass and torch's own mean.

Values are carried as float32 holding the integers uint8 holds between adjustments (each adjustment there ends in
``.to(uint8)``, a truncation: here ``floor`` of a value clamped to [0, 255]).
"""

from __future__ import annotations

import functools

import torch

from .fusion import NotCompiled, compiling, fused
from .hsv import shift_hue, to_hsv, to_rgb

__all__ = ["jitter"]

BRIGHTNESS, CONTRAST, SATURATION, HUE = range(4)  # the adjustments' ids, as ColorJitter orders them
_EXACT_SUM_PIXELS = (1 << 24) // 255  # below this, a float32 sum of gray levels is exact in any order


State = tuple[torch.Tensor, ...]  # the batch as float32 levels: one (N, 3, H, W) tensor, or three (N, 1, H, W) planes


def _rgb(v: State) -> State:
    return v if len(v) == 3 else (v[0][:, 0:1], v[0][:, 1:2], v[0][:, 2:3])


def _gray(v: State) -> torch.Tensor:
    """torchvision's rgb_to_grayscale, truncated: ``(N, 1, H, W)``."""
    r, g, b = _rgb(v)
    return torch.floor(0.2989 * r + 0.587 * g + 0.114 * b)


def _blends(v: State, tables: tuple, mean: torch.Tensor, kinds: frozenset[int]) -> State:
    """Each slot's blend from the ``(N, slots)`` tables of ratio, ``1 - ratio`` and kind (-1: leave the value);
    ``kinds``: the blends enabled (a gray is computed only for saturation, a mean read only for contrast)."""
    ratio, rest, kind = tables
    for k in range(kind.shape[1]):
        rk, sk, kk = (t[:, k].view(-1, 1, 1, 1) for t in (ratio, rest, kind))
        other = torch.where(kk == CONTRAST, mean, 0.0) if CONTRAST in kinds else None
        if SATURATION in kinds:
            other = torch.where(kk == SATURATION, _gray(v), other if other is not None else 0.0)
        # brightness alone: ratio * x (+ (1 - ratio) * black, which adds nothing)
        v = tuple(torch.floor((c * rk if other is None else c * rk + other * sk).clamp(0, 255)) for c in v)
    return v


def _hue(v: State, f: torch.Tensor) -> State:
    """torchvision's adjust_hue on integer-valued floats: to [0, 1], HSV (.hsv), the shift, RGB, back to levels
    (convert_image_dtype's float -> uint8: times 255.999, truncated)."""
    h, s, value = to_hsv(*(c / 255 for c in _rgb(v)))
    return tuple(torch.floor(c * (255 + 1.0 - 1e-3)) for c in to_rgb(shift_hue(h, f), s, value))


def _tables(order: torch.Tensor, factors: list[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    """The enabled adjustments in each sample's order, one slot each (``(N, k)``): the blend's ratio and
    ``1 - ratio`` (computed in double, as torchvision), its kind (-1 for hue), and the slots of contrast and hue
    (k where disabled: after every slot)."""
    enabled = torch.tensor([f is not None for f in factors], device=order.device)
    k = int(sum(f is not None for f in factors))
    # the enabled ids in slot order: a stable sort puts each row's enabled entries first, in their order
    order = order.gather(1, torch.argsort((~enabled[order]).to(torch.uint8), dim=1, stable=True)[:, :k])
    ratio = torch.ones(order.shape, dtype=torch.float32, device=order.device)
    rest = torch.zeros(order.shape, dtype=torch.float32, device=order.device)
    kind = torch.full_like(order, -1)
    for j in (BRIGHTNESS, CONTRAST, SATURATION):
        f = factors[j]
        if f is None:
            continue
        at = order == j
        ratio = torch.where(at, f.view(-1, 1).to(torch.float32), ratio)
        rest = torch.where(at, (1.0 - f.view(-1, 1).to(torch.float64)).to(torch.float32), rest)
        kind = torch.where(at, j, kind)
    slot = torch.arange(k, device=order.device)
    contrast_slot, hue_slot = (((order == j) * slot + k * (order != j)).min(dim=1).values for j in (CONTRAST, HUE))
    return ratio, rest, kind, contrast_slot, hue_slot


def _before(limit: torch.Tensor, tables: tuple, after: torch.Tensor | None = None) -> tuple:
    """The tables with every slot at or after ``limit`` (and at or before ``after``) made to leave the value."""
    ratio, rest, kind = tables
    slot = torch.arange(kind.shape[1], device=kind.device).view(1, -1)
    live = slot < limit.view(-1, 1)
    if after is not None:
        live = live & (slot > after.view(-1, 1))
    return torch.where(live, ratio, 1.0), torch.where(live, rest, 0.0), torch.where(live, kind, -1)


def _chain(v: State, tables: tuple, hue: torch.Tensor | None, hue_slot: torch.Tensor, upto: torch.Tensor,
           mean: torch.Tensor, kinds: frozenset[int]) -> State:  # fmt: skip
    """The slots before ``upto`` per sample: the blends before hue, hue (where before ``upto``), the rest."""
    if hue is None:
        return _blends(v, _before(upto, tables), mean, kinds)
    v = _rgb(_blends(v, _before(torch.minimum(upto, hue_slot), tables), mean, kinds))
    keep = (hue_slot < upto).view(-1, 1, 1, 1)
    v = tuple(torch.where(keep, t, c) for t, c in zip(_hue(v, hue.view(-1, 1, 1, 1)), v, strict=True))
    return _blends(v, _before(upto, tables, after=hue_slot), mean, kinds)


_OP, _EAGER_COST = "ColorJitter", "the same pixels, 6-18x slower (measured at 224 px, CPU)"
# the order's 4 slots compiled as a constant: a symbol shared with a batch of 4 at the first call would recompile at
# the next batch size
_ORDER = {1: (1,)}


@functools.cache
def _kernels(enabled: tuple[bool, ...]) -> tuple:
    """The three fused functions for one set of enabled adjustments (each its own compiled code), each taking the
    batch, the order and the four factors (a disabled one: any ``(N,)`` tensor, unread), and computing the slot
    tables itself (a few dozen small ops, which a GPU would launch one by one, fused into the first loop).

    Brightness and contrast alone act on each channel by itself: the batch is one tensor, which Inductor's C++
    vectorises 3.5x faster than three planes stacked at the end (brightness at 224 px: 4.3 against 15 ms). A gray
    per pixel (saturation) or hue mixes the channels: there the batch is three planes, each computed once per pixel
    (as one tensor, each channel of a slot would recompute all three of the slot before, 3**slots times), returned
    as three outputs of one loop and stacked after it (faster than stacking inside: 16.9 against 20.4 ms)."""
    kinds = frozenset(j for j in (BRIGHTNESS, CONTRAST, SATURATION) if enabled[j])
    planes = enabled[HUE] or SATURATION in kinds
    alone = sum(enabled) == 1

    def levels(x: torch.Tensor) -> State:
        v = x.to(torch.float32)
        return tuple(v.split(1, dim=1)) if planes else (v,)

    def state(x: torch.Tensor, order: torch.Tensor, factors: tuple, upto: str, mean: torch.Tensor) -> State:
        """The batch through the slots before contrast's (``upto="contrast"``) or through all of them."""
        ratio, rest, kind, contrast_slot, hue_slot = _tables(
            order, [f if on else None for f, on in zip(factors, enabled, strict=True)]
        )
        limit = contrast_slot if upto == "contrast" else torch.full_like(hue_slot, kind.shape[1])
        hue = factors[HUE].to(torch.float32) if enabled[HUE] else None
        return _chain(levels(x), (ratio, rest, kind), hue, hue_slot, limit, mean, kinds)

    @fused(_OP, _EAGER_COST, static=_ORDER)
    def mean_gray(
        x: torch.Tensor, order: torch.Tensor, b: torch.Tensor, c: torch.Tensor, s: torch.Tensor, h: torch.Tensor
    ) -> torch.Tensor:
        """Per sample, the mean gray of the image in contrast's slot: a float32 sum of integers under 2**24, exact
        in any order (see the module's text), over the pixel count, as torch.mean divides."""
        zero = torch.zeros((), dtype=torch.float32, device=x.device)
        # contrast alone has nothing before it: its image is the batch (the masked chain, a no-op, is not unrolled
        # into the reduction, which it made 10x slower)
        gray = _gray(levels(x) if alone else state(x, order, (b, c, s, h), "contrast", zero))
        return (gray.sum(dim=(1, 2, 3), keepdim=True) / (x.shape[2] * x.shape[3])).view(-1, 1, 1, 1)

    @fused(_OP, _EAGER_COST, static=_ORDER)
    def gray_image(
        x: torch.Tensor, order: torch.Tensor, b: torch.Tensor, c: torch.Tensor, s: torch.Tensor, h: torch.Tensor
    ) -> torch.Tensor:
        """Per sample, the gray image in contrast's slot (images too large for an exact float32 sum)."""
        zero = torch.zeros((), dtype=torch.float32, device=x.device)
        return _gray(state(x, order, (b, c, s, h), "contrast", zero))

    @fused(_OP, _EAGER_COST, static=_ORDER)
    def jitter(
        x: torch.Tensor,
        order: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        s: torch.Tensor,
        h: torch.Tensor,
        mean: torch.Tensor,
    ) -> State:
        """The adjustments in each sample's order: the batch, or its three planes."""
        return tuple(v.to(torch.uint8) for v in state(x, order, (b, c, s, h), "all", mean))

    return mean_gray, gray_image, jitter


def jitter(x: torch.Tensor, order: torch.Tensor, factors: list[torch.Tensor | None]) -> torch.Tensor:
    """ColorJitter on a uint8 RGB batch: ``factors[j]`` per sample for brightness, contrast, saturation, hue (None:
    not enabled), applied in each sample's ``order``; the pixels of the eager ops (.color), bit for bit. Raises
    :class:`~gpufeed.augment.fusion.NotCompiled` where it does not run compiled."""
    if not compiling(x.device) or min(x.shape) < 2:
        raise NotCompiled  # before any work here (the fused functions would raise it too)
    mean_gray, gray_image, run = _kernels(tuple(f is not None for f in factors))
    given = next(f for f in factors if f is not None)
    args = [f if f is not None else given for f in factors]  # one signature for every set (a disabled one unread)
    mean = torch.zeros((x.shape[0], 1, 1, 1), dtype=torch.float32, device=x.device)
    if factors[CONTRAST] is not None:
        try:
            if x.shape[2] * x.shape[3] <= _EXACT_SUM_PIXELS:
                mean = mean_gray(x, order, *args)
            else:  # torch's own float mean, as torchvision's (N, 1, H, W) gray image is reduced
                mean = torch.mean(gray_image(x, order, *args), dim=(-3, -2, -1), keepdim=True)
        except NotCompiled:
            run.prepare(x, order, *args, mean)  # the adjustments compile too, not only once the mean is compiled
            raise
    out = run(x, order, *args, mean)
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)
