"""An ImageFolder of JPEGs of different sizes with the standard training recipe, gpufeed against the DataLoader.

The synthetic folder (gpufeed.data.folder: 10 classes, JPEGs around 375x500, generated once into
gpufeed's cache directory) read by torchvision's ImageFolder with
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, batch 64:

1. torchvision's DataLoader with PIL in workers (the user's pipeline as it is);
2. gpufeed.accelerate with the pixel store (``store="pixels"``): each image decoded once, kept as
   it is (a ragged uint8 store), RandomResizedCrop + flip + normalise batched per epoch;
3. the JPEG store (``store="jpeg"``): the files' bytes kept, each batch decoded on CPU threads (or
   nvJPEG on a GPU), then the same batched ops.

Each store's build (the pixel store: read + one decode; the JPEG store: read) is timed against one
DataLoader pass. ``--compare N``: the decoded pixels of N files against PIL's (on a GPU: nvJPEG's
difference). ``--model resnet50``: a training epoch (bf16 autocast and channels_last on a GPU)
through each store against the model alone on one fixed batch, the same number of steps.

    python benchmarks/image_folder.py [--device cuda] [--workers 2] [--n 2000] [--batch 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
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


def recipe(size: int) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def decoded_vs_pil(ds, device, n: int) -> dict:
    """How the store's decoder differs from PIL (the user's loader) on the first ``n`` files, in levels."""
    import torch
    from torchvision.datasets.folder import pil_loader
    from torchvision.transforms.functional import pil_to_tensor

    from gpufeed.read.files import read_files
    from gpufeed.store.encoded import decode

    first = copy.copy(ds)  # the first n samples, read by torchvision's own loader
    first.samples, first.targets = ds.samples[:n], ds.targets[:n]
    encoded, _ = read_files(first, progress=False)
    images = decode(encoded, device)
    diffs = [
        (images.image(i).cpu().int() - pil_to_tensor(pil_loader(path)).int()).abs()
        for i, (path, _) in enumerate(first.samples)
    ]
    every = torch.cat([d.flatten() for d in diffs])
    return {
        "images": len(diffs),
        "max_levels": int(every.max()),
        "mean_levels": round(float(every.float().mean()), 4),
        "fraction_differing": round(float((every > 0).float().mean()), 4),
        "images_identical": sum(int(d.max()) == 0 for d in diffs),
    }


def train_rows(name: str, loaders: dict, device, batch: int, size: int) -> list:
    """One training epoch through each store against the model alone on one fixed batch, same steps."""
    import torch
    import torchvision

    from harness import Timing

    model = torchvision.models.get_model(name, weights=None, num_classes=10).to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = torch.autocast("cuda", torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step(x, y):
        with amp:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    fixed = next(iter(loaders["pixels"]))
    steps = len(loaders["pixels"])
    rows = []
    for label, epoch in [
        ("model alone, one fixed batch", lambda: (fixed for _ in range(steps))),
        *[(f"training through the {store} store", lambda lo=lo: lo) for store, lo in loaders.items()],
    ]:
        for _ in range(2):  # a warm-up epoch, then the timed one
            gf.device.sync(device)
            t, n = time.perf_counter(), 0
            for x, y in epoch():
                step(x.contiguous(memory_format=torch.channels_last) if cuda else x, y)
                n += len(y)
            gf.device.sync(device)
        seconds = time.perf_counter() - t
        rows.append(Timing(f"{name} {label}", n, 0.0, seconds, seconds, [seconds], f"batch {batch}, {size}px"))
        print(f"{rows[-1].name}: {seconds:.2f} s, {n / seconds:,.0f} img/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=lambda s: [int(v) for v in s.split(",")], default=[2])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size")
    p.add_argument("--n", type=int, default=2000, help="training images in the synthetic folder")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--compare", type=int, default=0, help="compare N decoded images with PIL's pixels")
    p.add_argument("--model", default=None, help="a torchvision model to train one epoch with (random init)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    BATCH = args.batch
    device = gf.device.resolve_device(args.device)
    t = time.perf_counter()
    ds = synthetic_folder("train", recipe(args.size), sizes=(args.n, max(10, args.n // 4)))
    print(f"synthetic folder: {len(ds):,} JPEGs at {ds.root} (ready in {time.perf_counter() - t:.1f} s)")

    rows = []
    for w in args.workers:
        dl = DataLoader(ds, BATCH, shuffle=True, pin_memory=device.type == "cuda", **loader_kwargs(w, persistent=True))
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        rows.append(time_epochs(f"torchvision DataLoader + PIL, num_workers={w}", lambda dl=dl: dl, device, 1, consume))
    builds, loaders = {}, {}
    for store in ("pixels", "jpeg"):
        t = time.perf_counter()
        loader = gf.accelerate(ds, BATCH, shuffle=True, device=device, cache=False, progress=False, store=store)
        builds[store] = {"build_s": time.perf_counter() - t, "mib": loader.plan.bytes / 2**20, "plan": str(loader.plan)}
        print(loader.plan)
        rows.append(
            time_epochs(
                f"gpufeed accelerate, {store} store ({device.type})",
                lambda loader=loader: loader,
                device,
                args.repeats,
                note=f"build {builds[store]['build_s']:.1f} s, {builds[store]['mib']:.0f} MiB",
            )
        )
        loaders[store] = loader
    extra: dict = {"builds": builds}
    if args.compare:
        extra["decoded_vs_pil"] = decoded_vs_pil(ds, device, args.compare)
        print(f"decoded pixels against PIL's ({device.type}): {extra['decoded_vs_pil']}")
    if args.model:
        rows += train_rows(args.model, loaders, device, BATCH, args.size)
    env = environment(device, images=len(ds), batch_size=BATCH, repeats=args.repeats, transforms=str(recipe(args.size)))
    print(", ".join(f"{k}={v}" for k, v in env.items() if k != "transforms"))
    print_table(rows, baseline=rows[0])
    pass_s = rows[0].epoch_s
    for store, b in builds.items():
        print(f"{store} store build: {b['build_s']:.1f} s = {b['build_s'] / pass_s:.2f} passes of the DataLoader")
    save_json(args.out / "image_folder.json", env, rows, rows[0], **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
