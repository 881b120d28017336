"""gpufeed against its peers on one machine, side by side: the per-sample DataLoader and Kornia (issue 31).

uint8 images resident in memory at 32, 64, 128 and 224 px, batch 256, three recipes: RandomCrop(padding=size/8) +
flip + normalise, RandomResizedCrop + flip + normalise, ColorJitter(0.4, 0.4, 0.4, 0.1) + crop + flip + normalise.
Each recipe three ways:

- ``DataLoader(num_workers=W)`` over the images as PIL, torchvision's transforms per sample (what people write);
- ``gf.DeviceLoader`` with the same recipe from ``gpufeed.augment``, batched;
- Kornia's ``AugmentationSequential`` on float batches (``x.float() / 255``) gathered from the same uint8 tensor in
  a shuffled order (the batched library users would pick instead; optional: ``pip install kornia``).

Then single colour ops and RandomResizedCrop at 224 px, per core: gpufeed batched on the process's threads against
torchvision's per-sample PIL kernels on one thread. Figures are epochs of the same images, timed by
benchmarks/harness.py (median of ``--repeats`` after a warm-up epoch).

    python benchmarks/peers.py [--sizes 32,64,128,224] [--workers 2] [--repeats 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed import augment as A
from gpufeed.augment import fusion
from gpufeed.loading.hostmem import keep_freed_buffers
from gpufeed.workers import loader_kwargs

from harness import Timing, environment, print_table, save_json, time_epochs

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
RECIPES = ("crop+flip+normalise", "RandomResizedCrop+flip+normalise", "ColorJitter+crop+flip+normalise")
# images per size: at least two batches of 256, about the same bytes at every size
IMAGES = {32: 8192, 64: 4096, 128: 1024, 224: 512}


def torchvision_recipe(name: str, size: int) -> T.Compose:
    crop = [T.RandomCrop(size, padding=size // 8), T.RandomHorizontalFlip()]
    tail = [T.ToTensor(), T.Normalize(MEAN, STD)]
    ops = {
        RECIPES[0]: crop,
        RECIPES[1]: [T.RandomResizedCrop(size), T.RandomHorizontalFlip()],
        RECIPES[2]: [T.ColorJitter(0.4, 0.4, 0.4, 0.1), *crop],
    }[name]
    return T.Compose([*ops, *tail])


def gpufeed_recipe(name: str, size: int) -> A.Compose:
    crop = [A.RandomCrop(size, padding=size // 8), A.RandomHorizontalFlip()]
    ops = {
        RECIPES[0]: crop,
        RECIPES[1]: [A.RandomResizedCrop(size), A.RandomHorizontalFlip()],
        RECIPES[2]: [A.ColorJitter(0.4, 0.4, 0.4, 0.1), *crop],
    }[name]
    return A.Compose([*ops, A.Normalize(MEAN, STD)])


def kornia_recipe(name: str, size: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    try:
        import kornia.augmentation as K
    except ImportError:
        return None
    crop = [K.RandomCrop((size, size), padding=size // 8), K.RandomHorizontalFlip()]
    ops = {
        RECIPES[0]: crop,
        RECIPES[1]: [K.RandomResizedCrop((size, size)), K.RandomHorizontalFlip()],
        RECIPES[2]: [K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0), *crop],
    }[name]
    return K.AugmentationSequential(*ops, K.Normalize(torch.tensor(MEAN), torch.tensor(STD)))


class PilImages(Dataset):
    """The uint8 images as PIL images, through a torchvision transform per sample (as an image dataset does)."""

    def __init__(self, images: np.ndarray, transform: T.Compose) -> None:
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(Image.fromarray(self.images[i])), 0


def kornia_epochs(images: torch.Tensor, batch: int, aug: Callable) -> Callable[[], Iterator[torch.Tensor]]:
    def epoch() -> Iterator[torch.Tensor]:
        order = torch.randperm(len(images))
        for s in range(0, len(images), batch):
            yield aug(images.index_select(0, order[s : s + batch]).float().div_(255))

    return epoch


def _images(size: int, args: argparse.Namespace) -> tuple[np.ndarray, torch.Tensor]:
    """The images at ``size``, seeded by it: HWC for PIL, NCHW for the batched peers. Noise: no op has an easy
    shortcut."""
    n = args.n or IMAGES.get(size, 512)
    hwc = np.random.default_rng(size).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    return hwc, torch.from_numpy(hwc).permute(0, 3, 1, 2).contiguous()


def recipe_rows(size: int, args: argparse.Namespace) -> tuple[list[Timing], list[dict]]:
    hwc, images = _images(size, args)
    n = len(images)
    labels = torch.zeros(n, dtype=torch.long)
    rows: list[Timing] = []
    ratios = []
    for name in RECIPES:
        ds = PilImages(hwc, torchvision_recipe(name, size))
        dl = DataLoader(ds, args.batch, shuffle=True, **loader_kwargs(args.workers, persistent=True))
        base = time_epochs(f"{size}px {name}: DataLoader(num_workers={args.workers})", lambda dl=dl: dl, _CPU, 1)
        loader = gf.DeviceLoader(images, labels, args.batch, transform=gpufeed_recipe(name, size), device="cpu")
        ours = time_epochs(f"{size}px {name}: gpufeed DeviceLoader", lambda ld=loader: ld, _CPU, args.repeats)
        rows += [base, ours]
        row = {"size": size, "recipe": name, "images": n, "vs_dataloader": round(base.epoch_s / ours.epoch_s, 2)}
        row["gpufeed_epoch_s"] = ours.epoch_s  # the ratio to Kornia is taken from it, after every size
        ratios.append(row)
        print(f"  {row}", flush=True)
    return rows, ratios


def kornia_rows(size: int, args: argparse.Namespace, ratios: list[dict]) -> list[Timing]:
    """Kornia's epochs at ``size``, after every size's gpufeed and DataLoader rows: its float batches left glibc's
    heap in a state that made the next gpufeed rows page-fault (224 px crop + flip + normalise: 0.23-0.35 s an
    epoch after Kornia's 128 px rows, 0.09 s without them), so it runs last and cannot touch the others'."""
    _, images = _images(size, args)  # the same images
    rows = []
    for row in (r for r in ratios if r["size"] == size):
        aug = kornia_recipe(row["recipe"], size)
        if aug is None:
            return rows
        peer = time_epochs(f"{size}px {row['recipe']}: Kornia", kornia_epochs(images, args.batch, aug), _CPU,
                           args.repeats)  # fmt: skip
        rows.append(peer)
        row["vs_kornia"] = round(peer.epoch_s / row["gpufeed_epoch_s"], 2)
        print(f"  {row}", flush=True)
    return rows


_CPU = torch.device("cpu")


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def single_ops(size: int, batch: int, repeats: int) -> list[dict]:
    """Each op on a batch of ``batch`` images of 256 px (224 px for the colour ops): gpufeed's batched op on this
    process's threads, torchvision's PIL kernel per image on one thread, and the ratio per core."""
    rng = np.random.default_rng(0)
    threads = torch.get_num_threads()
    # malloc as a DeviceLoader on the CPU leaves it: freed batches reused, not page-faulted in again (a batch of
    # 256 at 224 px is 38.5 MB, over glibc's default mmap threshold; gpufeed.loading.hostmem)
    keep_freed_buffers(4 * batch * 3 * 256 * 256)
    rows = []
    cases: list[tuple[str, int, A.BatchTransform, Callable[[Image.Image, float], Image.Image]]] = [
        ("brightness", size, A.ColorJitter(brightness=0.4), lambda im, f: TF.adjust_brightness(im, 1 + f * 0.4)),
        ("contrast", size, A.ColorJitter(contrast=0.4), lambda im, f: TF.adjust_contrast(im, 1 + f * 0.4)),
        ("saturation", size, A.ColorJitter(saturation=0.4), lambda im, f: TF.adjust_saturation(im, 1 + f * 0.4)),
        ("hue", size, A.ColorJitter(hue=0.1), lambda im, f: TF.adjust_hue(im, f * 0.1)),
    ]
    for kernel in ("float", "pil", "torch"):
        rrc = A.RandomResizedCrop(size, kernel=kernel)
        cases.append((f"RandomResizedCrop({size}), kernel={kernel!r}", 256, rrc, _pil_rrc(size)))
    for name, side, op, pil in cases:
        hwc = rng.integers(0, 256, (batch, side, side, 3), dtype=np.uint8)
        x = torch.from_numpy(hwc).permute(0, 3, 1, 2).contiguous()
        g = torch.Generator().manual_seed(0)
        ours = _best(lambda op=op, x=x, g=g: op(x, generator=g), repeats)
        with fusion.eager():  # the same op's eager code (without a compiler, or GPUFEED_COMPILE=0)
            unfused = _best(lambda op=op, x=x, g=g: op(x, generator=g), repeats)
        pils = [Image.fromarray(im) for im in hwc]
        signs = rng.uniform(-1, 1, batch)
        theirs = _best(
            lambda pils=pils, pil=pil, signs=signs: [pil(im, f) for im, f in zip(pils, signs, strict=True)], repeats
        )
        per_core = (theirs / 1) / (ours * threads)
        rows.append({"op": name, "gpufeed_ms": round(ours * 1e3, 1), "eager_ms": round(unfused * 1e3, 1),
                     "pil_ms": round(theirs * 1e3, 1),
                     "threads": threads, "vs_pil_per_core": round(per_core, 2)})  # fmt: skip
        print(f"  {rows[-1]}", flush=True)
    return rows


def _pil_rrc(size: int) -> Callable[[Image.Image, float], Image.Image]:
    t = T.RandomResizedCrop(size)
    return lambda im, f: t(im)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="32,64,128,224")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--n", type=int, default=None, help="images per size (default: IMAGES)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-single", action="store_true", help="skip the single ops at 224 px")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    rows: list[Timing] = []
    ratios: list[dict] = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        r, q = recipe_rows(size, args)
        rows += r
        ratios += q
    for size in sizes:
        rows += kornia_rows(size, args, ratios)
    single = [] if args.no_single else single_ops(224, args.batch, args.repeats)
    try:
        import kornia

        kornia_version = kornia.__version__
    except ImportError:
        kornia_version = None
    env = environment(_CPU, batch_size=args.batch, workers=args.workers, torch_threads=torch.get_num_threads())
    env["kornia"] = kornia_version
    print(", ".join(f"{k}={v}" for k, v in env.items()))
    print_table(rows)
    save_json(args.out / "peers.json", env, rows, None, ratios=ratios, single_ops=single)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
