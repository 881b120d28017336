"""Converters of timm's random ops (``RandomErasing``, ``RandAugment``, ``AutoAugment``), matched by class
identity when timm is in use (timm is never imported here); entries of
:data:`gpufeed.pipeline.translate.CONVERTERS`."""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import augment as A
from ...errors import UnsupportedTransformError
from .state import State

__all__ = ["TIMM_POSTERIZE_NOTE", "timm_auto", "timm_erasing"]


def timm_erasing(op: Any, s: State) -> A.BatchTransform:
    """timm's ``RandomErasing`` (``num_splits`` 0 or 1) as :class:`gpufeed.augment.timm_ops.TimmRandomErasing`."""
    from ...augment.timm_ops import TimmRandomErasing

    if op.num_splits > 1:
        raise UnsupportedTransformError(
            f"{op!r}: num_splits={op.num_splits} leaves a share of each batch unerased (timm's augmentation "
            "splits); gpufeed batches num_splits=0 or 1"
        )
    aspect = (math.exp(op.log_aspect_ratio[0]), math.exp(op.log_aspect_ratio[1]))
    return TimmRandomErasing(
        op.probability, op.min_area, op.max_area, aspect[0], aspect[1], op.mode or "const", op.min_count, op.max_count
    )


# Pillow's resampling filter numbers (Image.Resampling) that Image.transform takes.
_PIL_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def timm_auto(op: Any, s: State) -> A.BatchTransform:
    """timm's ``RandAugment`` / ``AutoAugment`` (``timm.data.auto_augment``): its ``AugmentOp`` list read back
    into :class:`~gpufeed.augment.timm_auto.TimmOp` s; the hyper-parameters all its ops share."""
    from ...augment import timm_auto as TA

    name = type(op).__name__
    if not s.pil or s.dtype != torch.uint8:
        raise UnsupportedTransformError(
            f"timm's {name} runs PIL kernels (ImageOps, ImageEnhance) and needs PIL images, but the pipeline gives it "
            "a tensor here; put it before ToTensor/MaybeToTensor, as timm's create_transform does"
        )
    if name == "RandAugment":
        augment_ops = list(op.ops)
    else:
        augment_ops = list({id(a): a for sub in op.policy for a in sub}.values())
    ops, hparams = [], set()
    for a in augment_ops:
        if a.name not in TA.NAMES:
            raise UnsupportedTransformError(
                f"timm's {name} holds {a.name}, which gpufeed does not batch (it batches {', '.join(TA.NAMES)}); "
                "pass fallback='prefetch' to run it per sample"
            )
        resample = a.kwargs.get("resample", 3)
        filters = tuple(resample) if isinstance(resample, (list, tuple)) else (resample,)
        if any(int(f) not in _PIL_FILTERS for f in filters):
            raise UnsupportedTransformError(f"timm's {name}: resample={resample!r} is not one Image.transform takes")
        fill = a.kwargs.get("fillcolor", (128, 128, 128))
        hparams.add(
            (
                tuple(fill) if isinstance(fill, (list, tuple)) else (fill,),
                tuple(_PIL_FILTERS[int(f)] for f in filters),
                float(a.hparams.get("translate_const", 250)),
                float(a.hparams.get("translate_pct", 0.45)),
            )
        )
        prob = min(1.0, max(0.0, float(a.prob)))  # timm applies an op of prob >= 1 always, of prob <= 0 never
        ops.append(TA.TimmOp(a.name, prob, float(a.magnitude), float(a.magnitude_std), a.magnitude_max))
    if len(hparams) != 1:
        raise UnsupportedTransformError(f"timm's {name}: its ops have different fills or interpolations ({hparams})")
    hp = TA.Hparams.make(*hparams.pop())
    if any(o.name in ("Posterize", "PosterizeIncreasing") for o in ops):
        s.notes.append(TIMM_POSTERIZE_NOTE)
    if name == "RandAugment":
        weights = op.choice_weights
        return TA.TimmRandAugment(
            tuple(ops), int(op.num_layers), tuple(float(w) for w in weights) if weights is not None else None, hp
        )
    index = {id(a): i for i, a in enumerate(augment_ops)}
    return TA.TimmAutoAugment(tuple(ops), tuple(tuple(index[id(a)] for a in sub) for sub in op.policy), hp)


TIMM_POSTERIZE_NOTE = (
    "timm's posterize can draw 0 bits or fewer (PosterizeIncreasing at magnitude 10 or above, Posterize below "
    "2.5), which Pillow 13 refuses (ValueError in the per-sample pipeline); gpufeed keeps no bits there (a black "
    "image), as Pillow before 13 computed"
)
