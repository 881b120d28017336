"""The loader section of timm's ``train.py`` (pytorch-image-models, 2025-2026): ``create_dataset`` on a folder,
``resolve_data_config``, the loader's arguments in two dicts, ``common_loader_kwargs`` (mean, std, device, the
prefetcher) and ``train_loader_kwargs`` (the recipe, the workers), then ``create_loader(dataset_train,
input_size=data_config['input_size'], input_size_choices=..., collate_fn=..., **common_loader_kwargs,
**train_loader_kwargs)``; train.py's own defaults (``--color-jitter 0.4``, ``--train-interpolation random``).
A tiny convolution stands in for the model.

Usage: python timm_train.py DATA_DIR [-b B] [-j N] [--epochs E] [--img-size S] [--no-prefetcher] [--aug-repeats R]

Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from timm.data import create_dataset, create_loader, resolve_data_config

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (timm's loader section)")
group = parser.add_argument_group("Dataset parameters")
group.add_argument("data_dir", metavar="DIR")
group.add_argument("--dataset", metavar="NAME", default="")
group.add_argument("--train-split", metavar="NAME", default="train")
group = parser.add_argument_group("Model parameters")
group.add_argument("--img-size", type=int, default=32, metavar="N")
group.add_argument("--interpolation", default="", type=str, metavar="NAME")
group.add_argument("--mean", type=float, nargs="+", default=None, metavar="MEAN")
group.add_argument("--std", type=float, nargs="+", default=None, metavar="STD")
group.add_argument("-b", "--batch-size", type=int, default=16, metavar="N")
group = parser.add_argument_group("Augmentation and regularization parameters")
group.add_argument("--no-aug", action="store_true", default=False)
group.add_argument("--train-crop-mode", type=str, default=None)
group.add_argument("--scale", type=float, nargs="+", default=[0.08, 1.0], metavar="PCT")
group.add_argument("--ratio", type=float, nargs="+", default=[3.0 / 4.0, 4.0 / 3.0], metavar="RATIO")
group.add_argument("--hflip", type=float, default=0.5)
group.add_argument("--vflip", type=float, default=0.0)
group.add_argument("--color-jitter", type=float, default=0.4, metavar="PCT")
group.add_argument("--color-jitter-prob", type=float, default=None, metavar="PCT")
group.add_argument("--grayscale-prob", type=float, default=None, metavar="PCT")
group.add_argument("--gaussian-blur-prob", type=float, default=None, metavar="PCT")
group.add_argument("--aa", type=str, default=None, metavar="NAME")
group.add_argument("--aug-repeats", type=float, default=0)
group.add_argument("--aug-splits", type=int, default=0)
group.add_argument("--reprob", type=float, default=0.0, metavar="PCT")
group.add_argument("--remode", type=str, default="pixel")
group.add_argument("--recount", type=int, default=1)
group.add_argument("--resplit", action="store_true", default=False)
group.add_argument("--train-interpolation", type=str, default="random")
group = parser.add_argument_group("Miscellaneous parameters")
group.add_argument("--epochs", type=int, default=2)
group.add_argument("--seed", type=int, default=42, metavar="S")
group.add_argument("--worker-seeding", type=str, default="all")
group.add_argument("-j", "--workers", type=int, default=0, metavar="N")
group.add_argument("--pin-mem", action="store_true", default=False)
group.add_argument("--no-prefetcher", action="store_true", default=False)
group.add_argument("--use-multi-epochs-loader", action="store_true", default=False)
group.add_argument("--train-img-sizes", type=int, nargs="+", default=None)
group.add_argument("--train-batch-sizes", type=int, nargs="+", default=None)


def main() -> None:
    args = parser.parse_args()
    args.prefetcher = not args.no_prefetcher
    args.distributed = False
    device = torch.device("cpu")
    torch.manual_seed(args.seed)
    data_config = resolve_data_config(vars(args), verbose=False)
    num_aug_splits = args.aug_splits if args.aug_splits > 1 else 0

    dataset_train = create_dataset(
        args.dataset,
        root=args.data_dir,
        split=args.train_split,
        is_training=True,
        batch_size=args.batch_size,
        seed=args.seed,
    )

    # create data loaders w/ augmentation pipeline
    train_interpolation = args.train_interpolation
    if args.no_aug or not train_interpolation:
        train_interpolation = data_config["interpolation"]

    common_loader_kwargs = dict(
        mean=data_config["mean"],
        std=data_config["std"],
        pin_memory=args.pin_mem,
        img_dtype=torch.float32,
        device=device,
        distributed=args.distributed,
        use_prefetcher=args.prefetcher,
    )

    train_loader_kwargs = dict(
        batch_size=args.batch_size,
        is_training=True,
        no_aug=args.no_aug,
        re_prob=args.reprob,
        re_mode=args.remode,
        re_count=args.recount,
        re_split=args.resplit,
        train_crop_mode=args.train_crop_mode,
        scale=args.scale,
        ratio=args.ratio,
        hflip=args.hflip,
        vflip=args.vflip,
        color_jitter=args.color_jitter,
        color_jitter_prob=args.color_jitter_prob,
        grayscale_prob=args.grayscale_prob,
        gaussian_blur_prob=args.gaussian_blur_prob,
        auto_augment=args.aa,
        num_aug_repeats=args.aug_repeats,
        num_aug_splits=num_aug_splits,
        interpolation=train_interpolation,
        num_workers=args.workers,
        worker_seeding=args.worker_seeding,
    )

    collate_fn = None
    loader_train = create_loader(
        dataset_train,
        input_size=data_config["input_size"],
        input_size_choices=args.train_img_sizes,
        batch_size_choices=args.train_batch_sizes,
        collate_fn=collate_fn,
        use_multi_epochs_loader=args.use_multi_epochs_loader,
        **common_loader_kwargs,
        **train_loader_kwargs,
    )

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    model(torch.zeros(1, *data_config["input_size"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = 0
    for _ in range(args.epochs):
        for images, target in loader_train:
            loss = torch.nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
