"""gf.stream over MDS shards against the JPEG store, on the same photos and recipe, side by side in one run.

The synthetic folder (gpufeed.data.folder: real JPEGs of 300-450 x 300-600 px, about 80 KB, as Food101's or
ImageNet's photos) is converted once with gpufeed's converter (``gpufeed convert``, 16 MiB shards by default: a
dozen or more shards, so fetching ahead and the cold epoch's downloads are exercised), then read with
RandomResizedCrop(--size) + RandomHorizontalFlip + ToTensor + Normalize, batch --batch:

1. ``gf.accelerate(ImageFolder(...), store="jpeg")``: the files' bytes kept in memory, decoded per batch (the
   reference row);
2. ``gf.stream(local=mds)``: the shards read where they lie (local-only);
3. ``gf.stream(remote=mds, local=<a fresh cache>)``: its first epoch (cold: every shard copied from a
   local-directory remote, timed from the call to gf.stream), then a later epoch of the same loader (warm);
4. torch's DataLoader over ``streaming.StreamingDataset`` with the same torchvision recipe per sample (PIL decode)
   in ``--workers`` processes: what a user of the engine has today.

Rows 1-3 are timed in rounds (each row one epoch per round, after one warm-up epoch each; a fresh cache per round
for the cold epoch), so drift on a shared machine falls on every row alike; figures are medians over the rounds,
and the goals are judged on the median of each round's ratio to the JPEG store in that round.
Then the first batch of gf.stream on an index of ``--index-shards`` shards of the same JPEGs (hard links: no
bytes copied), local-only and from a local-directory remote, from the call to gf.stream to the first batch in
hand; ``--first-batch fresh`` (default) runs each in a new Python process, so the engine's import (1-4 s, inside the
call) is counted; the imports before the call (torch, torchvision, gpufeed) are reported beside it. Last, a profile
of one local epoch stage by stage (shard read, headers, decode, transform), each run alone, against the loop's
epoch (how much the reader thread overlaps). And the cost of checking each sample against the sha1 ``gpufeed
convert`` stored (NOTE [ Checking each sample against its sha1 ] in gpufeed/mds/shards.py): the local loader's
epochs with the check and without it, alternating in rounds on the same loader, and the shard reads alone both ways
(``--only sha1`` runs this part alone, after the conversion).

Goals (issue 22): local shards at least 90% of the JPEG store's img/s; the cold first epoch at least 75%; the first
batch within 5 s at 1,000 shards.

    python benchmarks/stream_throughput.py [--device cuda] [--n 3000] [--batch 256] [--repeats 3] [--quick]
    python benchmarks/stream_throughput.py --only sha1 [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed.data.folder import synthetic_folder
from gpufeed.device import sync
from gpufeed.workers import default_workers, loader_kwargs

from harness import Timing, environment, save_json, time_epochs

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
GOALS = {"local": 0.90, "cold": 0.75, "first_batch_s": 5.0}


def recipe(size: int) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def _count(batch: Any) -> int:
    return int((batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0])


def _epoch(loader: Iterable[Any], device: torch.device, t0: float | None = None) -> tuple[float, float, int]:
    """(seconds, seconds to the first batch, images) of one pass over ``loader``, from ``t0`` (default: now)."""
    sync(device)
    t0 = time.perf_counter() if t0 is None else t0
    first, images = 0.0, 0
    for batch in loader:
        if not images:
            sync(device)
            first = time.perf_counter() - t0
        images += _count(batch)
    sync(device)
    return time.perf_counter() - t0, first, images


# -- data ----------------------------------------------------------------------------------------------------------


def convert_folder(root: Path, dst: Path, shard_size: int) -> dict[str, Any]:
    """``gpufeed convert root dst --shard-size ...`` (the library call the command makes); its figures."""
    from gpufeed.mds.convert import convert

    t = time.perf_counter()
    result = convert(root, dst, shard_size=shard_size, progress=False)
    index = json.loads((dst / "index.json").read_text())
    return {
        "samples": result.samples,
        "shards": len(index["shards"]),
        "bytes": sum(s["raw_data"]["bytes"] for s in index["shards"]),
        "shard_size": shard_size,
        "seconds": round(time.perf_counter() - t, 2),
    }


def linked_index(src: Path, out: Path, shards: int) -> Path:
    """An MDS dataset of ``shards`` shards, shard ``k`` a hard link to ``src``'s shard ``k % len`` (a copy where
    links fail): a large index of real JPEGs at no disk cost (as tests/stream/mds.py ``replicate`` builds one)."""
    index = json.loads((src / "index.json").read_text())
    entries = []
    out.mkdir(parents=True)
    for k in range(shards):
        entry = json.loads(json.dumps(index["shards"][k % len(index["shards"])]))
        name = f"shard.{k:05d}.mds"
        try:
            os.link(src / entry["raw_data"]["basename"], out / name)
        except OSError:
            shutil.copyfile(src / entry["raw_data"]["basename"], out / name)
        entry["raw_data"]["basename"] = name
        entries.append(entry)
    (out / "index.json").write_text(json.dumps({"shards": entries, "version": 2}))
    shutil.copyfile(src / "gpufeed.json", out / "gpufeed.json")  # the class names, as a converted dataset has
    return out


# -- the engine's users' baseline ------------------------------------------------------------------------------------


class PILStream(IterableDataset):
    """A StreamingDataset's samples as a user decodes them today: PIL, then the torchvision recipe, per sample (in
    the DataLoader's workers; the engine splits its order between them)."""

    def __init__(self, engine_dataset: Any, transform: Any) -> None:
        self.engine_dataset, self.transform = engine_dataset, transform

    def __iter__(self) -> Any:
        from PIL import Image

        for sample in self.engine_dataset:
            image = Image.open(io.BytesIO(sample["image"])).convert("RGB")
            yield self.transform(image), sample["label"]


def engine_dataloader(mds: Path, tf: Any, batch: int, workers: int, device: torch.device) -> Timing:
    from streaming import StreamingDataset

    engine_dataset = StreamingDataset(local=str(mds), batch_size=batch, shuffle=True, shuffle_seed=9176)
    try:
        dl = DataLoader(
            PILStream(engine_dataset, tf),
            batch,
            pin_memory=device.type == "cuda",
            **loader_kwargs(workers, persistent=True),
        )
        consume = (lambda b: b[0].to(device, non_blocking=True)) if device.type == "cuda" else None
        name = f"DataLoader(StreamingDataset) + PIL, num_workers={workers}"
        return time_epochs(name, lambda: dl, device, 1, consume, note="the engine's order, per-sample recipe")
    finally:
        del engine_dataset


# -- the rounds ------------------------------------------------------------------------------------------------------


def side_by_side(
    folder: Any, mds: Path, work: Path, tf: Any, batch: int, device: torch.device, repeats: int
) -> tuple[list[Timing], dict[str, Any]]:
    """Rows 1-3 of the docstring, in rounds."""
    t = time.perf_counter()
    jpeg = gf.accelerate(folder, batch, shuffle=True, device=device, cache=False, progress=False, store="jpeg")
    build = time.perf_counter() - t
    print(jpeg.plan, flush=True)
    t = time.perf_counter()
    local = gf.stream(local=mds, transform=tf, batch_size=batch, device=device)
    opened = time.perf_counter() - t
    print(local.plan, flush=True)
    warm_up = {"jpeg": _epoch(jpeg, device), "local": _epoch(local, device)}
    runs: dict[str, list[tuple[float, float, int]]] = {"jpeg": [], "local": [], "cold": [], "warm": []}
    for r in range(repeats):
        runs["jpeg"].append(_epoch(jpeg, device))
        runs["local"].append(_epoch(local, device))
        cache = work / f"cache-{r}"  # a fresh cache: every shard is copied from the remote in this epoch
        t0 = time.perf_counter()
        remote = gf.stream(str(mds), cache, transform=tf, batch_size=batch, device=device)
        try:
            runs["cold"].append(_epoch(remote, device, t0))
            runs["warm"].append(_epoch(remote, device))
        finally:
            remote.shards.close()
            shutil.rmtree(cache, ignore_errors=True)
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s" for k, v in runs.items()), flush=True)
    local.shards.close()

    def row(name: str, key: str, first: tuple[float, float, int], note: str) -> Timing:
        epochs = [s for s, _, _ in runs[key]]
        return Timing(name, runs[key][0][2], first[1], first[0], statistics.median(epochs), epochs, note)

    cold_first = min(runs["cold"], key=lambda run: abs(run[0] - statistics.median(s for s, _, _ in runs["cold"])))
    rows = [
        row(f"gf.accelerate(ImageFolder), JPEG store ({device.type})", "jpeg", warm_up["jpeg"], f"build {build:.1f} s"),
        row(f"gf.stream(local=mds) ({device.type})", "local", warm_up["local"], f"opened in {opened:.2f} s"),
        row("gf.stream(remote=dir, fresh local): 1st epoch (cold)", "cold", cold_first, "from the call to gf.stream"),
        row("gf.stream(remote=dir, fresh local): later epoch (warm)", "warm", cold_first, "1st epoch: the cold one"),
    ]
    # each round's img/s against the JPEG store's in the same round: drift between rounds cancels
    per_round = {
        key: [(n / s) / (m / j) for (s, _, n), (j, _, m) in zip(runs[key], runs["jpeg"], strict=True)]
        for key in ("local", "cold", "warm")
    }
    extra = {"jpeg_build_s": round(build, 2), "stream_open_s": round(opened, 3)}
    return rows, extra | {"ratios_per_round": {k: [round(v, 3) for v in r] for k, r in per_round.items()}}


# -- the first batch at 1,000 shards ---------------------------------------------------------------------------------

_CHILD = """
import json, sys, time
t = time.perf_counter()
import stream_throughput as st
imports = time.perf_counter() - t
print(json.dumps({"imports_s": imports, **st.first_batch(**json.loads(sys.argv[1]))}))
"""


def first_batch(mds: str, local: str | None, size: int, batch: int, device: str) -> dict[str, Any]:
    """From the call to gf.stream to the first batch in hand (``local``: a fresh cache for ``mds`` as a remote)."""
    tf = recipe(size)
    dev = gf.device.resolve_device(device)
    t = time.perf_counter()
    if local is None:
        loader = gf.stream(local=mds, transform=tf, batch_size=batch, device=dev)
    else:
        loader = gf.stream(mds, local, transform=tf, batch_size=batch, device=dev)
    opened = time.perf_counter() - t
    try:
        it = iter(loader)
        x, _ = next(it)
        sync(dev)
        total = time.perf_counter() - t
        ok = tuple(x.shape) == (batch, 3, size, size)
        del it
    finally:
        loader.shards.close()
    return {"call_s": round(opened, 3), "first_batch_s": round(total, 3), "shape_ok": ok}


def first_batches(index: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"shards": args.index_shards, "process": args.first_batch}
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])  # the child imports us
    for kind, local in (("local", None), ("remote", str(work / "cache-index"))):
        kw = {"mds": str(index), "local": local, "size": args.size, "batch": args.batch, "device": args.device}
        if args.first_batch == "fresh":
            env = {**os.environ, "PYTHONPATH": path}
            r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kw)], capture_output=True, text=True, env=env)
            if r.returncode:
                raise RuntimeError(f"the first-batch child ({kind}) failed:\n{r.stderr[-3000:]}")
            out[kind] = json.loads(r.stdout.strip().splitlines()[-1])
        else:
            out[kind] = first_batch(**kw)
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
        print(f"  first batch, {args.index_shards} shards, {kind}: {out[kind]}", flush=True)
    return out


# -- where a local epoch's time goes ---------------------------------------------------------------------------------


def profile(mds: Path, tf: Any, batch: int, device: torch.device, loop_s: float) -> dict[str, Any]:
    """One local epoch's batches through each stage alone, in order (device synchronised after each): the
    serial sum against the loop's epoch (``loop_s``) is the work the reader thread hid behind the consumer."""
    from gpufeed.augment.keyed import KeyedDraws
    from gpufeed.loading.stream import encoded_batch
    from gpufeed.store.encoded import decode

    loader = gf.stream(local=mds, transform=tf, batch_size=batch, device=device)
    stages = {"shard read": 0.0, "headers + join": 0.0, "decode": 0.0, "transform": 0.0}
    try:
        plan = loader.epoch_plan(0)
        for k in range(plan.num_batches):
            ids = plan.batch(k)
            t = time.perf_counter()
            samples = loader.shards.read(ids)
            t1 = time.perf_counter()
            encoded = encoded_batch(samples, ids)
            t2 = time.perf_counter()
            x = decode(encoded, device)
            sync(device)
            t3 = time.perf_counter()
            ids_t = torch.from_numpy(ids.astype("int64")).to(device)
            loader.transform(x, generator=KeyedDraws(loader.seed, 0, ids_t))
            sync(device)
            t4 = time.perf_counter()
            for name, s in zip(stages, (t1 - t, t2 - t1, t3 - t2, t4 - t3), strict=True):
                stages[name] += s
        images = plan.num_batches * batch
    finally:
        loader.shards.close()
    serial = sum(stages.values())
    return {
        "images": images,
        "stages_s": {k: round(v, 3) for k, v in stages.items()},
        "ms_per_image": {k: round(1000 * v / images, 3) for k, v in stages.items()},
        "serial_s": round(serial, 3),
        "loop_s": round(loop_s, 3),
        "hidden_by_reader_s": round(serial - loop_s, 3),
        "reader_side_s": round(stages["shard read"] + stages["headers + join"] + stages["decode"], 3),
    }


# -- the sha1 check ---------------------------------------------------------------------------------------------------


def sha1_cost(mds: Path, tf: Any, batch: int, device: torch.device, repeats: int) -> dict[str, Any]:
    """img/s of the local loader with each sample checked against its sha1 and without (``shards.verify``), the
    two alternating in ``repeats`` rounds after a warm-up epoch of each; then one epoch's shard reads alone, both
    ways (the reader thread's share of the check), and sha1 alone over the same bytes."""
    import hashlib

    loader = gf.stream(local=mds, transform=tf, batch_size=batch, device=device)
    shards = loader.shards
    if not shards.verify:
        raise RuntimeError(f"{mds} is not checked (no sha1 column or no gpufeed.json): convert it with gpufeed")
    runs: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    try:
        for flag in (True, False):
            shards.verify = flag
            _epoch(loader, device)  # warm-up
        for _ in range(repeats):
            for flag in (True, False):
                shards.verify = flag
                runs[flag].append(_epoch(loader, device))
        plan = loader.epoch_plan(0)
        reads: dict[bool, float] = {}
        for flag in (True, False, True, False):  # twice each; the faster of the two
            shards.verify = flag
            t = time.perf_counter()
            for k in range(plan.num_batches):
                shards.read(plan.batch(k))
            took = time.perf_counter() - t
            reads[flag] = min(reads.get(flag, took), took)
        images = [bytes(b) for k in range(plan.num_batches) for b in shards.read(plan.batch(k)).images]
        t = time.perf_counter()
        for b in images:
            hashlib.sha1(b).hexdigest()
        hashing = time.perf_counter() - t
    finally:
        shards.verify = True
        shards.close()
    rate = {flag: [n / s for s, _, n in r] for flag, r in runs.items()}
    ratios = [a / b for a, b in zip(rate[True], rate[False], strict=True)]  # per round: drift cancels
    n = plan.num_batches * plan.batch_size
    megabytes = sum(len(b) for b in images) / 1e6
    return {
        "images": n,
        "mean_image_kb": round(1000 * megabytes / len(images), 1),
        "img_s_checked": round(statistics.median(rate[True]), 1),
        "img_s_unchecked": round(statistics.median(rate[False]), 1),
        "img_s_checked_rounds": [round(v, 1) for v in rate[True]],
        "img_s_unchecked_rounds": [round(v, 1) for v in rate[False]],
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_rounds": [round(v, 4) for v in ratios],
        "read_s_checked": round(reads[True], 3),
        "read_s_unchecked": round(reads[False], 3),
        "read_us_per_image_added": round(1e6 * (reads[True] - reads[False]) / n, 2),
        "sha1_alone_s": round(hashing, 3),
        "sha1_mb_s": round(megabytes / hashing, 1),
    }


def print_sha1(cost: dict[str, Any]) -> None:
    print(f"\nsha1 check, local loader ({cost['images']:,} images of {cost['mean_image_kb']} KB on average), "
          "alternating rounds:")  # fmt: skip
    print("| loader | img/s (median) | rounds |")
    print("|---|---|---|")
    for name, key in (("checked (default)", "checked"), ("unchecked (shards.verify = False)", "unchecked")):
        rounds = ", ".join(f"{v:,.0f}" for v in cost[f"img_s_{key}_rounds"])
        print(f"| {name} | {cost[f'img_s_{key}']:,.0f} | {rounds} |")
    print(f"- checked / unchecked, median of the rounds' ratios: {cost['ratio_median']:.3f} "
          f"({', '.join(f'{v:.3f}' for v in cost['ratio_rounds'])})")  # fmt: skip
    print(f"- one epoch's shard reads alone: {cost['read_s_checked']:.3f} s checked, {cost['read_s_unchecked']:.3f} s "
          f"unchecked ({cost['read_us_per_image_added']:.1f} us an image); sha1 alone over the same bytes "
          f"{cost['sha1_alone_s']:.3f} s ({cost['sha1_mb_s']:,.0f} MB/s)")  # fmt: skip


# -- a sample's output whichever rank serves it ----------------------------------------------------------------------


def same_by_layout(mds: Path, device: str, size: int, global_batch: int, batches: int) -> dict[str, Any]:
    """The first ``batches`` global batches of epoch 0 served by one rank, then by two simulated ranks (layouts
    ``Layout.of_rank(r, 2, 1)``, one after the other): the same samples, each with the same augmented pixels (draws
    keyed by sample id, on ``device``); every batch checked for its shape, device and finite values."""
    from gpufeed.mds.plan import Layout

    tf, dev = recipe(size), gf.device.resolve_device(device)
    served: dict[int, dict[int, torch.Tensor]] = {1: {}, 2: {}}
    shapes_ok, finite, on_device, labels_ok = True, True, True, True
    for ranks in (1, 2):
        for rank in range(ranks):
            loader = gf.stream(
                local=mds, transform=tf, global_batch_size=global_batch, device=dev,
                layout=Layout.of_rank(rank, ranks, 1), num_canonical_nodes=2,  # one order for both layouts
            )  # fmt: skip
            try:
                loader.set_epoch(0)
                plan = loader.epoch_plan(0)
                for k, (x, y) in zip(range(batches), loader, strict=False):
                    shapes_ok &= tuple(x.shape) == (global_batch // ranks, 3, size, size) and y.shape == x.shape[:1]
                    on_device &= x.device.type == dev.type and y.device.type == dev.type
                    finite &= bool(torch.isfinite(x).all())
                    labels_ok &= bool(((y >= 0) & (y < 10)).all())
                    for i, image in zip(plan.batch(k).tolist(), x, strict=True):
                        served[ranks][i] = image.cpu()
            finally:
                loader.shards.close()
    one, two = served[1], served[2]
    same_ids = sorted(one) == sorted(two)
    common = sorted(set(one) & set(two))
    identical = sum(torch.equal(one[i], two[i]) for i in common)
    diff = max((float((one[i] - two[i]).abs().max()) for i in common), default=0.0)
    ok = same_ids and identical == len(one) and shapes_ok and finite and on_device and labels_ok
    return {
        "device": str(dev),
        "global_batch": global_batch,
        "batches": batches,
        "samples": len(one),
        "same_ids": same_ids,
        "identical": identical,
        "max_abs_diff": diff,
        "shapes_ok": shapes_ok,
        "on_device": on_device,
        "finite": finite,
        "labels_ok": labels_ok,
        "ok": ok,
    }


def evaluation_and_syncs(mds: Path, device: str, size: int, batch: int) -> dict[str, Any]:
    """On ``device``: an evaluation recipe (Resize + CenterCrop per sample, ToTensor + Normalize batched, every
    sample, ``real_counts``) against torchvision's own pixels on the CPU, a recipe whose per-sample part leaves sizes
    ragged (Resize, then RandomResizedCrop batched), and, on CUDA, the host syncs in a few training batches
    (``torch.cuda.set_sync_debug_mode("warn")``: counted, each a stall of the consumer)."""
    import warnings

    from PIL import Image

    dev = gf.device.resolve_device(device)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    evaluation = T.Compose([T.Resize(size + size // 7), T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])
    out: dict[str, Any] = {}
    with gf.stream(local=mds, transform=evaluation, global_batch_size=batch, shuffle=False, drop_last=False,
                   device=dev) as loader:  # fmt: skip
        x, _ = next(iter(loader))
        files = loader.shards.read(loader.epoch_plan(0).batch(0)).images
        reference = torch.stack([evaluation(Image.open(io.BytesIO(f)).convert("RGB")) for f in files])
        diff = float((x.float().cpu() - reference).abs().max())
        real = sum(loader.real_counts)
        out["evaluation"] = {"shape": list(x.shape), "max_abs_diff_vs_torchvision": diff, "real": real}
    ragged = T.Compose([T.Resize(size + size // 4), T.RandomResizedCrop(size), T.ToTensor()])
    with gf.stream(local=mds, transform=ragged, global_batch_size=batch, device=dev) as loader:
        x, _ = next(iter(loader))
        out["ragged_per_sample"] = {"shape": list(x.shape), "finite": bool(torch.isfinite(x).all())}
    if dev.type == "cuda":
        with gf.stream(local=mds, transform=recipe(size), global_batch_size=batch, device=dev) as loader:
            it = iter(loader)
            next(it)  # warm-up: constants made on the device
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    batches = sum(1 for _ in zip(range(4), it, strict=False))
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
            out["syncs"] = {"batches": batches, "count": len(syncs), "first": syncs[:3]}
    out["ok"] = (
        out["evaluation"]["max_abs_diff_vs_torchvision"] < (1e-5 if dev.type == "cpu" else 1e-2)
        and out["ragged_per_sample"]["finite"]
    )
    return out


# -- the report ------------------------------------------------------------------------------------------------------


def goals(ratios: dict[str, list[float]], first: dict[str, Any]) -> dict[str, Any]:
    """The goals on the medians of the per-round ratios (each against the JPEG store in the same round)."""
    local, cold = statistics.median(ratios["local"]), statistics.median(ratios["cold"])
    worst = max(first[k]["first_batch_s"] for k in ("local", "remote"))
    return {
        "local_ratio": round(local, 3),
        "local_met": local >= GOALS["local"],
        "cold_ratio": round(cold, 3),
        "cold_met": cold >= GOALS["cold"],
        "first_batch_s": worst,
        "first_batch_met": worst <= GOALS["first_batch_s"],
    }


def print_markdown(rows: list[Timing], first: dict[str, Any], met: dict[str, Any]) -> None:
    ref = rows[0].images_per_s
    print("| loader | img/s | of the JPEG store | 1st epoch s | 1st batch s | note |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.name} | {r.images_per_s:,.0f} | {r.images_per_s / ref:.0%} | {r.first_epoch_s:.2f} | "
            f"{r.first_batch_s:.2f} | {r.note} |"
        )
    for kind in ("local", "remote"):
        f = first[kind]
        before = f" (after {f['imports_s']:.1f} s of imports)" if "imports_s" in f else ""
        print(
            f"| gf.stream, index of {first['shards']:,} shards, {kind}: call to 1st batch{before} | | | | "
            f"{f['first_batch_s']:.2f} | {first['process']} process; the call itself {f['call_s']:.2f} s |"
        )
    print()
    say = {True: "met", False: "MISSED"}
    print(f"- local shards: {met['local_ratio']:.0%} of the JPEG store's img/s, median of the rounds' ratios (goal >= "
          f"90%): {say[met['local_met']]}")  # fmt: skip
    print(f"- cold first epoch: {met['cold_ratio']:.0%} (goal >= 75%): {say[met['cold_met']]}")
    print(f"- first batch at {first['shards']:,} shards: {met['first_batch_s']:.2f} s (goal <= 5 s): "
          f"{say[met['first_batch_met']]}")  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--n", type=int, default=3000, help="JPEGs in the synthetic folder")
    p.add_argument("--scale", type=float, default=1.0, help="image sides x this (0.25: about 94x125, rehearsals)")
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="rounds after the warm-up epochs")
    p.add_argument("--workers", type=int, default=None, help="the engine DataLoader's workers (default: the cores)")
    p.add_argument("--shard-size", type=int, default=16 << 20, help="bytes per MDS shard (default 16 MiB)")
    p.add_argument("--index-shards", type=int, default=1000, help="shards of the first-batch index")
    p.add_argument("--first-batch", choices=["fresh", "here"], default="fresh", help="its process (imports counted)")
    p.add_argument("--no-profile", action="store_true", help="skip the stage-by-stage profile")
    p.add_argument("--quick", action="store_true", help="600 images, 2 rounds")
    p.add_argument("--only", choices=["sha1"], default=None, help="run one part alone (after the conversion)")
    p.add_argument("--work", type=Path, default=None, help="for the shards and caches (default: a temporary one)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 600, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = gf.device.resolve_device(args.device)
    args.device = str(device)
    workers = default_workers() if args.workers is None else args.workers
    load_before = os.getloadavg()
    t = time.perf_counter()
    tf = recipe(args.size)
    folder = synthetic_folder("train", tf, sizes=(args.n, max(10, args.n // 4)), scale=args.scale)
    print(f"synthetic folder: {len(folder):,} JPEGs at {folder.root} (ready in {time.perf_counter() - t:.1f} s)")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpufeed-stream-bench-"))
    try:
        mds, small = work / "mds", work / "mds-small"
        converted = convert_folder(Path(folder.root), mds, args.shard_size)
        print(f"converted: {converted}", flush=True)
        if args.only == "sha1":
            cost = sha1_cost(mds, tf, args.batch, device, args.repeats)
            env = environment(device, images=len(folder), batch_size=args.batch, size=args.size, repeats=args.repeats)
            print(", ".join(f"{k}={v}" for k, v in env.items()))
            print_sha1(cost)
            save_json(args.out / "stream_sha1.json", env, [], None, sha1=cost, converted=converted)
            return 0
        # the 1,000-shard index: the same JPEGs in shards of about 6 (about 500 KB at full size), linked round
        converted_small = convert_folder(Path(folder.root), small, max(1 << 16, int(512_000 * args.scale**2)))
        index = linked_index(small, work / "mds-index", args.index_shards)
        rows, extra = side_by_side(folder, mds, work, tf, args.batch, device, args.repeats)
        rows.append(engine_dataloader(mds, tf, args.batch, workers, device))
        first = first_batches(index, work, args)
        prof = None if args.no_profile else profile(mds, tf, args.batch, device, rows[1].epoch_s)
        cost = sha1_cost(mds, tf, args.batch, device, args.repeats)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    met = goals(extra["ratios_per_round"], first)
    env = environment(
        device, images=len(folder), batch_size=args.batch, size=args.size, repeats=args.repeats,
        engine_workers=workers, load_before=[round(v, 2) for v in load_before],
        load_after=[round(v, 2) for v in os.getloadavg()], transforms=str(tf),
    )  # fmt: skip
    print(", ".join(f"{k}={v}" for k, v in env.items() if k != "transforms"))
    print_markdown(rows, first, met)
    print("- each round's img/s against the JPEG store's in that round: " + "; ".join(
        f"{k} {', '.join(f'{v:.0%}' for v in r)}" for k, r in extra["ratios_per_round"].items()))  # fmt: skip
    if prof is not None:
        print(f"\nprofile of one local epoch ({prof['images']} images), each stage alone:")
        for k, v in prof["stages_s"].items():
            print(f"  {k:<15} {v:7.2f} s  {prof['ms_per_image'][k]:6.2f} ms/image")
        print(f"  serial sum {prof['serial_s']:.2f} s, the loop's epoch {prof['loop_s']:.2f} s: the reader thread hid "
              f"{prof['hidden_by_reader_s']:.2f} s of its {prof['reader_side_s']:.2f} s")  # fmt: skip
    print_sha1(cost)
    save_json(
        args.out / "stream_throughput.json", env, rows, rows[0], goals=met, first_batch=first, profile=prof,
        converted=converted, converted_index=converted_small, sha1=cost, **extra,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
