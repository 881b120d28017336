"""The shape of PyTorch's MNIST example (``pytorch/examples`` ``mnist/main.py``): the loader's arguments in dicts,
``train_kwargs = {'batch_size': args.batch_size}`` updated with ``accel_kwargs`` (workers, pinned memory,
``shuffle=True``) only when an accelerator is there, then ``torch.utils.data.DataLoader(dataset1,**train_kwargs)``;
torchvision's ``MNIST`` with ``ToTensor`` + ``Normalize``, a small MLP.

Usage: python mnist_loop.py ROOT [--epochs E] [--batch-size B] [--no-accel] [--accel-kwargs]

ROOT holds ``MNIST/raw/`` in the real format (the test writes a small one). ``--accel-kwargs`` adds the accelerator's
loader settings on a CPU too. Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from torchvision import datasets, transforms


def main() -> None:
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("root")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N")
    parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N")
    parser.add_argument("--epochs", type=int, default=2, metavar="N")
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR")
    parser.add_argument("--no-accel", action="store_true")
    parser.add_argument("--accel-kwargs", action="store_true")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    args = parser.parse_args()
    use_accel = not args.no_accel and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_accel else "cpu")

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_accel or args.accel_kwargs:
        accel_kwargs = {"num_workers": 1, "persistent_workers": True, "pin_memory": use_accel, "shuffle": True}
        train_kwargs.update(accel_kwargs)
        test_kwargs.update(accel_kwargs)

    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    dataset1 = datasets.MNIST(args.root, train=True, download=False, transform=transform)
    train_loader = torch.utils.data.DataLoader(dataset1,**train_kwargs)  # fmt: skip
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    model = model.to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    seen = 0
    for _ in range(args.epochs):
        model.train()
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
