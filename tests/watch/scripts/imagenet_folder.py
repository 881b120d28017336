"""A plain training loop over an ``ImageFolder`` with the ImageNet recipe, as in torchvision's reference scripts.

Usage: python imagenet_folder.py ROOT [--workers N] [--epochs E] [--batch-size B] [--size S]

Prints ``step K loss L`` per batch and ``batches seen N`` at the end (what a diagnosed run must leave unchanged).
"""

from __future__ import annotations

import argparse

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--size", type=int, default=32)
    args = p.parse_args()
    torch.manual_seed(0)
    recipe = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    train_ds = ImageFolder(args.root, transform=recipe)
    loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    model(torch.zeros(1, 3, args.size, args.size))  # materialise the lazy layer before the optimiser sees it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for _ in range(args.epochs):
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
