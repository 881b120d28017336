"""The slow dataset the library-loop scripts share (Accelerate, Lightning, torchrun): imported by them, run by
none."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class SlowFeatures(Dataset):
    """Fixed random features and labels; each sample costs ``sample_s`` seconds to read."""

    def __init__(self, n: int, sample_s: float) -> None:
        g = torch.Generator().manual_seed(5)
        self.x, self.y, self.sample_s = (
            torch.randn(n, 16, generator=g),
            torch.randint(0, 2, (n,), generator=g),
            sample_s,
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sample_s)
        return self.x[i], self.y[i]
