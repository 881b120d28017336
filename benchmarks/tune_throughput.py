"""tune_dataloader() against the defaults and the rule of thumb, side by side in one run.

The embedded synthetic CIFAR-10 with torchvision's per-sample training transform (RandomCrop +
flip + ToTensor + Normalize), batch 256. Rows: DataLoader defaults (num_workers=0); the rule of
thumb (num_workers = os.cpu_count(), pin_memory, persistent workers); the tuned configuration.
Each measured as steady-state epochs (median of repeats after a warm-up epoch), to the device.

    python benchmarks/tune_throughput.py [--device cuda] [--budget 60] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed.data import cifar10
from gpufeed.train.loaders import train_transform

from harness import environment, print_table, save_json, time_epochs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--budget", type=float, default=60)
    p.add_argument("--n", type=int, default=20_000, help="training images used")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    ds = gf.train.loaders.subset(cifar10("synthetic", transform=train_transform()), args.n)
    cfg = gf.tune_dataloader(ds, 256, args.budget, device=device)
    print(f"tuned: {cfg.kwargs} ({cfg.speedup:.2f}x in the search)")
    cores = os.cpu_count() or 1
    ctx = "forkserver" if torch.cuda.is_initialized() else None
    candidates = {
        "DataLoader defaults (num_workers=0)": dict(batch_size=256),
        f"rule of thumb (num_workers={cores}{', pinned' if device.type == 'cuda' else ''}, persistent)": dict(
            batch_size=256,
            num_workers=cores,
            pin_memory=device.type == "cuda",
            persistent_workers=True,
            multiprocessing_context=ctx,
        ),
        f"gpufeed.tune_dataloader ({args.budget:.0f} s budget)": cfg.kwargs,
    }
    rows = []
    for name, kw in candidates.items():
        loader = DataLoader(ds, shuffle=True, **kw)
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        rows.append(time_epochs(name, lambda lo=loader: lo, device, args.repeats, consume))
    env = environment(device, images=len(ds), batch_size=256, repeats=args.repeats, tuned=str(cfg.kwargs))
    print(", ".join(f"{k}={v}" for k, v in env.items()))
    print_table(rows, baseline=rows[0])
    save_json(args.out / "tune_throughput.json", env, rows, baseline=rows[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
