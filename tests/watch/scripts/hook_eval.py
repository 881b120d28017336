"""A training loop of 4 batches an epoch, each epoch followed by an evaluation pass of 12 batches under no_grad.

Usage: python hook_eval.py [--epochs E]. Prints ``train K`` per training batch.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    data = TensorDataset(torch.randn(48, 4), torch.randint(0, 2, (48,)))
    train = DataLoader(data, batch_size=12, shuffle=True)
    evaluation = DataLoader(data, batch_size=4)
    model = torch.nn.Linear(4, 2)
    seen = 0
    for _ in range(a.epochs):
        for x, y in train:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            print(f"train {seen}", flush=True)
            seen += 1
        with torch.no_grad():
            for x, _ in evaluation:
                model(x)


if __name__ == "__main__":
    main()
