"""``gpufeed bench``: the CIFAR-10 speed ladder, side by side in one process."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_batch_size, add_data_arguments, load_train_test, output_dir, positive, settle_batch_size
from .types import seed

HELP = (
    "the speed ladder: DataLoader -> cached -> GPU-resident -> gpufeed -> AMP -> CUDA graphs, vs the model alone; of "
    "an MDS dataset (--data s3://... or DIR with index.json): the engine's StreamingDataset in a DataLoader -> "
    "gpufeed.stream -> AMP -> CUDA graphs"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument(
        "--model", default=None, help="default on a GPU: vgg16 (CIFAR-10), resnet50 (image folders); small on a CPU"
    )
    p.add_argument(
        "--train-size",
        type=positive,
        default=None,
        help="default: all on a GPU; on a CPU CIFAR-10's first 5,000 images or 512 of a folder, evenly spaced",
    )
    p.add_argument("--test-size", type=positive, default=None)
    add_batch_size(p)
    p.add_argument("--seed", type=seed, default=0, help="the seed: an int in [0, 2**64)")
    p.add_argument("--out", type=output_dir, default=Path("bench-out"), help="folder for bench.json and bench.png")


def run(args: argparse.Namespace) -> int:
    from ..bench import run_bench, sized_config
    from ..device import resolve_device

    where = resolve_device(args.device)
    stream = {"local": args.local, "cache_limit": args.cache_limit, "num_classes": args.num_classes}
    # only its sizes are used here: the batch size is settled once the data is known
    sized, _ = sized_config(
        where, args.model, args.train_size, args.test_size, args.batch_size or 1, args.seed, args.data,
        args.image_size, args.val_data, **stream,
    )  # fmt: skip
    datasets = load_train_test(args, sized.train_size, sized.test_size)
    settle_batch_size(args, datasets[0], sized.train_size)
    run_bench(
        args.device,
        args.model,
        args.train_size,
        args.test_size,
        args.batch_size,
        args.seed,
        args.out,
        datasets=datasets,
        data=args.data,
        image_size=args.image_size,
        val_data=args.val_data,
        **stream,
    )
    return 0
