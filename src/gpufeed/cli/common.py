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
    """An argparse type: an int >= 0 (a number of workers), capped at a few per usable core with a warning (a
    typo such as 1000000 would start processes until the machine stops)."""
    from ..validate import as_workers

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return as_workers(value, "--num-workers")


def output_dir(text: str) -> Path:
    """An argparse type: a folder for results (created if missing); an existing file is refused up front."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder for the results")
    return path


def lead() -> bool:
    """Whether this process reports for the run: rank 0 under torch.distributed.run, or a plain process."""
    return int(os.environ.get("RANK", "0")) == 0


def data_choice(text: str) -> str:
    """An argparse type: ``synthetic``, ``cifar10``, ``synthetic-folder``, or an existing folder of images."""
    from ..data.images import KEYWORDS

    if text in KEYWORDS:  # exactly: ./synthetic is a folder of that name
        return text
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither one of {', '.join(KEYWORDS)} nor a folder of images (no such directory)"
        )
    return str(path.resolve())


def add_data_arguments(p: argparse.ArgumentParser, sizes: bool = True) -> None:
    p.add_argument(
        "--data",
        type=data_choice,
        default="synthetic",
        metavar="{synthetic,cifar10,synthetic-folder,DIR}",
        help="embedded synthetic CIFAR-10 (default), torchvision's real one, the embedded synthetic JPEG folder, or "
        "your image folder (DIR/<class>/*.jpg, or DIR/train and DIR/val; only read)",
    )
    p.add_argument(
        "--data-dir",
        type=lambda text: Path(text).expanduser(),
        default=None,
        help="where CIFAR-10 lives; read only (required for cifar10; synthetic: default gpufeed's cache directory)",
    )
    p.add_argument(
        "--download", action="store_true", help="allow writing into --data-dir: download CIFAR-10 / generate synthetic"
    )
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic data")
    p.add_argument(
        "--val-data",
        type=data_choice,
        default=None,
        metavar="DIR",
        help="an image folder's validation split, when --data DIR is the training split itself",
    )
    if sizes:
        p.add_argument(
            "--image-size", type=positive, default=None, help="image folders: the recipes' crop size (default 224)"
        )


def _check_folder_options(args: argparse.Namespace) -> None:
    from ..data.images import is_folder
    from ..errors import ConfigError

    if is_folder(args.data):
        if args.data_dir is not None:
            raise ConfigError("--data-dir is where CIFAR-10 lives; give an image folder as --data DIR")
        if args.download:
            raise ConfigError("--download fetches or generates CIFAR-10; gpufeed never writes into an image folder")
        _check_cache_outside(args)
        return
    if args.val_data is not None:
        raise ConfigError("--val-data goes with --data DIR (an image folder); CIFAR-10 has its own test split")
    if getattr(args, "image_size", None) not in (None, 32):
        raise ConfigError("--image-size applies to image folders; CIFAR-10 images are 32x32")


def _check_cache_outside(args: argparse.Namespace) -> None:
    """gpufeed's cache may not be inside the user's folders: an entry there would be a new "class"."""
    from ..cache import default_cache_dir
    from ..errors import ConfigError

    root = (getattr(args, "cache_dir", None) or default_cache_dir()).expanduser().resolve()
    for option, folder in (("--data", args.data), ("--val-data", args.val_data)):
        if folder is None or folder == "synthetic-folder":
            continue
        if root.is_relative_to(Path(folder).resolve()):
            raise ConfigError(
                f"the cache root {root} is inside {option} {folder}; gpufeed never writes into your folders: set "
                "--cache-dir or GPUFEED_CACHE_DIR to a place outside it"
            )


def load_data(args: argparse.Namespace, train: bool = True, transform: Any = None, announce: bool = True) -> Any:
    """The dataset the options name; ``announce`` prints the line that says which (rank 0 only). An image
    folder comes with the folder recipe at ``--image-size`` (``transform`` is CIFAR-10's)."""
    from ..data import cifar10, describe
    from ..data.images import folder_splits, is_folder

    _check_folder_options(args)
    if is_folder(args.data):
        size = getattr(args, "image_size", None) or 224
        train_set, val_set, what = folder_splits(args.data, args.val_data, size, args.data_seed)
        ds = train_set if train else val_set
        if ds is None:
            from ..errors import ConfigError

            raise ConfigError(f"{what}: no validation split to use; add --val-data DIR")
        if announce and lead():
            print(f"data: {what}: {len(ds):,} {'training' if train else 'validation'} images, "
                  f"{len(ds.classes)} classes", flush=True)  # fmt: skip
        return ds
    ds = cifar10(
        args.data, args.data_dir, train=train, transform=transform, download=args.download, seed=args.data_seed
    )
    if announce and lead():
        print(f"data: {describe(ds)}", flush=True)
    return ds


def load_train_test(args: argparse.Namespace, train_size: int | None, test_size: int | None) -> Any:
    """``(train, test)`` datasets with the standard recipes; prints one line naming them and what part is used
    (test is None for an image folder without a validation split)."""
    from ..data import describe
    from ..data.images import folder_splits, is_folder
    from ..train.loaders import eval_transform, train_transform

    _check_folder_options(args)
    if is_folder(args.data):
        size = getattr(args, "image_size", None) or 224
        train, test, what = folder_splits(args.data, args.val_data, size, args.data_seed)
        held = (len(train), len(test) if test is not None else 0)
        used = subset_note(train_size, test_size, held, spread=True)
        val = f", {len(test):,} validation" if test is not None else ""
        if lead():
            print(f"data: {what}: {len(train):,} training images in {len(train.classes)} classes{val}{used}, "
                  f"{size}x{size} crops", flush=True)  # fmt: skip
        return train, test
    train = load_data(args, True, train_transform(), announce=False)
    test = load_data(args, False, eval_transform(), announce=False)
    if lead():
        used = subset_note(train_size, test_size, (len(train), len(test)))
        print(f"data: {describe(train)}, {len(test):,} test samples{used}", flush=True)
    return train, test


def subset_note(
    train_size: int | None, test_size: int | None, sizes: tuple[int, int] = (50_000, 10_000), spread: bool = False
) -> str:
    """What part of the data a run uses, for the data line (``sizes``: what the data holds; ``spread``: the
    subset is spread evenly over the samples, as for a folder sorted by class, rather than the first ones)."""
    wanted = ((train_size, sizes[0], "training"), (test_size, sizes[1], "test"))
    parts = [
        f"{n:,} evenly spaced {what}" if spread else f"the first {n:,} {what}"
        for n, total, what in wanted
        if n and n < total
    ]
    return f" (using {' and '.join(parts)})" if parts else ""


DEFAULT_BATCH_SIZE = 256


def add_batch_size(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch-size",
        type=positive,
        default=None,
        help=f"images per batch (default {DEFAULT_BATCH_SIZE}, or all the training images when there are fewer)",
    )


def world_size() -> int:
    """Processes sharing each epoch (torch.distributed.run sets WORLD_SIZE), 1 for a plain process."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def choose_batch_size(requested: int | None, images: int, world: int = 1) -> tuple[int, str | None]:
    """``--batch-size``, or the default one that fits ``images`` training images shared by ``world`` processes,
    with the line that says so. Training drops each rank's last, partial batch (static shapes): a batch size
    larger than a rank's share would give epochs of no batch, so it is refused, naming the option.

    Example:
        >>> choose_batch_size(None, 10)
        (10, 'batch size 10: the default 256 is more than the 10 training images (set --batch-size)')
    """
    from ..errors import ConfigError

    share = images // world
    across = f" per process ({images:,} over {world})" if world > 1 else ""
    if requested is None:
        if share >= DEFAULT_BATCH_SIZE:
            return DEFAULT_BATCH_SIZE, None
        if share < 1:
            raise ConfigError(f"{images} training images cannot be shared by {world} processes; use fewer processes")
        what = f"{share:,} training images{across}"
        return share, f"batch size {share}: the default {DEFAULT_BATCH_SIZE} is more than the {what} (set --batch-size)"
    if requested > share:
        raise ConfigError(
            f"--batch-size {requested} is more than the {share:,} training images{across}: each epoch drops its last, "
            f"partial batch, so it would have none; use --batch-size {max(1, share)} or less"
        )
    return requested, None


def describe_epoch(loader: Any, images: int, batch_size: int, world: int = 1) -> list[str]:
    """What a run will train on: gpufeed's plan (store, cache, what runs batched) when the loader has one, and
    the images each epoch uses and drops."""
    lines = []
    plan = getattr(loader, "plan", None)
    if plan is not None:
        if plan.ingest.startswith("cache hit"):
            cache = "hit"
        elif plan.cache_path:
            cache = "built by this run"
        else:
            cache = "none (read for this run, not kept)"
        lines.append(f"plan: store {plan.storage}, cache {cache}")
        lines += [f"  {line}" for line in str(plan).splitlines()]
    batches = len(loader)  # this process's batches per epoch
    used = min(images, batches * batch_size * world)
    dropped = images - used
    total = batches * world
    line = f"per epoch: {used:,} of {images:,} training images, {total:,} batch{'es' * (total != 1)} of {batch_size}"
    if dropped:
        line += (
            f"; {dropped:,} dropped by drop_last (each epoch's last, partial batch, dropped for static shapes; "
            "another shuffle drops others next epoch)"
        )
    lines.append(line)
    return lines


def training_images(train: Any, train_size: int | None) -> int:
    """The training images a run uses: ``--train-size`` of them, or all."""
    return min(len(train), train_size) if train_size else len(train)


def settle_batch_size(args: argparse.Namespace, train: Any, train_size: int | None) -> None:
    """Set ``args.batch_size`` to what the run uses (see :func:`choose_batch_size`), printing why if it was chosen."""
    args.batch_size, why = choose_batch_size(args.batch_size, training_images(train, train_size), world_size())
    if why and lead():
        print(why, flush=True)
