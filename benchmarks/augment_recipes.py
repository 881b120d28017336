"""Modern augmentation recipes on CIFAR-sized data: gpufeed against the DataLoader with the per-sample pipeline.

The synthetic CIFAR-10 (50,000 32x32 images; ``--n`` takes the first N), each recipe on PIL images as
people write it, then ToTensor + Normalize, batch 256: the CIFAR recipe (RandomCrop(32, padding=4) +
RandomHorizontalFlip) with TrivialAugmentWide, RandAugment, AutoAugment(cifar10) or AugMix after it, and a
SimCLR view (RandomResizedCrop + flip + RandomApply(ColorJitter, 0.8) + RandomGrayscale(0.2) +
GaussianBlur(3)), and timm's RandAugment ``rand-m9-mstd0.5-inc1`` (when timm is installed). Side by side
in one run: torchvision's DataLoader (PIL per sample in workers) and gpufeed.accelerate (each op once per
batch on the samples that drew it).

    python benchmarks/augment_recipes.py [--device cuda] [--workers 2] [--n 10000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
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
CIFAR = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
RECIPES = {
    "TrivialAugmentWide": lambda: [*CIFAR, T.TrivialAugmentWide()],
    "RandAugment": lambda: [*CIFAR, T.RandAugment()],
    "AutoAugment(cifar10)": lambda: [*CIFAR, T.AutoAugment(T.AutoAugmentPolicy.CIFAR10)],
    "AugMix": lambda: [*CIFAR, T.AugMix()],
    "SimCLR view": lambda: [
        T.RandomResizedCrop(32),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.GaussianBlur(3, (0.1, 2.0)),
    ],
}


def _timm_rand_augment() -> list:
    """timm's create_transform(32, auto_augment="rand-m9-mstd0.5-inc1") RandAugment after the CIFAR ops. Its
    posterize can ask Pillow 13 for 0 bits, which raises; the per-sample side gets Pillow 12's answer (black)."""
    from PIL import Image, ImageOps
    from timm.data.auto_augment import rand_augment_transform

    if not getattr(ImageOps.posterize, "zero_bits_black", False):
        original = ImageOps.posterize

        def posterize(img: Image.Image, bits: int) -> Image.Image:
            return Image.new(img.mode, img.size, 0) if bits <= 0 else original(img, bits)

        posterize.zero_bits_black = True  # type: ignore[attr-defined]
        ImageOps.posterize = posterize
    hparams = {"translate_const": int(32 * 0.45), "img_mean": tuple(round(255 * m) for m in MEAN)}
    return [*CIFAR, rand_augment_transform("rand-m9-mstd0.5-inc1", {**hparams, "interpolation": Image.BILINEAR})]


try:
    import timm  # noqa: F401

    RECIPES["timm RandAugment"] = _timm_rand_augment
except ImportError:  # an optional row: the GPU machine has no timm
    pass


def recipe(ops: list) -> T.Compose:
    return T.Compose([*ops, T.ToTensor(), T.Normalize(MEAN, STD)])


def augment_cost(device: torch.device, size: int, batch: int, model_name: str, steps: int = 10) -> dict:
    """Each recipe's batched augmentation per batch (uint8 images of ``size`` resident on ``device``) against
    one training step of ``model_name`` (bf16 autocast and channels_last on a GPU) on a fixed batch."""
    import torchvision

    from gpufeed.device import sync
    from gpufeed.pipeline.translate import build_batched

    g = torch.Generator(device=device).manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, size + size // 7, size + size // 7), dtype=torch.uint8, device=device)
    recipes = {
        "TrivialAugmentWide": [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.TrivialAugmentWide()],
        "RandAugment": [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.RandAugment()],
        "AutoAugment(imagenet)": [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.AutoAugment()],
        "SimCLR view": RECIPES["SimCLR view"]()[1:],
    }
    rows: dict = {}

    def timed(fn) -> float:
        fn()
        sync(device)
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        return (time.perf_counter() - t) / steps * 1000

    for name, ops in recipes.items():
        if name == "SimCLR view":
            ops = [T.RandomResizedCrop(size), *ops]
        batched = build_batched([*ops, T.ConvertImageDtype(torch.float32), T.Normalize(MEAN, STD)], torch.uint8,
                                tuple(images.shape[2:]))  # fmt: skip
        rows[name] = {"ms_per_batch": round(timed(lambda b=batched: b(images, generator=g)), 3)}
    model = torchvision.models.get_model(model_name, weights=None, num_classes=1000).to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=device)
    x = x.contiguous(memory_format=torch.channels_last) if cuda else x
    y = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step_ms = timed(step)
    for r in rows.values():
        r["fraction_of_step"] = round(r["ms_per_batch"] / step_ms, 4)
    return {"model": model_name, "size": size, "batch": batch, "step_ms": round(step_ms, 3), "recipes": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--cost", default=None, help="SIZE,BATCH,MODEL: each recipe's cost per batch against a step")
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    rows = []
    for name, make in RECIPES.items():
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
    extra: dict = {}
    if args.cost:
        size, batch, model = args.cost.split(",")
        extra["cost"] = augment_cost(device, int(size), int(batch), model)
        print(f"augmentation per batch against a {model} step: {extra['cost']}")
    save_json(args.out / "augment_recipes.json", env, rows, rows[0], **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
