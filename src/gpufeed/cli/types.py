"""The argparse types the commands share: each refuses a bad value by name before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["count", "label_key", "output_dir", "positive", "seconds_or_rate", "seed"]


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
    return value


def positive(text: str) -> int:
    """An argparse type: an int >= 1 (a count of images, a size)."""
    return _whole(text, 1)


def seed(text: str) -> int:
    """An argparse type: a seed, by the library's one rule (:func:`gpufeed.validate.as_seed`: an int in [0, 2**64))."""
    from ..errors import ConfigError
    from ..validate import as_seed

    try:
        return as_seed(_whole(text, -(2**200)), "--seed")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_or_rate(text: str) -> float:
    """An argparse type: a finite number > 0 (a learning rate, a time budget): ``nan``, ``inf``, 0 and negatives
    are refused by name, before anything runs."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def label_key(text: str) -> str | None:
    """An argparse type: a Hugging Face dataset's label column; ``none``: no labels; ``auto``: found."""
    return None if text.lower() == "none" else text


def count(text: str) -> int:
    """An argparse type: an int >= 0 (a number of workers), capped at a few per usable core with a warning (a
    typo such as 1000000 would start processes until the machine stops)."""
    from ..validate import as_workers

    return as_workers(_whole(text, 0), "--num-workers")


def output_dir(text: str) -> Path:
    """An argparse type: a folder for results (created if missing); an existing file is refused up front."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder for the results")
    return path
