"""``gpufeed tune``: DataLoader settings for a dataset, by measurement."""

from __future__ import annotations

import argparse
from typing import Any

from .common import add_batch_size, add_data_arguments, positive, seconds_or_rate

HELP = (
    "measure num_workers, prefetch_factor, pin_memory for the DataLoader of a dataset and print the best (of an MDS "
    "dataset: the engine's StreamingDataset in a DataLoader, decoded per sample; gpufeed bench compares gpufeed.stream)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    add_batch_size(p)
    p.add_argument("--time-budget", type=seconds_or_rate, default=60, help="seconds the search may take")
    p.add_argument("--device", default="cpu", help="where batches go (cuda: the copy is timed, pinning tried)")
    p.add_argument(
        "--max-workers", type=positive, default=None, help="largest worker count tried (default: usable cores)"
    )


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..data.mds import is_stream
    from ..report import table_rows
    from ..train.loaders import train_transform
    from ..tune import tune_dataloader
    from .common import DEFAULT_BATCH_SIZE, load_data

    if is_stream(args.data):
        dataset = _engine_samples(args)
    else:
        dataset = load_data(args, train=True, transform=train_transform())
    if args.batch_size is None:  # (a DataLoader keeps its last, partial batch: any size runs; the default fits)
        args.batch_size = min(DEFAULT_BATCH_SIZE, len(dataset))
        if args.batch_size < DEFAULT_BATCH_SIZE:
            print(f"batch size {args.batch_size}: the default {DEFAULT_BATCH_SIZE} is more than the "
                  f"{len(dataset)} images (set --batch-size)")  # fmt: skip
    columns = [
        ("num_workers", "workers", "d"),
        ("prefetch_factor", "prefetch", "d"),
        ("pin_memory", "pinned", ""),
        ("images_per_s", "img/s", ",.0f"),
        ("spread", "noise", ".0%"),
        ("startup_s", "start-up s", ".2f"),
    ]
    header, row = table_rows(columns)
    print(header, flush=True)
    cfg = tune_dataloader(
        dataset,
        args.batch_size,
        args.time_budget,
        device=args.device,
        max_workers=args.max_workers,
        on_trial=lambda trial: print(row(asdict(trial)), flush=True),  # each trial as it is measured
    )
    fastest = max(cfg.table, key=lambda t: t.images_per_s)
    if any(note.startswith("no gain measured") for note in cfg.notes):  # the defaults kept: a gain within the noise
        print(f"\nbest: DataLoader(dataset, **{cfg.kwargs})  -> no gain measured over the default settings "
              f"(the fastest trial's {fastest.images_per_s / cfg.table[0].images_per_s:.2f}x is within the "
              f"{cfg.noise:.0%} noise)")  # fmt: skip
    else:
        print(f"\nbest: DataLoader(dataset, **{cfg.kwargs})  -> {cfg.speedup:.2f}x the default settings")
    for note in cfg.notes:
        print(f"note: {note}")
    return 0


def _engine_samples(args: argparse.Namespace) -> Any:
    """An MDS ``--data`` as a training script reads it without gpufeed: the engine's ``StreamingDataset`` (its order
    and worker shares), each sample decoded with PIL and run through the training recipe. gpufeed.stream reads whole
    batches on threads of its own, with nothing to tune; this is the DataLoader a user keeps."""
    from ..data.mds import StreamSource
    from ..mds.shards import default_local
    from ..train.streams import engine_samples
    from .common import DEFAULT_BATCH_SIZE, _check_folder_options, hf_on_disk, lead

    _check_folder_options(args, hf_on_disk(args))  # the options that do not fit a stream, refused as for the others
    source = StreamSource.of(args.data, args.local, args.cache_limit, args.image_size or 224, train=True)
    local = source.local or default_local(str(source.remote))
    batch = args.batch_size or DEFAULT_BATCH_SIZE
    if lead():
        print(f"data: {source.describe()}, read by the engine's StreamingDataset in a DataLoader, each sample decoded "
              f"with PIL, {source.image_size}x{source.image_size} crops", flush=True)  # fmt: skip
    return engine_samples(source.remote, local, batch, source.image_size, source.cache_limit)
