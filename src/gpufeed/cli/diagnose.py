"""``gpufeed diagnose``: the diagnosis of a training configuration, without writing code."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import output_dir
from .train import add_run_arguments, config_from

HELP = "is the GPU waiting on data? run a configuration for some steps and print the verdict and the fixes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.add_argument("--steps", type=int, default=50, help="training steps to measure")
    p.add_argument(
        "--out", type=output_dir, default=Path("diagnose-out"), help="folder for report.md/json, timeline.png"
    )


def run(args: argparse.Namespace) -> int:
    from ..diagnose import diagnose
    from ..train.loop import prepare
    from .common import DEFAULT_BATCH_SIZE, describe_epoch, lead, load_train_test, settle_batch_size, training_images

    config_from(args, batch_size=args.batch_size or DEFAULT_BATCH_SIZE)  # checked before the data is read
    datasets = load_train_test(args, args.train_size, args.test_size)
    settle_batch_size(args, datasets[0], args.train_size)
    cfg = config_from(args, progress=False)
    prepared = prepare(cfg, datasets)
    if lead():
        images = training_images(datasets[0], args.train_size)
        print("\n".join(describe_epoch(prepared.loader, images, cfg.batch_size, prepared.world_size)), flush=True)
    report = diagnose(prepared.loader, lambda batch: prepared.step(*batch), steps=args.steps, device=prepared.device)
    print(report)
    print(f"wrote {report.save(args.out)}")
    return 0
