"""Loader throughput, side by side in one run: gpufeed DeviceLoader against torchvision's DataLoader.

CIFAR-10-shaped uint8 data, RandomCrop(32, padding=4) + RandomHorizontalFlip + Normalize; the
DataLoader rows run the equivalent per-sample torchvision transforms on PIL images, exactly as
``torchvision.datasets.CIFAR10`` serves them. On a GPU, airbench's ``CifarLoader`` joins the
table when ``airbench`` is importable (same data, batch size, crop and flip).

    python benchmarks/loader_throughput.py                 # CPU machine: 10,000 images
    python benchmarks/loader_throughput.py --n 50000 --device cuda --workers 0,8,16 --out DIR
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf  # noqa: E402
from gpufeed import augment as A  # noqa: E402
from gpufeed.workers import loader_kwargs  # noqa: E402

from harness import Timing, environment, print_table, save_json, time_epochs  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class PILDataset(Dataset):
    """What torchvision.datasets.CIFAR10 does per sample: HWC uint8 -> PIL -> transform."""

    def __init__(self, data: np.ndarray, targets: list[int], transform: T.Compose) -> None:
        self.data, self.targets, self.transform = data, targets, transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(Image.fromarray(self.data[i])), self.targets[i]


def synthetic_cifar(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n)


Plan = tuple[str, Callable[[], "Timing | None"]]  # a row's name, and what measures it


def torch_rows(data, labels, args, device) -> list[Plan]:
    tv = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = PILDataset(data, labels.tolist(), tv)

    def measure(w: int, name: str) -> Timing:
        kw = dict(batch_size=args.batch_size, shuffle=True, pin_memory=device.type == "cuda")
        # persistent workers: start-up is paid once (first epoch); forkserver where CUDA is live,
        # since fork-started workers crashed in a parent holding CUDA tensors.
        kw.update(loader_kwargs(w, persistent=True, prefetch_factor=4 if w else None))
        loader = DataLoader(ds, **kw)
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        return time_epochs(name, lambda: loader, device, args.torch_repeats or args.repeats, consume)

    plans = []
    for w in args.workers:
        name = f"torchvision DataLoader, num_workers={w}" + (", persistent" if w else "")
        name += ", pinned" if device.type == "cuda" else ""
        plans.append((name, lambda w=w, name=name: measure(w, name)))
    return plans


def gpufeed_rows(data, labels, args, device) -> list[Plan]:
    configs = [
        ("gpufeed DeviceLoader, fp32", dict(dtype=torch.float32), "constant"),
        (
            "gpufeed DeviceLoader, fp16, channels_last, reflect pad",
            dict(dtype=torch.float16, channels_last=True),
            "reflect",
        ),
    ]

    def measure(name: str, kw: dict, mode: str) -> Timing:
        images = torch.from_numpy(data).permute(0, 3, 1, 2).contiguous()
        aug = A.Compose(
            [A.RandomCrop(32, padding=4, padding_mode=mode), A.RandomHorizontalFlip(), A.Normalize(MEAN, STD)]
        )
        loader = gf.DeviceLoader(
            images, torch.from_numpy(labels), args.batch_size, True, transform=aug, device=device, seed=0, **kw
        )
        return time_epochs(name, lambda: loader, device, args.repeats)

    return [
        (f"{name} ({device.type})", lambda c=(f"{name} ({device.type})", kw, mode): measure(*c))
        for name, kw, mode in configs
    ]


def airbench_row(data, labels, args, device) -> list[Plan]:
    name = "airbench CifarLoader (fp16, channels_last, reflect pad)"

    def measure() -> Timing | None:
        try:
            from airbench.utils import CifarLoader
        except ImportError:
            print("airbench not importable: its row is skipped", file=sys.stderr)
            return None
        with tempfile.TemporaryDirectory() as d:
            torch.save(
                {"images": torch.from_numpy(data), "labels": torch.from_numpy(labels), "classes": list(range(10))},
                Path(d) / "train.pt",
            )
            loader = CifarLoader(
                d, train=True, batch_size=args.batch_size, aug=dict(flip=True, translate=4), gpu=device.index or 0
            )
        return time_epochs(
            name, lambda: loader, device, args.repeats, note="crop+flip; whole-epoch augmentation at iteration start"
        )

    return [(name, measure)] if device.type == "cuda" else []


def plans(args: argparse.Namespace, device: torch.device) -> list[Plan]:
    """Every row, DataLoader rows first (the table's baseline is the first), then gpufeed's and airbench's."""
    data, labels = synthetic_cifar(args.n)
    return [
        *torch_rows(data, labels, args, device),
        *gpufeed_rows(data, labels, args, device),
        *airbench_row(data, labels, args, device),
    ]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="images (CIFAR-10 shaped)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument(
        "--workers",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[0, 2],
        help="DataLoader num_workers values, comma separated",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-repeats", type=int, default=None, help="repeats for the DataLoader rows (slow)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for loader_throughput.json")
    return p.parse_args(argv)


def env_of(args: argparse.Namespace, device: torch.device) -> dict:
    return environment(
        device,
        images=args.n,
        batch_size=args.batch_size,
        repeats=args.repeats,
        torch_threads=torch.get_num_threads(),
        transforms="RandomCrop(32, padding=4) + RandomHorizontalFlip + Normalize",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = gf.device.resolve_device(args.device)
    rows = [row for _, measure in plans(args, device) if (row := measure()) is not None]
    env = env_of(args, device)
    print(", ".join(f"{k}={v}" for k, v in env.items()))
    print_table(rows, baseline=rows[0])
    save_json(args.out / "loader_throughput.json", env, rows, baseline=rows[0])
    print(f"wrote {args.out / 'loader_throughput.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
