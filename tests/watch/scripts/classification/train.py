"""The shape of torchvision's ``references/classification/train.py``: ``load_data`` builds ``ImageFolder``s whose
transforms are ``presets.ClassificationPresetTrain`` / ``ClassificationPresetEval`` objects (from the sibling
``presets.py``), a ``RandomSampler`` (``DistributedSampler`` under ``--distributed``) passed as ``sampler=``,
``collate_fn=None`` unless mixup/cutmix, ``pin_memory=True``; ``train_one_epoch`` and ``evaluate``.

Usage: python train.py --data-path DIR [-b B] [-j N] [--epochs E] [--train-crop-size S] [--backend pil|tensor]
[--use-v2]

DIR holds ``train/`` and ``val/`` image folders. Prints ``step K loss L`` per training batch and ``batches seen N``
at the end.
"""

from __future__ import annotations

import argparse
import os

import presets
import torch
import torch.utils.data
import torchvision
from torchvision.transforms.functional import InterpolationMode


def train_one_epoch(model, criterion, optimizer, data_loader, device, seen):
    model.train()
    for image, target in data_loader:
        image, target = image.to(device), target.to(device)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {seen} loss {loss.item():.6f}", flush=True)
        seen += 1
    return seen


def evaluate(model, criterion, data_loader, device):
    model.eval()
    with torch.inference_mode():
        for image, target in data_loader:
            criterion(model(image.to(device)), target.to(device))


def load_data(traindir, valdir, args):
    interpolation = InterpolationMode(args.interpolation)
    dataset = torchvision.datasets.ImageFolder(
        traindir,
        presets.ClassificationPresetTrain(
            crop_size=args.train_crop_size,
            interpolation=interpolation,
            auto_augment_policy=getattr(args, "auto_augment", None),
            random_erase_prob=getattr(args, "random_erase", 0.0),
            backend=args.backend,
            use_v2=args.use_v2,
        ),
    )
    dataset_test = torchvision.datasets.ImageFolder(
        valdir,
        presets.ClassificationPresetEval(
            crop_size=args.val_crop_size,
            resize_size=args.val_resize_size,
            interpolation=interpolation,
            backend=args.backend,
            use_v2=args.use_v2,
        ),
    )
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
        test_sampler = torch.utils.data.distributed.DistributedSampler(dataset_test, shuffle=False)
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
        test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    return dataset, dataset_test, train_sampler, test_sampler


def main(args):
    device = torch.device(args.device)
    torch.manual_seed(0)
    train_dir = os.path.join(args.data_path, "train")
    val_dir = os.path.join(args.data_path, "val")
    dataset, dataset_test, train_sampler, test_sampler = load_data(train_dir, val_dir, args)

    collate_fn = None
    data_loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=train_sampler,
        num_workers=args.workers,
        pin_memory=True,
        collate_fn=collate_fn,
    )
    data_loader_test = torch.utils.data.DataLoader(
        dataset_test, batch_size=args.batch_size, sampler=test_sampler, num_workers=args.workers, pin_memory=True
    )

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    model(torch.zeros(1, 3, args.train_crop_size, args.train_crop_size))
    model.to(device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    seen = 0
    for _ in range(args.epochs):
        seen = train_one_epoch(model, criterion, optimizer, data_loader, device, seen)
        evaluate(model, criterion, data_loader_test, device=device)
    print(f"batches seen {seen}", flush=True)


def get_args_parser(add_help=True):
    parser = argparse.ArgumentParser(description="PyTorch Classification Training", add_help=add_help)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/", type=str)
    parser.add_argument("--device", default="cpu", type=str)
    parser.add_argument("-b", "--batch-size", default=16, type=int)
    parser.add_argument("--epochs", default=2, type=int, metavar="N")
    parser.add_argument("-j", "--workers", default=0, type=int, metavar="N")
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M")
    parser.add_argument("--label-smoothing", default=0.0, type=float)
    parser.add_argument("--interpolation", default="bilinear", type=str)
    parser.add_argument("--val-resize-size", default=36, type=int)
    parser.add_argument("--val-crop-size", default=32, type=int)
    parser.add_argument("--train-crop-size", default=32, type=int)
    parser.add_argument("--distributed", action="store_true")
    parser.add_argument("--backend", default="PIL", type=str.lower)
    parser.add_argument("--use-v2", action="store_true")
    return parser


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    main(args)
