"""Auto-augment recipes on CIFAR-sized data: gpufeed against the DataLoader with the per-sample pipeline.

The synthetic CIFAR-10 (50,000 32x32 images; ``--n`` takes the first N), the CIFAR training recipe
with each policy inserted on PIL images as people write it:
RandomCrop(32, padding=4) + RandomHorizontalFlip + <policy> + ToTensor + Normalize, batch 256.
For each policy, side by side in one run: torchvision's DataLoader (PIL per sample in workers) and
gpufeed.accelerate (the policy batched: each op once per batch on its samples).

    python benchmarks/auto_augment.py [--device cuda] [--workers 2] [--n 10000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed.data import cifar10
from gpufeed.workers import loader_kwargs

from harness import environment, print_table, save_json, time_epochs

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
POLICIES = {
    "TrivialAugmentWide": T.TrivialAugmentWide,
    "RandAugment": T.RandAugment,
    "AutoAugment(cifar10)": lambda: T.AutoAugment(T.AutoAugmentPolicy.CIFAR10),
}


def recipe(policy: T.Compose) -> T.Compose:
    return T.Compose(
        [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), policy, T.ToTensor(), T.Normalize(MEAN, STD)]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    rows = []
    for name, make in POLICIES.items():
        ds = cifar10("synthetic", train=True, transform=recipe(make()))
        ds.data, ds.targets = ds.data[: args.n], ds.targets[: args.n]
        dl = DataLoader(
            ds,
            args.batch,
            shuffle=True,
            pin_memory=device.type == "cuda",
            **loader_kwargs(args.workers, persistent=True),
        )
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        base = time_epochs(
            f"{name}: DataLoader + PIL, num_workers={args.workers}", lambda dl=dl: dl, device, 1, consume
        )
        loader = gf.accelerate(ds, args.batch, shuffle=True, device=device, cache=False, progress=False)
        assert loader.plan.storage != "fallback", loader.plan
        ours = time_epochs(
            f"{name}: gpufeed accelerate ({device.type})", lambda loader=loader: loader, device, args.repeats
        )
        rows += [base, ours]
        print(f"{name}: {base.epoch_s / ours.epoch_s:.1f}x the DataLoader", flush=True)
    env = environment(
        device, images=args.n, batch_size=args.batch, repeats=args.repeats, torch_threads=torch.get_num_threads()
    )
    print(", ".join(f"{k}={v}" for k, v in env.items()))
    print_table(rows, baseline=rows[0])
    save_json(args.out / "auto_augment.json", env, rows, rows[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
