"""Options shared by the subcommands: which data to use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        choices=["synthetic", "cifar10"],
        default="synthetic",
        help="embedded synthetic CIFAR-10 (default) or torchvision's real one",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="where the data lives (required for cifar10)")
    p.add_argument("--download", action="store_true", help="let torchvision download the real CIFAR-10")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic data")


def load_data(args: argparse.Namespace, train: bool = True, transform: Any = None) -> Any:
    from ..data import cifar10

    return cifar10(
        args.data, args.data_dir, train=train, transform=transform, download=args.download, seed=args.data_seed
    )
