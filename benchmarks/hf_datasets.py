"""A Hugging Face dataset of JPEGs, one recipe: ``with_transform`` + DataLoader against ``gf.accelerate``.

The images are the synthetic folder's (gpufeed.data.folder: 10 classes, JPEGs around 375x500), put in a
``datasets.Dataset`` with their bytes embedded and a ``ClassLabel`` column, written with ``save_to_disk`` and
opened with ``load_from_disk`` (memory-mapped: the shape of a dataset from the Hub). One training recipe,
RandomResizedCrop(size) + RandomHorizontalFlip + ToImage + ToDtype + Normalize, runs:

1. as the user's path: ``DataLoader(ds.with_transform(fn), batch, num_workers=W)``, ``fn`` applying the recipe to
   each decoded image (``datasets``' own decoding, ``.convert("RGB")``);
2. ``gf.accelerate(ds, transform=recipe, store="pixels")``: each image decoded once, kept as it is;
3. ``gf.accelerate(ds, transform=recipe, store="jpeg")``: the Arrow bytes themselves, decoded per batch.

Each store's build is timed once (a one-time cost, beside the DataLoader's pass), then epochs are timed side by
side. Memory: the anonymous memory (``RssAnon``, what a copy of the bytes would add; the Arrow file's pages are
file-backed and shared) each store adds, against the column's bytes.

    python benchmarks/hf_datasets.py [--kind photos|small] [--n 2000] [--size 224] [--batch 64] [--workers 2]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision.transforms.v2 as v2
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed.data.folder import synthetic_folder
from gpufeed.workers import loader_kwargs

from harness import environment, print_table, save_json, time_epochs

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipe(size: int, kind: str = "photos") -> v2.Compose:
    if kind == "small":  # CIFAR's recipe
        return v2.Compose(
            [
                v2.RandomCrop(size, padding=4),
                v2.RandomHorizontalFlip(),
                v2.ToImage(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )
    return v2.Compose(
        [
            v2.RandomResizedCrop(size),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def rss_anon() -> int:
    """This process's anonymous resident memory in bytes (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _small_pngs(n: int, size: int) -> list[tuple[bytes, int]]:
    """``n`` PNGs of ``size`` x ``size`` (the Hub's CIFAR-10 stores such PNGs): the synthetic folder's photos shrunk."""
    import io

    from PIL import Image

    folder = synthetic_folder("train", None, sizes=(n, max(10, n // 4)))
    out = []
    for path, label in folder.samples[:n]:
        buf = io.BytesIO()
        Image.open(path).convert("RGB").resize((size, size), Image.BILINEAR).save(buf, "PNG")
        out.append((buf.getvalue(), label))
    return out


def hf_dataset(n: int, where: Path, kind: str = "photos", size: int = 32):
    """``n`` images as a saved, memory-mapped ``datasets.Dataset``: the synthetic folder's training JPEGs
    (``photos``), or small PNGs of ``size`` pixels (``small``)."""
    import datasets

    folder = synthetic_folder("train", None, sizes=(n, max(10, n // 4)))
    if kind == "small":
        files = _small_pngs(n, size)
    else:
        files = [(Path(path).read_bytes(), label) for path, label in folder.samples[:n]]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=folder.classes)})

    def rows():
        for data, label in files:
            yield {"image": {"bytes": data, "path": None}, "label": label}

    datasets.Dataset.from_generator(rows, features=features, cache_dir=str(where / "gen")).save_to_disk(
        str(where / "saved")
    )
    return datasets.load_from_disk(str(where / "saved"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size (small: the images' size)")
    p.add_argument(
        "--kind",
        choices=("photos", "small"),
        default="photos",
        help="photos: JPEGs around 375x500, RandomResizedCrop; small: PNGs of --size px, RandomCrop(padding=4)",
    )
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    device = gf.device.resolve_device(args.device)
    aug = recipe(args.size, args.kind)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        ds = hf_dataset(args.n, Path(tmp), args.kind, args.size)
        column = sum(c.field("bytes").buffers()[2].size for c in ds.data.table.column("image").chunks)
        print(f"dataset: {len(ds):,} {args.kind}, {column / 2**20:.0f} MiB in {len(ds.cache_files)} Arrow file(s) "
              f"(ready in {time.perf_counter() - t:.1f} s)")  # fmt: skip

        def fn(batch: dict) -> dict:
            return {"pixel_values": [aug(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}

        dl = DataLoader(
            ds.with_transform(fn),
            args.batch,
            shuffle=True,
            pin_memory=device.type == "cuda",
            **loader_kwargs(args.workers, persistent=True),
        )
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        name = f"with_transform + DataLoader, num_workers={args.workers}"
        rows = [time_epochs(name, lambda: ((b["pixel_values"], b["label"]) for b in dl), device, args.repeats, consume)]
        builds = {}
        # a recipe that does not start with RandomResizedCrop keeps images of one size: the pixel store alone
        for store in ("pixels", "jpeg") if args.kind == "photos" else ("auto",):
            gc.collect()  # the previous store's memory freed before this one is measured
            before = rss_anon()
            t = time.perf_counter()
            loader = gf.accelerate(ds, args.batch, device=device, transform=aug, store=store, cache=False,
                                   progress=False)  # fmt: skip
            build = time.perf_counter() - t
            added = rss_anon() - before
            builds[store] = {"build_s": round(build, 2), "rss_anon_added_mib": round(added / 2**20, 1),
                             "plan": str(loader.plan)}  # fmt: skip
            print(loader.plan)
            note = f"build {build:.1f} s, +{added / 2**20:.0f} MiB anonymous"
            rows.append(time_epochs(f"gf.accelerate, {store} store", lambda lo=loader: lo, device, args.repeats,
                                    note=note))  # fmt: skip
            builds[store]["rss_anon_after_epochs_mib"] = round((rss_anon() - before) / 2**20, 1)
            del loader
        env = environment(device, images=len(ds), kind=args.kind, batch_size=args.batch, size=args.size,
                          workers=args.workers,
                          column_mib=round(column / 2**20, 1), transforms=str(aug))  # fmt: skip
        print(", ".join(f"{k}={v}" for k, v in env.items() if k != "transforms"))
        print_table(rows, baseline=rows[0])
        for store, b in builds.items():
            passes = b["build_s"] / rows[0].epoch_s
            print(
                f"{store} store: build {b['build_s']:.1f} s ({passes:.2f} DataLoader passes), anonymous memory "
                f"+{b['rss_anon_added_mib']:.0f} MiB at build, +{b['rss_anon_after_epochs_mib']:.0f} MiB after its "
                f"epochs (the column holds {column / 2**20:.0f} MiB)"
            )
        save_json(args.out / f"hf_datasets_{args.kind}_{args.size}.json", env, rows, rows[0], builds=builds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
