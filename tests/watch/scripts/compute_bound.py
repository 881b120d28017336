"""A loop whose data is instant (tensors in memory) and whose step is long (it sleeps): compute-bound.

Usage: python compute_bound.py [--epochs E] [--step-s S] [--crash-at K]

``--crash-at K`` raises at step K, as a bug in a training script would. Prints ``step K loss L`` per batch and
``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--step-s", type=float, default=0.03)
    p.add_argument("--crash-at", type=int, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    features, labels = torch.randn(256, 16), torch.randint(0, 2, (256,))
    loader = DataLoader(TensorDataset(features, labels), batch_size=32, shuffle=True, drop_last=True)
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for _ in range(args.epochs):
        for x, y in loader:
            if seen == args.crash_at:
                raise RuntimeError(f"diverged at step {seen}")
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
