"""Options shared by the subcommands: which data to use, and the line that names it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def positive(text: str) -> int:
    """An argparse type: an int >= 1 (a count of images, a size)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def count(text: str) -> int:
    """An argparse type: an int >= 0 (a number of workers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def output_dir(text: str) -> Path:
    """An argparse type: a folder for results (created if missing); an existing file is refused up front."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder for the results")
    return path


def lead() -> bool:
    """Whether this process reports for the run: rank 0 under torch.distributed.run, or a plain process."""
    return int(os.environ.get("RANK", "0")) == 0


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        choices=["synthetic", "cifar10"],
        default="synthetic",
        help="embedded synthetic CIFAR-10 (default) or torchvision's real one",
    )
    p.add_argument(
        "--data-dir",
        type=lambda text: Path(text).expanduser(),
        default=None,
        help="where the data lives; read only (required for cifar10; synthetic: default gpufeed's cache directory)",
    )
    p.add_argument(
        "--download", action="store_true", help="allow writing into --data-dir: download CIFAR-10 / generate synthetic"
    )
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic data")


def load_data(args: argparse.Namespace, train: bool = True, transform: Any = None, announce: bool = True) -> Any:
    """The dataset the options name; ``announce`` prints the line that says which (rank 0 only)."""
    from ..data import cifar10, describe

    ds = cifar10(
        args.data, args.data_dir, train=train, transform=transform, download=args.download, seed=args.data_seed
    )
    if announce and lead():
        print(f"data: {describe(ds)}", flush=True)
    return ds


def load_train_test(args: argparse.Namespace, train_transform: Any, test_transform: Any, used: str = "") -> Any:
    """``(train, test)`` datasets; prints one line naming them, with ``used`` (e.g. a subset) appended."""
    from ..data import describe

    train = load_data(args, True, train_transform, announce=False)
    test = load_data(args, False, test_transform, announce=False)
    if lead():
        print(f"data: {describe(train)}, {len(test):,} test samples{used}", flush=True)
    return train, test


def subset_note(train_size: int | None, test_size: int | None, sizes: tuple[int, int] = (50_000, 10_000)) -> str:
    """What part of the data a run uses, for the data line (``sizes``: what the data holds)."""
    wanted = ((train_size, sizes[0], "training"), (test_size, sizes[1], "test"))
    parts = [f"the first {n:,} {what}" for n, total, what in wanted if n and n < total]
    return f" (using {' and '.join(parts)})" if parts else ""
