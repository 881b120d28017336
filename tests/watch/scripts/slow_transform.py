"""A loop whose transform sleeps a known time per sample and whose step sleeps a known time: the true share of
the time spent waiting for data is ``batch * sample_s / (batch * sample_s + step_s)``.

Usage: python slow_transform.py [--batches N] [--batch-size B] [--sample-s S] [--step-s S] [--workers W]

Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Sleep:
    """A transform that costs ``seconds`` per sample (a slow decode, a heavy augmentation) and changes nothing."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x

    def __repr__(self) -> str:
        return f"Sleep({self.seconds})"


class Features(Dataset):
    """Fixed random features and labels, with a per-sample transform."""

    def __init__(self, n: int, transform: Sleep) -> None:
        g = torch.Generator().manual_seed(3)
        self.x, self.y, self.transform = (
            torch.randn(n, 16, generator=g),
            torch.randint(0, 2, (n,), generator=g),
            transform,
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.x[i]), self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-s", type=float, default=0.01)
    p.add_argument("--step-s", type=float, default=0.04)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    dataset = Features(args.batches * args.batch_size, Sleep(args.sample_s))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_s)  # the rest of a real step (a larger model)
        print(f"step {seen} loss {loss.item():.6f}", flush=True)
        seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
