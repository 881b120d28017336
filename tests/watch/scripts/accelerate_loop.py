"""A Hugging Face Accelerate loop (``accelerator.prepare`` on the model, optimiser and loader) over a slow
dataset (it sleeps per sample): data-bound.

Usage: python accelerate_loop.py [--epochs E] [--sample-s S]

Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from slow_features import SlowFeatures
from torch.utils.data import DataLoader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sample-s", type=float, default=0.003)
    args = p.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    train_dataloader = DataLoader(SlowFeatures(64, args.sample_s), batch_size=8, shuffle=True)
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    seen = 0
    for _ in range(args.epochs):
        for x, y in train_dataloader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
