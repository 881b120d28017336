"""An ImageFolder of JPEGs of different sizes with the standard training recipe, gpufeed against the DataLoader.

The synthetic folder (gpufeed.data.folder: 10 classes, JPEGs around 375x500, generated once into
gpufeed's cache directory) read by torchvision's ImageFolder with
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, batch 64:

1. torchvision's DataLoader with PIL in workers (the user's pipeline as it is);
2. gpufeed.accelerate with the pixel store: each image decoded once, kept as it is (a ragged uint8
   store), RandomResizedCrop + flip + normalise batched per epoch. Its build (one decode of the
   folder) is timed against one DataLoader pass.

    python benchmarks/image_folder.py [--device cuda] [--workers 2] [--n 2000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torchvision.transforms as T
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed.data.folder import synthetic_folder
from gpufeed.workers import loader_kwargs

from harness import environment, print_table, save_json, time_epochs

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 64


def recipe(size: int) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=lambda s: [int(v) for v in s.split(",")], default=[2])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size")
    p.add_argument("--n", type=int, default=2000, help="training images in the synthetic folder")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    t = time.perf_counter()
    ds = synthetic_folder("train", recipe(args.size), sizes=(args.n, max(10, args.n // 4)))
    print(f"synthetic folder: {len(ds):,} JPEGs at {ds.root} (ready in {time.perf_counter() - t:.1f} s)")

    rows = []
    for w in args.workers:
        dl = DataLoader(ds, BATCH, shuffle=True, pin_memory=device.type == "cuda", **loader_kwargs(w, persistent=True))
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        rows.append(time_epochs(f"torchvision DataLoader + PIL, num_workers={w}", lambda dl=dl: dl, device, 1, consume))
    t = time.perf_counter()
    loader = gf.accelerate(ds, BATCH, shuffle=True, device=device, cache=False, progress=False)
    build_s = time.perf_counter() - t
    print(loader.plan)
    rows.append(
        time_epochs(
            f"gpufeed accelerate, pixel store ({device.type})",
            lambda: loader,
            device,
            args.repeats,
            note=f"build {build_s:.1f} s (one decode of the folder), {loader.plan.bytes / 2**20:.0f} MiB",
        )
    )
    env = environment(device, images=len(ds), batch_size=BATCH, repeats=args.repeats, transforms=str(recipe(args.size)))
    print(", ".join(f"{k}={v}" for k, v in env.items() if k != "transforms"))
    print_table(rows, baseline=rows[0])
    pass_s = rows[0].epoch_s
    print(f"pixel store build: {build_s:.1f} s = {build_s / pass_s:.1f} DataLoader passes ({pass_s:.1f} s each)")
    extra = {"pixel_store_build_s": build_s, "pixel_store_mib": loader.plan.bytes / 2**20, "plan": str(loader.plan)}
    save_json(args.out / "image_folder.json", {**env, **extra}, rows, baseline=rows[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
