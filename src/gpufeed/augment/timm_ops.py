"""timm's own per-image ops, batched where their semantics differ from torchvision's.

timm's ``RandomErasing`` (timm.data.random_erasing) is applied after normalisation: with probability
``probability`` per image, 1 to ``max_count`` boxes of area ``U(min_area, max_area) / count`` of the
image and a log-uniform aspect ratio in ``[min_aspect, max_aspect]`` (10 attempts each; a box must be
strictly smaller than the image), filled with 0 (``mode="const"``), one normal draw per channel
(``"rand"``) or a normal draw per pixel (``"pixel"``). Here each sample draws the same way from the
loader's generator (timm uses Python's ``random``: the same distribution, not the same stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .params import Draws, rand, randint, randn
from .transforms import BatchTransform, Params

__all__ = ["TimmRandomErasing"]


@dataclass(frozen=True)
class TimmRandomErasing(BatchTransform):
    probability: float = 0.5
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float | None = None
    mode: str = "const"
    min_count: int = 1
    max_count: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("const", "rand", "pixel"):
            raise ConfigError(f"mode={self.mode!r} must be 'const', 'rand' or 'pixel' (timm's modes)")
        object.__setattr__(self, "max_aspect", self.max_aspect or 1 / self.min_aspect)
        object.__setattr__(self, "max_count", self.max_count or self.min_count)
        if not 1 <= self.min_count <= self.max_count:  # type: ignore[operator]
            raise ConfigError(f"min_count={self.min_count} and max_count={self.max_count} must be 1 <= min <= max")

    def sample(self, x: torch.Tensor, generator: Draws) -> Params:
        if not x.dtype.is_floating_point:
            raise ConfigError(
                "timm's RandomErasing fills normalised float images (0 or normal draws); this batch is "
                f"{x.dtype}: put it after ToTensor/Normalize, as timm's create_transform does"
            )
        n, c, h, w = x.shape
        dev = x.device
        u = lambda *shape: rand(generator, shape, dev, torch.float64)  # noqa: E731
        apply = u(n) <= self.probability  # timm: skip when random() > probability
        count = randint(generator, self.min_count, self.max_count + 1, (n,), dev)  # type: ignore[operator]
        lo, hi = math.log(self.min_aspect), math.log(self.max_aspect)  # type: ignore[arg-type]
        boxes = []
        for j in range(self.max_count):  # type: ignore[arg-type]
            area = (self.min_area + (self.max_area - self.min_area) * u(n, 10)) * (h * w) / count.view(-1, 1)
            aspect = torch.exp(lo + (hi - lo) * u(n, 10))
            bh = torch.round(torch.sqrt(area * aspect)).long()
            bw = torch.round(torch.sqrt(area / aspect)).long()
            fits = (bw < w) & (bh < h)
            first = fits.to(torch.uint8).argmax(1, keepdim=True)
            bh, bw = bh.gather(1, first).squeeze(1), bw.gather(1, first).squeeze(1)
            top = (u(n) * (h - bh + 1)).floor().long()  # random.randint(0, h - bh), inclusive
            left = (u(n) * (w - bw + 1)).floor().long()
            boxes.append((apply & (j < count) & fits.any(1), top, left, bh, bw))
        if self.mode == "pixel":
            noise = [randn(generator, x.shape, dev, x.dtype) for _ in boxes]
        elif self.mode == "rand":
            noise = [randn(generator, (n, c, 1, 1), dev, x.dtype) for _ in boxes]
        else:
            noise = [torch.zeros((1, 1, 1, 1), device=dev, dtype=x.dtype) for _ in boxes]
        return {"boxes": boxes, "noise": noise}

    def apply(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        h, w = x.shape[2:]
        rows = torch.arange(h, device=x.device).view(1, 1, h, 1)
        cols = torch.arange(w, device=x.device).view(1, 1, 1, w)
        for (erase, top, left, bh, bw), fill in zip(params["boxes"], params["noise"], strict=True):
            v = lambda t: t.view(-1, 1, 1, 1)  # noqa: E731
            inside = (rows >= v(top)) & (rows < v(top + bh)) & (cols >= v(left)) & (cols < v(left + bw)) & v(erase)
            x = torch.where(inside, fill.expand_as(x), x)
        return x
