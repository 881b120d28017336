"""Run a torchvision pipeline through gpufeed's planner and batched ops, and the same pipeline per sample
through torchvision with each random op pinned to the parameters gpufeed drew for that sample."""

from __future__ import annotations

import copy

import torch

from gpufeed.pipeline.translate import build_batched, kind, split_transform
from gpufeed.read.samples import to_chw


def pin(op, params, i):
    """A copy of the torchvision random op ``op`` that uses sample ``i`` of gpufeed's ``params``."""
    op = copy.deepcopy(op)
    name, is_v2 = kind(op), type(op).__module__.startswith("torchvision.transforms.v2")

    def use(v1_params, v2_params):
        if is_v2:
            make = type(op).make_params
            op.make_params = lambda flat: {**make(op, flat), **v2_params}
        else:
            op.get_params = lambda *args, **kwargs: v1_params

    if name == "RandomCrop":
        top, left = int(params["top"][i]), int(params["left"][i])
        use((top, left, *op.size), {"top": top, "left": left, "needs_crop": True})
    elif name == "RandomResizedCrop":
        box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
        use(tuple(box), dict(zip(("top", "left", "height", "width"), box, strict=True)))
    elif name in ("RandomHorizontalFlip", "RandomVerticalFlip"):
        op.p = 1.0 if params["mask"][i] else 0.0
    elif name == "RandomErasing":
        op.p = 1.0 if params["mask"][i] else 0.0
        box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
        value = params["value"]
        v = value[i, :, box[0] : box[0] + box[2], box[1] : box[1] + box[3]] if value.shape[0] > 1 else value[0]
        use((*box, v), dict(i=box[0], j=box[1], h=box[2], w=box[3], v=v))
    else:
        raise AssertionError(f"no pinning for {op!r}")
    return op


def run_both(transform, images, pil: bool, seed: int = 0):
    """``(batched, per_sample, compose_out)`` for a list of input images (PIL or CHW tensors).

    ``batched``: the planner's ops run one by one on the stored batch; ``compose_out``: the same ops
    through ``gpufeed.augment.Compose`` with the same generator seed (crops and flips fused);
    ``per_sample``: torchvision's pipeline on each image, random ops pinned to gpufeed's draws.
    """
    from PIL import Image

    split = split_transform(transform)
    cached = split.cached_transform()
    outs = [cached(img) if cached else img for img in images]
    stored = torch.stack([to_chw(out) for out in outs])
    pil = pil and isinstance(outs[0], Image.Image)  # what the cached part hands on, as accelerate's probe sees it
    ops = build_batched(split.device, stored.dtype, tuple(stored.shape[2:]), pil=pil)
    g = torch.Generator().manual_seed(seed)
    x, drawn = stored, []
    for op in ops.transforms if ops else []:
        params = op.sample(x, g) if op.random else {}
        if op.random:
            drawn.append(params)
        x = op.apply(x, params)
    composed = ops(stored, generator=torch.Generator().manual_seed(seed)) if ops else stored
    random_ops = [op for op in split.device if kind(op) is not None and kind(op).startswith("Random")]
    assert len(random_ops) == len(drawn), (random_ops, len(drawn))
    reference = []
    for i, img in enumerate(images):
        pinned = [pin(op, drawn[random_ops.index(op)], i) if op in random_ops else op for op in split.device]
        full = list(split.cached) + pinned
        with torch.random.fork_rng():
            out = img
            for op in full:
                out = op(out)
        reference.append(to_chw(out) if not isinstance(out, torch.Tensor) else out.as_subclass(torch.Tensor))
    return x, torch.stack(reference), composed
