"""The loader of timm's ``train.py``: ``timm.data.create_loader`` over a dataset, its recipe given by name
(``input_size``, ``is_training``, ``scale``, ``hflip``, ``re_prob``...), ``use_prefetcher=False`` on a CPU.

Usage: python timm_loader.py DATA [-j N] [-b B] [--epochs E] [--size S]

Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from timm.data import create_loader
from torchvision.datasets import ImageFolder

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("-j", "--workers", type=int, default=0)
parser.add_argument("-b", "--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--size", type=int, default=32)


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(42)
    dataset_train = ImageFolder(args.data)
    loader_train = create_loader(
        dataset_train,
        input_size=(3, args.size, args.size),
        batch_size=args.batch_size,
        is_training=True,
        scale=(0.08, 1.0),
        hflip=0.5,
        interpolation="bilinear",
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        num_workers=args.workers,
        use_prefetcher=False,
    )
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    model(torch.zeros(1, 3, args.size, args.size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = 0
    for _ in range(args.epochs):
        for images, target in loader_train:
            loss = torch.nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
