"""The shape of Hugging Face Accelerate's ``examples/cv_example.py``: a ``training_function(config, args)`` that
builds an image dataset with a torchvision recipe, a ``DataLoader(..., shuffle=True, batch_size=batch_size,
num_workers=...)``, and hands model, optimiser and loader to ``accelerator.prepare`` (which returns a loader with
``batch_size=None`` and a batch sampler that keeps the script's); ``accelerator.backward`` in the loop.

Usage: python accelerate_prepare.py DATA [--workers N] [--epochs E]

Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import Compose, Normalize, RandomResizedCrop, ToTensor

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def training_function(config: dict, args: argparse.Namespace) -> None:
    accelerator = Accelerator(cpu=args.cpu)
    lr, num_epochs, batch_size = config["lr"], int(config["num_epochs"]), int(config["batch_size"])
    image_size = config["image_size"]
    torch.manual_seed(config["seed"])
    train_tfm = Compose([RandomResizedCrop(image_size, scale=(0.35, 1)), ToTensor(), Normalize(MEAN, STD)])
    train_dataset = ImageFolder(args.data_dir, transform=train_tfm)
    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=batch_size, num_workers=args.workers)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    model(torch.zeros(1, 3, image_size, image_size))
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=lr)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    seen = 0
    for _ in range(num_epochs):
        model.train()
        for inputs, labels in train_dataloader:
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    accelerator.print(f"batches seen {seen}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("data_dir")
    parser.add_argument("--cpu", action="store_true", default=True, help="If passed, will train on the CPU.")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    config = {"lr": 3e-2, "num_epochs": args.epochs, "seed": 42, "batch_size": 8, "image_size": 32}
    training_function(config, args)


if __name__ == "__main__":
    main()
