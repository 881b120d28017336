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
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf  # noqa: E402
from gpufeed import augment as A  # noqa: E402

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


def torch_rows(data, labels, args, device) -> list[Timing]:
    tv = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = PILDataset(data, labels.tolist(), tv)
    rows = []
    for w in args.workers:
        kw = dict(batch_size=args.batch_size, shuffle=True, num_workers=w, pin_memory=device.type == "cuda")
        if w > 0:
            # persistent workers: start-up is paid once (first epoch); forkserver where CUDA is live,
            # since fork-started workers crashed in a parent holding CUDA tensors.
            ctx = "forkserver" if torch.cuda.is_initialized() else None
            kw.update(persistent_workers=True, prefetch_factor=4, multiprocessing_context=ctx)
        loader = DataLoader(ds, **kw)
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        name = f"torchvision DataLoader, num_workers={w}" + (", persistent" if w else "")
        name += ", pinned" if device.type == "cuda" else ""
        repeats = args.torch_repeats or args.repeats
        rows.append(time_epochs(name, lambda loader=loader: loader, device, repeats, consume))
        del loader
    return rows


def gpufeed_rows(data, labels, args, device) -> list[Timing]:
    images = torch.from_numpy(data).permute(0, 3, 1, 2).contiguous()
    targets = torch.from_numpy(labels)
    rows = []
    configs = [
        ("gpufeed DeviceLoader, fp32", dict(dtype=torch.float32), "constant"),
        (
            "gpufeed DeviceLoader, fp16, channels_last, reflect pad",
            dict(dtype=torch.float16, channels_last=True),
            "reflect",
        ),
    ]
    for name, kw, mode in configs:
        aug = A.Compose(
            [A.RandomCrop(32, padding=4, padding_mode=mode), A.RandomHorizontalFlip(), A.Normalize(MEAN, STD)]
        )
        loader = gf.DeviceLoader(
            images, targets, batch_size=args.batch_size, shuffle=True, transform=aug, device=device, seed=0, **kw
        )
        rows.append(time_epochs(f"{name} ({device.type})", lambda loader=loader: loader, device, args.repeats))
    return rows


def airbench_row(data, labels, args, device) -> Timing | None:
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
        "airbench CifarLoader (fp16, channels_last, reflect pad)",
        lambda: loader,
        device,
        args.repeats,
        note="crop+flip; whole-epoch augmentation at iteration start",
    )


def main(argv: list[str] | None = None) -> int:
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
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    torch.set_num_threads(torch.get_num_threads())  # explicit: the machine's default, recorded below
    data, labels = synthetic_cifar(args.n)

    rows = torch_rows(data, labels, args, device)
    rows += gpufeed_rows(data, labels, args, device)
    if device.type == "cuda":
        row = airbench_row(data, labels, args, device)
        rows += [row] if row else []
    env = environment(
        device,
        images=args.n,
        batch_size=args.batch_size,
        repeats=args.repeats,
        torch_threads=torch.get_num_threads(),
        transforms="RandomCrop(32, padding=4) + RandomHorizontalFlip + Normalize",
    )
    print(", ".join(f"{k}={v}" for k, v in env.items()))
    print_table(rows, baseline=rows[0])
    save_json(args.out / "loader_throughput.json", env, rows, baseline=rows[0])
    print(f"wrote {args.out / 'loader_throughput.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
