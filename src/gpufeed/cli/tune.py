"""``gpufeed tune``: DataLoader settings for a dataset, by measurement."""

from __future__ import annotations

import argparse

from .common import add_data_arguments, positive

HELP = "measure num_workers, prefetch_factor, pin_memory for the DataLoader of a dataset and print the best"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--time-budget", type=float, default=60, help="seconds the search may take")
    p.add_argument("--device", default="cpu", help="where batches go (cuda: the copy is timed, pinning tried)")
    p.add_argument(
        "--max-workers", type=positive, default=None, help="largest worker count tried (default: usable cores)"
    )


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..report import table_rows
    from ..train.loaders import train_transform
    from ..tune import tune_dataloader
    from .common import load_data

    dataset = load_data(args, train=True, transform=train_transform())
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
    print(f"\nbest: DataLoader(dataset, **{cfg.kwargs})  -> {cfg.speedup:.2f}x the default settings")
    for note in cfg.notes:
        print(f"note: {note}")
    return 0
