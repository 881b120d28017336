"""timm's RandAugment and AutoAugment (``timm.data.auto_augment``), batched, in PIL's arithmetic.

timm's auto-augment runs only on PIL images: each ``AugmentOp`` applies with its probability, draws
its magnitude (``gauss(magnitude, magnitude_std)``, or uniform below it for an infinite std),
clips it to ``[0, magnitude_max or 10]``, turns it into the op's argument (a random sign for the
geometric ops and the ``*Increasing`` enhancements) and runs a PIL kernel; the geometric ones draw
their resampling filter from the op's list. ``RandAugment`` picks ``num_layers`` ops per image
(with replacement, or weighted without), ``AutoAugment`` one of its sub-policies.

Here every sample draws the same way from the loader's generator (the same distributions; not
Python's ``random`` stream), the batch is split by op and each op runs once on its share, with
:mod:`gpufeed.augment.pil`'s kernels: the affine ones resample as Pillow's ``Image.transform``
does, the enhancements blend as ``Image.blend``; equalize is torchvision's port of PIL's.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from . import pil
from .auto_ops import equalize, posterize
from .params import Draws, rand, randint, randn, without_replacement
from .transforms import BatchTransform, Params

__all__ = ["NAMES", "Hparams", "TimmAutoAugment", "TimmOp", "TimmRandAugment"]

# The op names of timm's NAME_TO_OP that gpufeed batches (the GaussianBlur ones it does not).
NAMES = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Posterize",
    "PosterizeIncreasing",
    "PosterizeOriginal",
    "Solarize",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "Color",
    "ColorIncreasing",
    "Contrast",
    "ContrastIncreasing",
    "Brightness",
    "BrightnessIncreasing",
    "Sharpness",
    "SharpnessIncreasing",
    "Desaturate",
    "Rotate",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "TranslateXRel",
    "TranslateYRel",
)
_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel")
_SIGNED = (*_GEOMETRIC, "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing")
MODES = ("nearest", "bilinear", "bicubic")


@dataclass(frozen=True)
class TimmOp:
    """One of timm's ``AugmentOp``: its name, probability, magnitude (0-10 scale) and magnitude noise."""

    name: str
    prob: float = 0.5
    magnitude: float = 10.0
    magnitude_std: float = 0.0  # > 0: gauss(magnitude, std); inf: uniform(0, magnitude)
    magnitude_max: float | None = None  # the clip's upper bound (timm: None or 0 -> 10)

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ConfigError(f"timm op {self.name!r} is not batched by gpufeed; the ones it batches: {NAMES}")
        if not 0.0 <= self.prob <= 1.0:
            raise ConfigError(f"{self.name}: prob={self.prob} must be in [0, 1]")


@dataclass(frozen=True)
class Hparams:
    """The hyper-parameters all of a timm policy's ops share: fill, interpolations, translate sizes."""

    fill: tuple[int, ...]
    interpolation: tuple[str, ...]
    translate_const: float
    translate_pct: float

    @staticmethod
    def make(
        fill: int | Sequence[int], interpolation: str | Sequence[str], translate_const: float, translate_pct: float
    ) -> Hparams:
        modes = (interpolation,) if isinstance(interpolation, str) else tuple(interpolation)
        if not modes or any(m not in MODES for m in modes):
            raise ConfigError(f"interpolation={interpolation!r}: PIL's affine transform takes {MODES}")
        fills = (int(fill),) if isinstance(fill, (int, float)) else tuple(int(v) for v in fill)
        return Hparams(fills, modes, float(translate_const), float(translate_pct))


@functools.lru_cache(maxsize=32)
def _op_table(ops: tuple[TimmOp, ...], dev: torch.device) -> dict[str, torch.Tensor]:
    """The ops' numbers as tensors on ``dev``, made once (a host-to-device copy per batch would sync)."""
    f64 = lambda values: torch.tensor(values, dtype=torch.float64, device=dev)  # noqa: E731
    return {
        "kind": torch.tensor([NAMES.index(o.name) for o in ops], device=dev),
        "prob": f64([o.prob for o in ops]),
        "magnitude": f64([float(o.magnitude) for o in ops]),
        "std": f64([float(o.magnitude_std) for o in ops]),
        "upper": f64([float(o.magnitude_max or 10.0) for o in ops]),
    }


class _TimmAugment(BatchTransform):
    """The draw and the apply both timm containers share: rounds of (op per sample, or none)."""

    ops: tuple[TimmOp, ...]
    hparams: Hparams

    def _table(self, dev: torch.device) -> dict[str, torch.Tensor]:
        return _op_table(self.ops, dev)

    def _round(self, pick: torch.Tensor, x: torch.Tensor, generator: Draws) -> dict[str, torch.Tensor]:
        """Draw one round for op ``pick[i]`` (an index into ``ops``; -1: none) of each sample, as AugmentOp does."""
        n, dev = pick.shape[0], pick.device
        t = self._table(dev)
        some = pick >= 0
        at = pick.clamp(min=0)
        u = lambda: rand(generator, (n,), dev, torch.float64)  # noqa: E731
        apply = some & (u() <= t["prob"][at])  # timm skips when random() > prob
        base, std = t["magnitude"][at], t["std"][at]
        gauss = base + std * randn(generator, (n,), dev, torch.float64)
        uniform = u() * base
        magnitude = torch.where(torch.isinf(std), uniform, torch.where(std > 0, gauss, base))
        magnitude = torch.minimum(magnitude, t["upper"][at]).clamp(min=0.0)
        sign = torch.where(u() > 0.5, -1.0, 1.0)  # _randomly_negate
        mode = randint(generator, 0, len(self.hparams.interpolation), (n,), dev)
        kind = torch.where(apply, t["kind"][at], -1)
        level = magnitude / torch.full_like(
            magnitude, 10.0
        )  # a true division, as Python's (CUDA: x * (1/10) by a scalar)
        return {"kind": kind, "arg": self._arg(kind, level, sign, x.shape[2], x.shape[3]), "mode": mode}

    def _arg(self, kind: torch.Tensor, level: torch.Tensor, sign: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Each op's argument from its level (magnitude / 10), as timm's ``LEVEL_TO_ARG`` computes it."""
        hp = self.hparams
        enhance_increasing = torch.clamp(1.0 + sign * (level * 0.9), min=0.1)
        rel = sign * (level * hp.translate_pct)
        args = {
            "Rotate": sign * (level * 30.0),
            "Posterize": torch.trunc(level * 4),
            "PosterizeIncreasing": 4 - torch.trunc(level * 4),
            "PosterizeOriginal": torch.trunc(level * 4) + 4,
            "Solarize": torch.clamp(torch.trunc(level * 256), max=256),
            "SolarizeIncreasing": 256 - torch.clamp(torch.trunc(level * 256), max=256),
            "SolarizeAdd": torch.clamp(torch.trunc(level * 110), max=128),
            "Desaturate": (1.0 - (0.5 + (1.0 - 0.5) * level).clamp(0.5, 1.0)).clamp(0.0, 1.0),
            "ShearX": sign * (level * 0.3),
            "ShearY": sign * (level * 0.3),
            "TranslateX": sign * (level * hp.translate_const),
            "TranslateY": sign * (level * hp.translate_const),
            "TranslateXRel": rel * w,  # pixels = pct * img.size[0]
            "TranslateYRel": rel * h,
        }
        for name in ("Color", "Contrast", "Brightness", "Sharpness"):
            args[name] = level * 1.8 + 0.1
            args[f"{name}Increasing"] = enhance_increasing
        out = torch.zeros_like(level)
        for name, value in args.items():
            out = torch.where(kind == NAMES.index(name), value, out)
        return out

    def describe(self) -> str:
        names = ", ".join(dict.fromkeys(o.name for o in self.ops))
        noise = {(o.magnitude, o.magnitude_std, o.magnitude_max) for o in self.ops}
        hp = self.hparams
        common = f"m={noise.pop()[0]:g}, mstd={self.ops[0].magnitude_std:g}" if len(noise) == 1 else "magnitudes per op"
        return (
            f"{type(self).__name__}({len(self.ops)} ops: {names}; {common}; {self._choice()}; "
            f"interpolation={'/'.join(hp.interpolation)}, fill={hp.fill})"
        )

    def _choice(self) -> str:
        raise NotImplementedError

    def _check(self, x: torch.Tensor) -> None:
        if x.dtype != torch.uint8 or x.shape[1] not in (1, 3):
            raise ConfigError(
                f"timm's auto-augment runs on RGB or L PIL images (uint8, 3 or 1 channels); this batch is {x.dtype} "
                f"with {x.shape[1]} channels: put it before ToTensor, as timm's create_transform does"
            )
        if len(self.hparams.fill) > x.shape[1] and any(o.name in _GEOMETRIC for o in self.ops):
            raise ConfigError(
                f"timm's geometric ops fill with img_mean={self.hparams.fill}, but the images have {x.shape[1]} "
                "channel: Pillow raises TypeError on them (3 values for an L image); give timm a one-value mean "
                "(create_transform(..., mean=(m,)))"
            )

    def _apply_round(self, x: torch.Tensor, r: dict[str, torch.Tensor]) -> torch.Tensor:
        kind = r["kind"]
        order = torch.argsort(kind, stable=True)
        counts_t = torch.bincount(kind + 1, minlength=len(NAMES) + 1)
        args, modes = r["arg"].index_select(0, order), r["mode"].index_select(0, order)
        # one host read per round: the op counts, and the arguments and filters PIL's matrices are built from
        host = torch.cat([counts_t.double(), args, modes.double()]).tolist()
        kinds, n = len(NAMES) + 1, x.shape[0]
        counts = [int(v) for v in host[:kinds]]
        host_args, host_modes = host[kinds : kinds + n], [int(v) for v in host[kinds + n :]]
        xs = x.index_select(0, order)
        res = xs.clone()
        bounds = list(itertools.accumulate(counts))
        geometric = []
        for k, name in enumerate(NAMES):
            start, end = bounds[k], bounds[k + 1]
            if start == end:
                continue
            if name in _GEOMETRIC:
                geometric.append((name, start, end))
            else:
                res[start:end] = _colour(name, xs[start:end], args[start:end])
        if geometric:
            self._geometric(xs, res, geometric, host_args, host_modes)
        return torch.empty_like(x).index_copy_(0, order, res)

    def _geometric(
        self, xs: torch.Tensor, res: torch.Tensor, parts: list[tuple[str, int, int]], values: list, modes: list
    ) -> None:
        """The affine ops, grouped by resampling filter: the matrices Image.transform / Image.rotate take (built
        on the host from ``values`` and ``modes``, the sorted batch's arguments and filter indices)."""
        fill = self.hparams.fill
        for m, mode_name in enumerate(self.hparams.interpolation):
            rotations: list[tuple[int, float]] = []
            affine: list[tuple[int, tuple[float, ...]]] = []
            for name, start, end in parts:
                for i in range(start, end):
                    if modes[i] != m:
                        continue
                    v = values[i]
                    if name == "Rotate":
                        rotations.append((i, v))
                    else:
                        affine.append((i, _matrix(name, v)))
            if affine:
                index = torch.tensor([i for i, _ in affine], device=xs.device)
                res[index] = pil.affine(xs[index], [a for _, a in affine], mode_name, fill)
            if rotations:
                index = torch.tensor([i for i, _ in rotations], device=xs.device)
                res[index] = pil.rotate(xs[index], [d for _, d in rotations], mode_name, fill)


def _matrix(name: str, v: float) -> tuple[float, ...]:
    """timm's ``Image.AFFINE`` data for a shear factor or a translation in pixels."""
    return {
        "ShearX": (1, v, 0, 0, 1, 0),
        "ShearY": (1, 0, 0, v, 1, 0),
        "TranslateX": (1, 0, v, 0, 1, 0),
        "TranslateXRel": (1, 0, v, 0, 1, 0),
        "TranslateY": (1, 0, 0, 0, 1, v),
        "TranslateYRel": (1, 0, 0, 0, 1, v),
    }[name]


def _colour(name: str, x: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    base = name.removesuffix("Increasing").removesuffix("Original")
    if base == "AutoContrast":
        return pil.autocontrast(x)
    if base == "Equalize":
        return equalize(x)
    if base == "Invert":
        return 255 - x
    if base == "Posterize":
        return posterize(x, arg.clamp(max=8))  # bits >= 8: the image as it is
    if base == "Solarize":
        return pil.solarize(x, arg)
    if base == "SolarizeAdd":  # below 128: + add, capped at 255
        return torch.where(x < 128, (x.to(torch.int16) + arg.view(-1, 1, 1, 1).to(torch.int16)).clamp(max=255), x).to(
            torch.uint8
        )
    return pil.enhance("Color" if base == "Desaturate" else base, x, arg)


@dataclass(frozen=True)
class TimmRandAugment(_TimmAugment):
    """timm's ``RandAugment``: ``num_layers`` ops per image from ``ops``, uniformly with replacement, or by
    ``choice_weights`` without replacement (``np.random.choice``'s draws), each an :class:`TimmOp`."""

    ops: tuple[TimmOp, ...]
    num_layers: int = 2
    choice_weights: tuple[float, ...] | None = None
    hparams: Hparams = Hparams.make((128, 128, 128), ("bilinear", "bicubic"), 250, 0.45)

    def __post_init__(self) -> None:
        if not self.ops or self.num_layers < 0:
            raise ConfigError(f"RandAugment needs ops and num_layers >= 0, got {len(self.ops)} ops, {self.num_layers}")
        w = self.choice_weights
        if w is not None and (len(w) != len(self.ops) or sum(v > 0 for v in w) < self.num_layers):
            raise ConfigError(
                f"choice_weights={w} must give each of the {len(self.ops)} ops a weight, at least num_layers="
                f"{self.num_layers} of them positive (the choice is without replacement)"
            )

    def _choice(self) -> str:
        how = "weighted, without replacement" if self.choice_weights is not None else "uniform"
        return f"{self.num_layers} per image, {how}"

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        self._check(x)
        n, dev = x.shape[0], x.device
        if self.num_layers == 0:  # timm's choice of no ops: the image as it is
            return {"rounds": []}
        if self.choice_weights is None:
            picks = randint(generator, 0, len(self.ops), (n, self.num_layers), dev)
        else:
            picks = without_replacement(generator, self.choice_weights, n, self.num_layers, dev)
        return {"rounds": [self._round(picks[:, j], x, generator) for j in range(self.num_layers)]}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for r in params["rounds"]:
            x = self._apply_round(x, r)
        return x


@dataclass(frozen=True)
class TimmAutoAugment(_TimmAugment):
    """timm's ``AutoAugment``: per image one sub-policy of ``policy`` (uniformly), its ops in order; ``ops`` are
    the distinct ops and each sub-policy a tuple of indices into them."""

    ops: tuple[TimmOp, ...]
    policy: tuple[tuple[int, ...], ...]
    hparams: Hparams = Hparams.make((128, 128, 128), ("bilinear", "bicubic"), 250, 0.45)

    def __post_init__(self) -> None:
        if not self.policy or any(not 0 <= i < len(self.ops) for sub in self.policy for i in sub):
            raise ConfigError(f"policy={self.policy} must be sub-policies of indices into the {len(self.ops)} ops")

    def _choice(self) -> str:
        return f"one of {len(self.policy)} sub-policies per image"

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        self._check(x)
        n, dev = x.shape[0], x.device
        depth = max(len(sub) for sub in self.policy)
        table = torch.tensor([list(sub) + [-1] * (depth - len(sub)) for sub in self.policy], device=dev)
        which = randint(generator, 0, len(self.policy), (n,), dev)
        return {"rounds": [self._round(table[which, j], x, generator) for j in range(depth)]}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        for r in params["rounds"]:
            x = self._apply_round(x, r)
        return x
