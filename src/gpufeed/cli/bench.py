"""``gpufeed bench``: the CIFAR-10 speed ladder, side by side in one process."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_data_arguments, load_train_test, output_dir, positive, subset_note

HELP = "the CIFAR-10 ladder: DataLoader -> cached -> GPU-resident -> gpufeed -> AMP -> CUDA graphs, vs the model alone"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--model", default=None, help="default: vgg16 on a GPU, small on a CPU")
    p.add_argument("--train-size", type=positive, default=None, help="default: all 50,000 on a GPU, 5,000 on a CPU")
    p.add_argument("--test-size", type=positive, default=None)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=output_dir, default=Path("bench-out"), help="folder for bench.json and bench.png")


def run(args: argparse.Namespace) -> int:
    from ..bench import run_bench, sized_config
    from ..device import resolve_device
    from ..train.loaders import eval_transform, train_transform

    sized, _ = sized_config(
        resolve_device(args.device), args.model, args.train_size, args.test_size, args.batch_size, args.seed
    )
    datasets = load_train_test(
        args, train_transform(), eval_transform(), subset_note(sized.train_size, sized.test_size)
    )
    run_bench(
        args.device,
        args.model,
        args.train_size,
        args.test_size,
        args.batch_size,
        args.seed,
        args.out,
        datasets=datasets,
    )
    return 0
