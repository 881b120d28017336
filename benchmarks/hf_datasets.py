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

``--compare N`` (photos) also checks the JPEG store itself (``arrow_checks``): the first N images of the store
as ``gf.accelerate`` builds it (a view of the Arrow buffer, not yet placed: on CUDA nvJPEG reads the
memory-mapped, pageable Arrow memory itself) decoded on the device against ``datasets``' own decoding (PIL), in
levels, and against the same files decoded from the folder and from the store the loader serves (placed: the
same view, not pinned on CUDA); and whether each of those stores' bytes lies inside the Arrow column's buffer (no copy).

    python benchmarks/hf_datasets.py [--kind photos|small] [--n 2000] [--size 224] [--batch 64] [--workers 2]
                                     [--compare 100]
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

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


def _arrow_span(ds: Any, column: str = "image") -> tuple[int, int]:
    """The addresses the Arrow column's encoded bytes span: ``[lo, hi)`` over its chunks' data buffers."""
    bufs = [c.field("bytes").buffers()[2] for c in ds.data.table.column(column).chunks]
    return min(b.address for b in bufs), max(b.address + b.size for b in bufs)


def arrow_checks(ds: Any, device: torch.device, n: int, served: Any, plan: str, n_folder: int) -> dict:
    """The JPEG store against ``datasets``' own decoding, and where its bytes lie (see the module's docstring).

    ``served``: the store the ``jpeg`` loader holds (``loader.store``, placed on the device's tier); ``plan``: its
    plan, as printed; ``n_folder``: the dataset's size, which names the synthetic folder its photos came from."""
    from torchvision.transforms.functional import pil_to_tensor

    from gpufeed.device import usable_cores
    from gpufeed.read.files import read_files
    from gpufeed.read.hf import arrow_images
    from gpufeed.store import decoders
    from gpufeed.store.encoded import decode

    built, _, bad = arrow_images(ds).image_files().read(usable_cores(), progress=False)
    first = torch.arange(min(n, len(built)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        images = decode(built.select(first), device)  # on CUDA: nvJPEG over the Arrow mapping, not pinned
        again = decode(served.select(first), device)  # what the loader decodes from (the same view, unpinned)
        folder = synthetic_folder("train", None, sizes=(n_folder, max(10, n_folder // 4)))
        files = copy.copy(folder)  # the same photos, read from their files as an ImageFolder's are
        files.samples, files.targets = folder.samples[: len(first)], folder.targets[: len(first)]
        from_files = decode(read_files(files, progress=False)[0], device)
    diffs = [
        (images.image(i).cpu().int() - pil_to_tensor(ds[i]["image"].convert("RGB")).int()).abs()
        for i in range(len(first))
    ]
    every = torch.cat([d.flatten() for d in diffs])
    same = lambda other: sum(torch.equal(images.image(i), other.image(i)) for i in range(len(first)))  # noqa: E731
    lo, hi = _arrow_span(ds)

    def inside(t: torch.Tensor) -> bool:
        return lo <= t.data_ptr() and t.data_ptr() + t.numel() <= hi

    pinned = served.data.is_pinned() if torch.cuda.is_available() else False
    return {
        "decoded_vs_pil": {
            "images": len(diffs),
            "decoder": f"{decoders.backend()} on {images.data.device}",
            "max_levels": int(every.max()),
            "mean_levels": round(float(every.float().mean()), 4),
            "fraction_differing": round(float((every > 0).float().mean()), 4),
            "images_identical": sum(int(d.max()) == 0 for d in diffs),
            "same_as_folder_files": same(from_files),  # the same bytes read from the folder's files
            "same_as_served": same(again),
            "warnings": sorted({str(w.message)[:300] for w in caught}),
        },
        "zero_copy": {
            "arrow_files": len(ds.cache_files),
            "column_mib": round((hi - lo) / 2**20, 1),
            "bad_images": len(bad),
            "built_on_arrow": inside(built.data),  # the store as gf.accelerate reads it: a view of the mapping
            "served_on_arrow": inside(served.data),  # what the loader decodes from
            "served_pinned": pinned,
            "served_mib": round(served.data.numel() / 2**20, 1),
            "plan_says_not_copied": "not copied" in plan,
        },
    }


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
    p.add_argument(
        "--compare", type=int, default=0, help="photos: check the first N images of the JPEG store (arrow_checks)"
    )
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
        builds: dict[str, Any] = {}
        served: dict[str, Any] = {}
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
            if store == "jpeg" and args.compare:
                served = {"served": loader.store, "plan": str(loader.plan)}
            del loader
        extra = {"builds": builds}
        if served:
            extra |= arrow_checks(ds, device, args.compare, served["served"], served["plan"], args.n)
            print(f"the JPEG store's pixels against datasets' decoding ({device.type}): {extra['decoded_vs_pil']}")
            print(f"where its bytes lie: {extra['zero_copy']}")
            del served
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
        save_json(args.out / f"hf_datasets_{args.kind}_{args.size}.json", env, rows, rows[0], **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
