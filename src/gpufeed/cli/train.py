"""``gpufeed train``: the fast training loop on (synthetic) CIFAR-10."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .common import add_batch_size, add_data_arguments, count, output_dir, positive, seconds_or_rate
from .types import seed

HELP = (
    "train a model on CIFAR-10, an image folder or an MDS dataset (--data s3://bucket/prefix --local /scratch/cache) "
    "with a chosen loader and precision; records to DIR/train.json"
)


_LAUNCHER = ("--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", type=output_dir, default=Path("train-out"), help="folder for train.json")
    p.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("distributed (DDP through torch.distributed.run; NCCL on GPUs, gloo on CPUs)")
    g.add_argument("--nproc-per-node", type=int, default=None, help="processes on this node (one per GPU)")
    g.add_argument("--nnodes", type=int, default=1)
    g.add_argument("--node-rank", type=int, default=0)
    g.add_argument("--master-addr", default=None, help="address of node 0 (multi-node)")
    g.add_argument("--master-port", type=int, default=29500)


def _launch(args: argparse.Namespace) -> int:
    """Re-run this command under torch's launcher, once per process, without the launcher options."""
    import subprocess
    import sys

    rest, skip = [], False
    for a in args.argv:
        if skip:
            skip = False
        elif a in _LAUNCHER:
            skip = True
        elif a == "--local" or a.startswith("--local="):
            # the launcher's parser reads any prefix of its own options, even after the script: --local would be
            # its --local-addr (or ambiguous); --local-dir is the same option of ours, and no prefix of the launcher's
            rest.append(a.replace("--local", "--local-dir", 1))
        elif not a.startswith(tuple(f"{opt}=" for opt in _LAUNCHER)):
            rest.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc_per_node)]
    if args.nnodes == 1 and args.master_addr is None:
        cmd.append("--standalone")
    else:
        cmd += [
            "--nnodes",
            str(args.nnodes),
            "--node-rank",
            str(args.node_rank),
            "--master-addr",
            args.master_addr or "127.0.0.1",
            "--master-port",
            str(args.master_port),
        ]
    return subprocess.call([*cmd, "-m", "gpufeed", *rest])


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options that set up a run; ``gpufeed diagnose`` takes the same ones."""
    from ..train.kinds import LOADER_KINDS
    from ..train.models import FOLDER_MODELS, MODELS

    add_data_arguments(p)
    p.add_argument(
        "--model",
        choices=sorted({*MODELS, *FOLDER_MODELS}),
        default="small",
        help=f"CIFAR-10: {', '.join(sorted(MODELS))}; image folders and MDS datasets: torchvision's "
        f"{', '.join(FOLDER_MODELS[1:])} (random init) or small",
    )
    p.add_argument(
        "--loader",
        choices=[k for k in LOADER_KINDS if k != "fixed"],
        default="gpufeed",
        help="gpufeed (gf.accelerate; of an MDS dataset gpufeed.stream) or a baseline: torch (a DataLoader; of an MDS "
        "dataset the engine's StreamingDataset in one), pretransform, gpu-per-sample (CIFAR-10 only)",
    )
    p.add_argument(
        "--num-workers", type=count, default=None, help="DataLoader workers (torch and pretransform loaders)"
    )
    p.add_argument(
        "--store",
        choices=["auto", "pixels", "jpeg"],
        default="auto",
        help="image folders: keep decoded pixels or the files' bytes (accelerate's store=)",
    )
    p.add_argument(
        "--max-side", type=positive, default=None, help="image folders: downscale the pixel store once (max_side=)"
    )
    p.add_argument("--amp", choices=["off", "fp16", "bf16"], default="off")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--cuda-graphs", action="store_true", help="capture forward, backward and step in a CUDA graph")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    add_batch_size(p)
    p.add_argument("--lr", type=seconds_or_rate, default=0.05, help="the learning rate (a finite number > 0)")
    p.add_argument("--seed", type=seed, default=0, help="the seed: an int in [0, 2**64)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument(
        "--train-size",
        type=positive,
        default=None,
        help="train on N images: CIFAR-10's first N; of an image folder, N evenly spaced (all its classes); of an "
        "MDS dataset, the first N of each epoch's order (whole global batches)",
    )
    p.add_argument(
        "--test-size",
        type=positive,
        default=None,
        help="test on N images: CIFAR-10's first N; of an image folder, N evenly spaced; of an MDS dataset, its first "
        "N (whole global batches)",
    )


def config_from(args: argparse.Namespace, **overrides: object) -> Any:
    """The :class:`~gpufeed.train.TrainConfig` the run options describe."""
    from ..train import TrainConfig

    fields: dict[str, Any] = dict(
        model=args.model,
        loader=args.loader,
        batch_size=args.batch_size,
        lr=args.lr,
        amp=args.amp,
        channels_last=args.channels_last,
        cuda_graphs=args.cuda_graphs,
        compile=args.compile,
        seed=args.seed,
        device=args.device,
        num_workers=args.num_workers,
        train_size=args.train_size,
        test_size=args.test_size,
        data=args.data,
        data_dir=str(args.data_dir) if args.data_dir else None,
        download=args.download,
        val_data=args.val_data,
        image_size=args.image_size,
        store=args.store,
        max_side=args.max_side,
        local=args.local,
        cache_limit=args.cache_limit,
        num_classes=args.num_classes,
    )
    fields.update(overrides)
    return TrainConfig(**fields)


def run(args: argparse.Namespace) -> int:
    import os

    from ..report import format_table
    from ..train import train
    from .common import DEFAULT_BATCH_SIZE, describe_run, lead, load_train_test, settle_batch_size, training_images

    if args.nproc_per_node and "LOCAL_RANK" not in os.environ:
        return _launch(args)
    # checked before the data is read (the batch size that fits is known after)
    config_from(args, epochs=args.epochs, batch_size=args.batch_size or DEFAULT_BATCH_SIZE)
    datasets = load_train_test(args, args.train_size, args.test_size)
    settle_batch_size(args, datasets[0], args.train_size)
    cfg = config_from(args, epochs=args.epochs, progress=not args.no_progress)
    images = training_images(datasets[0], args.train_size)

    def announce(run: Any) -> None:  # before the first epoch: what it trains on, and what it drops
        if lead():
            print("\n".join(describe_run(run, images, cfg.batch_size)), flush=True)

    records = train(cfg, args.out, datasets, on_ready=announce)
    if not lead():
        return 0  # rank 0 reports for everyone
    columns = [
        ("epoch", "epoch", "d"),
        ("epoch_s", "seconds", ".2f"),
        ("images_per_s", "img/s", ",.0f"),
        ("data_wait_fraction", "data wait", ".1%"),
        ("gpu_util", "GPU %", ".0f"),
        ("train_loss", "train loss", ".4f"),
        ("test_acc", "test acc", ".4f"),
    ]
    print(format_table([asdict(r) for r in records], columns))
    notes = {n for r in records for n in r.notes}
    for n in sorted(notes):
        print(f"note: {n}")
    print(f"wrote {args.out / 'train.json'}")
    return 0
