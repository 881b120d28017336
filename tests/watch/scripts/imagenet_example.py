"""The shape of the ImageNet example of PyTorch's examples repository (``imagenet/main.py``): ``-j`` workers, a
``train_sampler`` that is a ``DistributedSampler`` under ``--world-size > 1`` and ``None`` otherwise, passed as
``sampler=`` with ``shuffle=(train_sampler is None)`` and ``pin_memory=True``, a validation loader, a model step
that costs ``--step-s`` (a larger model) on top of a tiny convolution.

Usage: python imagenet_example.py DATA [-j N] [-b B] [--epochs E] [--size S] [--step-s S] [--world-size W]

DATA holds ``train/`` and ``val/`` image folders. Prints ``step K loss L`` per training batch, ``val acc A`` after
each epoch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.utils.data
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (its loader's shape)")
parser.add_argument("data", metavar="DIR")
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N")
parser.add_argument("-b", "--batch-size", default=16, type=int, metavar="N")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--size", default=32, type=int)
parser.add_argument("--step-s", default=0.0, type=float, help="seconds each training step costs beyond the model")
parser.add_argument("--world-size", default=-1, type=int)


def main() -> None:
    args = parser.parse_args()
    args.distributed = args.world_size > 1
    if args.distributed:
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=args.world_size)
    torch.manual_seed(0)
    traindir = os.path.join(args.data, "train")
    valdir = os.path.join(args.data, "val")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])

    train_dataset = datasets.ImageFolder(
        traindir,
        transforms.Compose(
            [
                transforms.RandomResizedCrop(args.size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    )
    val_dataset = datasets.ImageFolder(
        valdir,
        transforms.Compose(
            [transforms.Resize(args.size + args.size // 7), transforms.CenterCrop(args.size), transforms.ToTensor(),
             normalize]
        ),
    )  # fmt: skip

    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = None
        val_sampler = None

    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=args.batch_size,
        shuffle=(train_sampler is None),
        num_workers=args.workers,
        pin_memory=True,
        sampler=train_sampler,
    )
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.workers, pin_memory=True,
        sampler=val_sampler,
    )  # fmt: skip

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    model(torch.zeros(1, 3, args.size, args.size))  # materialise the lazy layer before the optimiser sees it
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    seen = 0
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        model.train()
        for images, target in train_loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.step_s:
                time.sleep(args.step_s)
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, target in val_loader:
                correct += int((model(images).argmax(1) == target).sum())
                total += len(target)
        print(f"val acc {correct / max(1, total):.4f}", flush=True)
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
