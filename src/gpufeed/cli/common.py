"""Options shared by the subcommands: which data to use, and the line that names it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

# the argparse types, where the commands have always imported them from
from .types import count, label_key, output_dir, positive, seconds_or_rate  # noqa: F401


def lead() -> bool:
    """Whether this process reports for the run: rank 0 under torch.distributed.run, or a plain process."""
    return int(os.environ.get("RANK", "0")) == 0


def data_choice(text: str) -> str:
    """An argparse type: ``synthetic``, ``cifar10``, ``synthetic-folder``, an MDS dataset (a remote URL the streaming
    engine reads, ``s3://bucket/prefix``, or a folder holding an ``index.json``), an existing folder (of images, or
    a Hugging Face dataset's ``save_to_disk`` folder), or Parquet files (a ``.parquet`` file, a glob pattern)."""
    from ..data.images import KEYWORDS
    from ..data.mds import SCHEMES, check_url, is_url
    from ..errors import ConfigError

    if text in KEYWORDS:  # exactly: ./synthetic is a folder of that name
        return text
    try:
        check_url(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if is_url(text):
        return text
    path = Path(text).expanduser()
    if not path.is_dir():
        from ..mds.hf import locate

        try:
            parquet = locate(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if parquet is not None:  # a file, or a glob pattern kept as one (the shell did not expand a quoted one)
            return str(path.resolve()) if path.is_file() else str(path.absolute())
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither one of {', '.join(KEYWORDS)} nor a folder (no such directory: of images, a Hugging "
            "Face dataset's save_to_disk folder, or an MDS dataset holding index.json), nor .parquet files, nor a "
            f"remote MDS dataset ({', '.join(s + '://' for s in SCHEMES)})"
        )
    return str(path.resolve())


def _size(text: str) -> int:
    """An argparse type: bytes, as ``20gb``, ``500M`` or a plain count (powers of 1024)."""
    from ..cache.usage import parse_size
    from ..errors import ConfigError

    try:
        return parse_size(text, "--cache-limit")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_data_arguments(p: argparse.ArgumentParser, sizes: bool = True) -> None:
    p.add_argument(
        "--data",
        type=data_choice,
        default="synthetic",
        metavar="{synthetic,cifar10,synthetic-folder,DIR,PARQUET,URL}",
        help="embedded synthetic CIFAR-10 (default), torchvision's real one, the embedded synthetic JPEG folder, "
        "your image folder (DIR/<class>/*.jpg, or DIR/train and DIR/val; only read), a Hugging Face dataset (a DIR "
        "written by save_to_disk, a DatasetDict's train and validation/test splits; a Hub repository's DIR, or its "
        "data/ DIR, split as load_dataset splits it; or .parquet files: a file, a quoted glob; only read), or an "
        "MDS dataset (made by gpufeed convert) read by gpufeed.stream: "
        "a remote URL (s3://bucket/prefix, gs://, azure://, oci://, hf://, ...) or a DIR holding its index.json "
        "(local; with --local CACHE, read as a remote fetched into CACHE)",
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
        metavar="DIR|URL",
        help="an image folder's validation split, when --data DIR is the training split itself; with a Hugging "
        "Face --data (one dataset, not a DatasetDict), another one; with an MDS --data, another MDS dataset (a "
        "remote one is cached under gpufeed's cache directory), every sample scored",
    )
    h = p.add_argument_group(
        "Hugging Face datasets (--data a save_to_disk DIR, a Hub repository's DIR, or Parquet files)"
    )
    h.add_argument(
        "--config",
        default=None,
        metavar="NAME",
        help="of a Hub repository (its README.md card's configs): the config to read (default: the one marked "
        "default, or the only one)",
    )
    h.add_argument(
        "--image-key",
        default=None,
        metavar="COLUMN",
        help="the image column (default: the one Image column; of Parquet written by other tools, a "
        "struct<bytes, path> or binary column named here)",
    )
    h.add_argument(
        "--label-key",
        type=label_key,
        default="auto",
        metavar="COLUMN",
        help="the label column (default: the ClassLabel, else an integer column named label, labels or target)",
    )
    g = p.add_argument_group("MDS datasets (--data URL, or DIR with an index.json)")
    g.add_argument(
        "--local",
        "--local-dir",  # the name the launcher passes on: torch.distributed.run takes --local as its --local-addr
        dest="local",
        default=None,
        metavar="DIR",
        help="where a remote's shards are cached, shared by the node's processes (default: under gpufeed's cache "
        "directory); with --data DIR, DIR is then read as the remote",
    )
    g.add_argument(
        "--cache-limit",
        type=_size,
        default=None,
        metavar="BYTES",
        help="most bytes --local may hold, e.g. 20gb (least recently used shards are evicted); remote data only",
    )
    g.add_argument(
        "--num-classes",
        type=positive,
        default=None,
        help="classes of an MDS dataset without gpufeed.json (default: read from gpufeed.json, as gpufeed convert "
        "writes it)",
    )
    if sizes:
        p.add_argument(
            "--image-size",
            type=positive,
            default=None,
            help="image folders and MDS datasets: the recipes' crop size (default 224)",
        )


def hf_on_disk(args: argparse.Namespace) -> Any:
    """``--data`` as a Hugging Face dataset on disk (:func:`gpufeed.cli.hf_data.located`; None: anything else),
    asked once per command: a folder's answer lists up to 20,000 of its entries, and an image folder of a million
    files would pay it at every step that asks."""
    from .hf_data import located

    return located(args.data, getattr(args, "config", None))


def _check_folder_options(args: argparse.Namespace, hf: Any) -> None:
    """The options that do not fit ``--data``, refused by name; ``hf`` what :func:`hf_on_disk` found."""
    from ..data.images import is_folder
    from ..data.mds import is_stream
    from ..errors import ConfigError

    if hf is None and (getattr(args, "image_key", None), getattr(args, "label_key", "auto")) != (None, "auto"):
        raise ConfigError(
            f"--image-key and --label-key name the columns of a Hugging Face dataset (--data a save_to_disk folder, "
            f"a Hub repository's folder or Parquet files); --data {args.data} is not one: drop them"
        )
    stream = is_stream(args.data)
    if not stream:
        for option, value in (("--local", args.local), ("--cache-limit", args.cache_limit)):
            if value is not None:
                raise ConfigError(
                    f"{option} goes with an MDS dataset (--data s3://..., or a DIR holding index.json); --data "
                    f"{args.data} is not one"
                )
        if args.num_classes is not None:
            raise ConfigError("--num-classes goes with an MDS dataset; an image folder's classes are its folders")
    if stream:
        if args.data_dir is not None or args.download:
            raise ConfigError("--data-dir and --download are CIFAR-10's; an MDS dataset is --data itself")
        if args.val_data is not None and not is_stream(args.val_data):
            raise ConfigError(
                f"--val-data {args.val_data}: with an MDS --data, the validation split is another MDS dataset (a "
                "URL, or a DIR with its index.json: gpufeed convert it)"
            )
        return
    if is_folder(args.data):
        if args.data_dir is not None:
            raise ConfigError("--data-dir is where CIFAR-10 lives; give an image folder as --data DIR")
        if args.download:
            raise ConfigError("--download fetches or generates CIFAR-10; gpufeed never writes into an image folder")
        if args.val_data is not None and is_stream(args.val_data):
            raise ConfigError(f"--val-data {args.val_data} is an MDS dataset; --data {args.data} is an image folder")
        _check_cache_outside(args)
        return
    if args.val_data is not None:
        raise ConfigError("--val-data goes with --data DIR (an image folder); CIFAR-10 has its own test split")
    if getattr(args, "image_size", None) not in (None, 32):
        raise ConfigError("--image-size applies to image folders; CIFAR-10 images are 32x32")


def stream_sources(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(train, validation or None)`` :class:`~gpufeed.data.mds.StreamSource` of an MDS ``--data``: nothing opened
    yet (under torchrun each rank opens them after the process group exists)."""
    from ..data.mds import StreamSource
    from ..errors import ConfigError

    size = getattr(args, "image_size", None) or 224
    train = StreamSource.of(args.data, args.local, args.cache_limit, size, True)
    val = None if args.val_data is None else StreamSource.of(args.val_data, None, None, size, False)
    if val is not None and (val.remote or val.local) == (train.remote or train.local):
        raise ConfigError(f"--val-data {args.val_data} is the training data: accuracy on it says nothing; give another")
    return train, val


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
    folder or a Hugging Face dataset comes with the folder recipe at ``--image-size`` (``transform`` is
    CIFAR-10's)."""
    from ..data import cifar10, describe
    from ..data.images import is_folder
    from ..data.mds import is_stream

    hf = hf_on_disk(args)
    _check_folder_options(args, hf)
    if is_stream(args.data):
        from ..errors import ConfigError

        raise ConfigError(
            f"--data {args.data} is an MDS dataset, read by gpufeed.stream: this command works on a dataset read "
            "sample by sample (CIFAR-10, an image folder); gpufeed train, bench and diagnose take MDS datasets"
        )
    if is_folder(args.data):
        size = getattr(args, "image_size", None) or 224
        train_set, val_set, what = _splits(args, size, hf)
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
    from ..data.images import is_folder
    from ..data.mds import is_stream
    from ..train.loaders import eval_transform, train_transform
    from .hf_data import hf_subset

    hf = hf_on_disk(args)
    _check_folder_options(args, hf)
    if is_stream(args.data):
        return _stream_train_test(args, train_size, test_size)
    if is_folder(args.data):
        size = getattr(args, "image_size", None) or 224
        train, test, what = _splits(args, size, hf)
        held = (len(train), len(test) if test is not None else 0)
        used = subset_note(train_size, test_size, held, spread=True)
        val = f", {len(test):,} validation" if test is not None else ""
        if lead():
            print(f"data: {what}: {len(train):,} training images in {len(train.classes)} classes{val}{used}, "
                  f"{size}x{size} crops", flush=True)  # fmt: skip
        if hf is not None:  # the spread subset made here: the training loop's is an image folder's
            train, test = hf_subset(train, train_size), hf_subset(test, test_size) if test is not None else None
        return train, test
    train = load_data(args, True, train_transform(), announce=False)
    test = load_data(args, False, eval_transform(), announce=False)
    if lead():
        used = subset_note(train_size, test_size, (len(train), len(test)))
        print(f"data: {describe(train)}, {len(test):,} test samples{used}", flush=True)
    return train, test


def _splits(args: argparse.Namespace, size: int, hf: Any) -> tuple[Any, Any | None, str]:
    """``(train, validation or None, description)`` of an image folder or a Hugging Face dataset on disk (``hf``,
    what :func:`hf_on_disk` found)."""
    from ..data.images import folder_splits
    from .hf_data import hf_splits

    if hf is not None:
        image_key, label_key = getattr(args, "image_key", None), getattr(args, "label_key", "auto")
        return hf_splits(args.data, args.val_data, size, image_key, label_key, getattr(args, "config", None), hf)
    return folder_splits(args.data, args.val_data, size, args.data_seed)


def _stream_train_test(args: argparse.Namespace, train_size: int | None, test_size: int | None) -> Any:
    """The MDS sources of a run and the data line; the samples and classes are printed once the loader has opened
    the index (a remote's is fetched then)."""
    train, test = stream_sources(args)
    if lead():
        count = train.samples()
        held = f": {count:,} samples" if count is not None else ""
        used = ""
        if train_size and (count is None or train_size < count):
            used = f" (using the first {train_size:,} of each epoch's order)"
        val = f"; validation {test.describe()}" if test is not None else " (no --val-data: accuracy not measured)"
        note = ""
        if test is not None and test_size and (test.samples() is None or test_size < (test.samples() or 0)):
            note += f"; the first {test_size:,} of it scored"
        print(f"data: {train.describe()}{held}{used}{val}, {train.image_size}x{train.image_size} crops{note}",
              flush=True)  # fmt: skip
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
        help=f"images per batch (default {DEFAULT_BATCH_SIZE}, or all the training images when there are fewer); of "
        "an MDS dataset the global batch, all processes together (divisible by their number)",
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
    if plan is not None and plan.storage == "stream":
        lines.append("plan: gpufeed.stream, each batch read from the shards, decoded and augmented")
        lines += [f"  {line}" for line in str(plan).splitlines()]
        plan = None
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


def describe_run(run: Any, images: int, batch_size: int) -> list[str]:
    """:func:`describe_epoch` of a prepared run (``gpufeed.train.loop.Prepared``); of an MDS dataset, the samples
    its index lists (known now: a remote's was fetched as the loader opened) and ``batch_size`` the global batch."""
    if run.samples is None:
        return describe_epoch(run.loader, images, batch_size, run.world_size)
    lines = [f"stream: {run.samples:,} samples in {run.num_classes} classes"]
    used = min(images, run.samples) if images else run.samples
    return lines + describe_epoch(run.loader, used, batch_size // run.world_size, run.world_size)


def training_images(train: Any, train_size: int | None) -> int:
    """The training images a run uses: ``--train-size`` of them, or all (of an MDS dataset: what its index lists,
    0 when it is remote, known once the loader has fetched the index)."""
    from ..data.mds import StreamSource

    held = (train.samples() or 0) if isinstance(train, StreamSource) else len(train)
    return min(held, train_size) if train_size and held else (train_size or held)


def settle_batch_size(args: argparse.Namespace, train: Any, train_size: int | None) -> None:
    """Set ``args.batch_size`` to what the run uses (see :func:`choose_batch_size`), printing why if it was chosen.
    Of an MDS dataset the batch size is the global one (all processes together: the stream's order is made of
    global batches, the same at any world size), divisible by the number of processes."""
    from ..data.mds import StreamSource

    if not isinstance(train, StreamSource):
        args.batch_size, why = choose_batch_size(args.batch_size, training_images(train, train_size), world_size())
        if why and lead():
            print(why, flush=True)
        return
    world, images, requested = world_size(), training_images(train, train_size), args.batch_size
    why = None
    if not images:  # a remote's size is known once its index is fetched: gpufeed.stream checks the batch then
        args.batch_size = requested or DEFAULT_BATCH_SIZE
    else:
        args.batch_size, why = choose_batch_size(requested, images, 1)
    if requested is None:  # the default, made divisible by the processes
        args.batch_size = max(world, args.batch_size - args.batch_size % world)
    if why and lead():
        print(f"global batch size {args.batch_size}{why[why.index(':') :]}", flush=True)
    if args.batch_size % world:
        from ..errors import ConfigError

        raise ConfigError(
            f"--batch-size {args.batch_size} is the global batch of an MDS dataset, shared by {world} processes: give "
            f"a multiple of {world}"
        )
