"""The classic MNIST example's loop (torchvision's ``MNIST``, ``ToTensor`` + ``Normalize``, a small MLP).

Usage: python mnist_loop.py ROOT [--epochs E] [--batch-size B]

ROOT holds ``MNIST/raw/`` in the real format (the test writes a small one). Prints ``step K loss L`` per batch and
``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    torch.manual_seed(1)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset1 = datasets.MNIST(args.root, train=True, download=False, transform=transform)
    train_loader = DataLoader(dataset1, batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    seen = 0
    for _ in range(args.epochs):
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
