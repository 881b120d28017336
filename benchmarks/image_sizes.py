"""The loader at every image size, side by side in one run: gpufeed DeviceLoader against the DataLoader.

For each size S: synthetic uint8 images (SxS, 3 channels), RandomCrop(S, padding=S/8) +
RandomHorizontalFlip + Normalize, batch 256. The DataLoader rows run the same torchvision transforms
per sample on PIL images (``ToTensor`` before ``Normalize``), as ``torchvision.datasets`` serves them;
the gpufeed rows run the batched ops on the resident uint8 images. Each row also reports the bytes
the loader moves per second (the uint8 images read plus the float32 batch written) and, measured in
the same run, what the plainest copy of the same bytes moves (the epoch's uint8 images converted into a
float32 tensor by one ``copy_``), with their fraction. ``--paths`` times three ways to read a batch
through a crop and flip map at each size (one gather through a flat index; rows first, then columns;
whole-row windows), the CPU's choice among them.

    python benchmarks/image_sizes.py                           # CPU: 32, 64, 128, 256
    python benchmarks/image_sizes.py --device cuda --workers 16 --sizes 32,64,128,224,256 --out DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf  # noqa: E402
from gpufeed import augment as A  # noqa: E402
from gpufeed.device import sync  # noqa: E402
from gpufeed.workers import loader_kwargs  # noqa: E402
from loader_throughput import PILDataset, airbench_row  # noqa: E402

from harness import Timing, environment, print_table, save_json, time_epochs  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def copy_bandwidth(images: torch.Tensor, device: torch.device, repeats: int = 5) -> float:
    """Bytes per second of the plainest way to move the same bytes as an epoch: every uint8 image converted
    into a float32 tensor by one ``copy_`` (read 1 byte, write 4, per value); median of ``repeats``."""
    src = images.to(device)
    dst = torch.empty(src.shape, dtype=torch.float32, device=device)
    dst.copy_(src)  # first touch
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return src.numel() * 5 / float(np.median(times))


def crop_paths(size: int, batch: int, repeats: int = 7) -> dict[str, float]:
    """Milliseconds per batch to read uint8 images through a crop (padding size/8) and flip map at ``size``: one
    gather through a flat index (the GPU's way), rows first then columns, and whole-row windows (the CPU's way);
    median of ``repeats``, on the CPU."""
    from gpufeed.augment import chunks
    from gpufeed.augment import geometry as G

    x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    pad, g = size // 8, torch.Generator().manual_seed(0)
    offsets = [torch.randint(0, 2 * pad + 1, (batch,), generator=g) for _ in range(2)]
    m = G.crop_map(*offsets, (size, size), (size, size), (pad,) * 4)
    m = m.then(G.flip_map(torch.rand(batch, generator=g) < 0.5, size, "cols"))
    ways = {
        "flat_gather": lambda: G.remap(x, m),
        "rows_first": lambda: G.remap(x, m, rows_first=True),
        "row_windows": lambda: chunks.remap_windows(x, m, None),
    }
    out = {}
    for name, way in ways.items():
        way()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            way()
            times.append(time.perf_counter() - t)
        out[name] = round(1000 * float(np.median(times)), 3)
    return out


def rows_for(size: int, args: argparse.Namespace, device: torch.device) -> tuple[list[Timing], dict]:
    n = max(args.batch_size * 4, int(args.pixels // (size * size)))  # about the same bytes at every size
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    pad = size // 8
    tv = T.Compose([T.RandomCrop(size, padding=pad), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    dl = DataLoader(
        PILDataset(data, labels.tolist(), tv),
        args.batch_size,
        shuffle=True,
        pin_memory=device.type == "cuda",
        **loader_kwargs(args.workers, persistent=True),
    )
    consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
    base = time_epochs(f"{size}px: DataLoader + PIL, num_workers={args.workers}", lambda dl=dl: dl, device, 1, consume)
    images = torch.from_numpy(data).permute(0, 3, 1, 2).contiguous()
    aug = A.Compose([A.RandomCrop(size, padding=pad), A.RandomHorizontalFlip(), A.Normalize(MEAN, STD)])
    loader = gf.DeviceLoader(
        images, torch.from_numpy(labels), args.batch_size, True, transform=aug, device=device, seed=0
    )
    ours = time_epochs(f"{size}px: gpufeed DeviceLoader ({device.type})", lambda: loader, device, args.repeats)
    per_image = 3 * size * size * (1 + 4)  # uint8 read + float32 written
    copy = copy_bandwidth(images, device)
    extra = {
        "size": size,
        "images": n,
        "speedup": round(base.epoch_s / ours.epoch_s, 2),
        "loader_bytes_per_s": round(ours.images_per_s * per_image),
        "copy_bytes_per_s": round(copy),
        "fraction_of_copy": round(ours.images_per_s * per_image / copy, 3),
    }
    if device.type == "cpu" and args.paths:
        extra["crop_paths_ms"] = crop_paths(size, args.batch_size)
    rows = [base, ours]
    if size == 32 and device.type == "cuda":  # airbench's CifarLoader (crop + flip, whole epoch at once)
        for _, measure in airbench_row(data, labels, args, device):
            if (row := measure()) is not None:
                rows.append(row)
                extra["airbench_images_per_s"] = round(row.images_per_s)
    return rows, extra


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=[32, 64, 128, 256])
    p.add_argument("--pixels", type=float, default=2_000 * 128 * 128, help="images per size: this many pixels")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", action="store_true", help="also time the CPU's gather and slice crop paths")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    rows: list[Timing] = []
    sizes = []
    for size in args.sizes:
        pair, extra = rows_for(size, args, device)
        rows += pair
        sizes.append(extra)
        print(
            f"{size}px: {extra['speedup']:.1f}x the DataLoader; loader {extra['loader_bytes_per_s'] / 1e9:.2f} GB/s, "
            f"copy {extra['copy_bytes_per_s'] / 1e9:.2f} GB/s ({extra['fraction_of_copy']:.0%})"
            + (f"; crop paths {extra['crop_paths_ms']} ms" if "crop_paths_ms" in extra else ""),
            flush=True,
        )
    env = environment(
        device, batch_size=args.batch_size, repeats=args.repeats, torch_threads=torch.get_num_threads(),
        transforms="RandomCrop(S, padding=S/8) + RandomHorizontalFlip + Normalize",
    )  # fmt: skip
    print(", ".join(f"{k}={v}" for k, v in env.items()))
    print_table(rows)
    save_json(args.out / "image_sizes.json", env, rows, None, sizes=sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
