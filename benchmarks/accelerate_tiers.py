"""accelerate(): ingestion and cache costs, and each storage tier against torchvision's DataLoader.

Synthetic CIFAR-10 (50,000 training images in the real format) with the usual training transform
RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize, batch 256.

1. Ingestion: gpufeed's vectorised read (uint8, the deterministic part moves to the device) against
   the per-sample pre-transform (ToTensor + Normalize once per image into a float tensor).
2. Cache: building the on-disk entry (write + hash + verify) and opening it again (verified).
3. Steady-state epochs: each tier of accelerate() against DataLoader(dataset) with the original
   per-sample transform.

    python benchmarks/accelerate_tiers.py [--device cuda] [--workers 0,2] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed.data import cifar10
from gpufeed.train.loaders import subset
from gpufeed.workers import loader_kwargs

from harness import environment, print_table, save_json, time_epochs

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
TRAIN_TF = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def _seconds(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def ingestion(ds) -> dict:
    pre = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    raw = cifar10("synthetic", train=True)  # no transform: PIL images, as the pre-transform loop sees them
    per_sample, _ = _seconds(lambda: torch.stack([pre(raw[i][0]) for i in range(len(raw))]))
    vectorised, loader = _seconds(lambda: gf.accelerate(ds, device="cpu", cache=False, progress=False))
    with tempfile.TemporaryDirectory() as d:
        build, cache = _seconds(lambda: gf.build_cache(ds, Path(d) / "entry", progress=False))
        reopen, _ = _seconds(lambda: gf.open_cache(Path(d) / "entry"))
        mib = cache.nbytes / 2**20
    return {
        "per_sample_pretransform_s": per_sample,
        "accelerate_ingest_s": vectorised,
        "cache_build_s": build,
        "cache_open_verified_s": reopen,
        "cache_mib": mib,
        "plan": str(loader.plan),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=lambda s: [int(v) for v in s.split(",")], default=[0, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--n", type=int, default=None, help="the first N training images (default: all 50,000)")
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    ds = subset(cifar10("synthetic", train=True, transform=TRAIN_TF), args.n)

    ing = ingestion(ds)
    print(
        f"ingestion of {len(ds)} images: per-sample pre-transform {ing['per_sample_pretransform_s']:.2f} s, "
        f"gpufeed {ing['accelerate_ingest_s']:.3f} s; cache build {ing['cache_build_s']:.2f} s "
        f"({ing['cache_mib']:.0f} MiB), verified open {ing['cache_open_verified_s']:.2f} s"
    )

    rows = []
    for w in args.workers:
        dl = DataLoader(
            ds, batch_size=256, shuffle=True, pin_memory=device.type == "cuda", **loader_kwargs(w, persistent=True)
        )
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        rows.append(
            time_epochs(
                f"torchvision DataLoader, num_workers={w}", lambda dl=dl: dl, device, args.torch_repeats, consume
            )
        )
    tiers = [("device", None)] + ([("pinned", 0)] if device.type == "cuda" else []) + [("mmap", 0)]
    for tier, budget in tiers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tier warning is the point of this row
            if tier == "mmap" and device.type == "cuda":
                import gpufeed.pipeline.plan as acc

                host = acc.HOST_BUDGET_FRACTION
                acc.HOST_BUDGET_FRACTION = 0.0  # push past the pinned tier to measure the memory map
            loader = gf.accelerate(ds, device=device, memory_budget=budget, cache=False, progress=False)
            if tier == "mmap" and device.type == "cuda":
                acc.HOST_BUDGET_FRACTION = host
        assert loader.plan.storage == tier, loader.plan.storage
        rows.append(
            time_epochs(f"gpufeed accelerate, {tier} tier ({device.type})", lambda lo=loader: lo, device, args.repeats)
        )
    env = environment(device, images=len(ds), batch_size=256, repeats=args.repeats, transforms=str(TRAIN_TF))
    print(", ".join(f"{k}={v}" for k, v in env.items() if k != "transforms"))
    print_table(rows, baseline=rows[0])
    save_json(args.out / "accelerate_tiers.json", {**env, "ingestion": ing}, rows, baseline=rows[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
