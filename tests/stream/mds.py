"""Small MDS datasets for the stream tests, written with the engine's MDSWriter, and the child processes they run.

Every sample ``i`` has columns ``image`` (bytes known from ``i``: :func:`payload`), ``label`` (``i % 10``), ``key``,
``sha1`` (of the image) and ``idx`` (``i``), so a test can check any id it is served against what was written.

:func:`parse_shards` reads a converted dataset back from its bytes alone (no engine).

Run as a script, it is a child process of a test: ``torchrun ... mds.py rank ...`` (one rank: the engine's order
against gpufeed's plan, then its planned ids read under a cache limit) or ``python mds.py hold ...`` (a reader that
keeps its shared memory until killed).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

CLASSES = [f"class{c}" for c in range(10)]
MDS_SCRIPT = Path(__file__)  # what a test runs as a child process (see the module's docstring)


def payload(i: int) -> bytes:
    """Sample ``i``'s image bytes: a JPEG marker, then bytes that differ per sample, 200-1,200 bytes long."""
    body = hashlib.sha256(str(i).encode()).digest()
    return b"\xff\xd8\xff" + (body * 38)[: 197 + (i * 379) % 1000]


def sample(i: int) -> dict:
    image = payload(i)
    label: int | str = i % 10
    return {"image": image, "label": label, "key": f"s{i:05d}", "sha1": hashlib.sha1(image).hexdigest(), "idx": i}


def write_mds(
    out: Path,
    n: int,
    *,
    size_limit: int = 2048,
    image_encoding: str = "bytes",
    label_encoding: str = "int",
    extra: dict[str, str] | None = None,
    meta: bool = True,
) -> Path:
    """``n`` samples as MDS shards of at most ``size_limit`` bytes in ``out`` (+ ``gpufeed.json``, as the converter
    writes it, when ``meta``)."""
    from streaming import MDSWriter

    columns = {"image": image_encoding, "label": label_encoding, "key": "str", "sha1": "str", "idx": "int"}
    columns.update(extra or {})
    with MDSWriter(out=str(out), columns=columns, size_limit=size_limit, progress_bar=False) as w:
        for i in range(n):
            s = sample(i)
            for name, encoding in (extra or {}).items():
                s[name] = np.zeros(2, np.uint8) if encoding == "ndarray" else i
            w.write(s)
    if meta:
        (out / "gpufeed.json").write_text(
            json.dumps(
                {"format": "gpufeed.mds/1", "classes": CLASSES, "source": "test", "kind": "folder", "samples": n}
            )
        )
    return out


def parse_shards(dst: Path) -> list[dict]:
    """The samples of an MDS dataset from its bytes alone: index.json, then each shard's header, offsets and
    records (per record: a uint32 size per variable-size column, then the columns, in column order)."""
    decode = {
        "bytes": bytes,
        "str": lambda b: b.decode("utf-8"),
        "int": lambda b: int.from_bytes(b, "little", signed=True),
    }
    samples = []
    for shard in json.loads((dst / "index.json").read_text())["shards"]:
        data = (dst / shard["raw_data"]["basename"]).read_bytes()
        n = int(np.frombuffer(data, np.uint32, 1)[0])
        offsets = np.frombuffer(data, np.uint32, n + 1, 4)
        names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
        assert n == shard["samples"]
        for i in range(n):
            record = data[offsets[i] : offsets[i + 1]]
            variable = [j for j, s in enumerate(sizes) if s is None]
            lengths = dict(zip(variable, np.frombuffer(record, np.uint32, len(variable)).tolist(), strict=True))
            at, sample = 4 * len(variable), {}
            for j, (name, encoding) in enumerate(zip(names, encodings, strict=True)):
                size = sizes[j] if sizes[j] is not None else lengths[j]
                sample[name] = decode[encoding](record[at : at + size])
                at += size
            samples.append(sample)
    return samples


def photo(i: int) -> bytes:
    """Sample ``i`` of :func:`write_photos`: a real image file of its own size (16-55 px sides), every seventh a
    PNG, the rest JPEGs."""
    import io

    from PIL import Image

    rng = np.random.default_rng(i)
    h, w = 16 + (i * 7) % 40, 16 + (i * 13) % 40
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG" if i % 7 == 3 else "JPEG", quality=90)
    return out.getvalue()


def write_photos(
    out: Path,
    n: int,
    *,
    size_limit: int = 8192,
    bad: tuple[int, ...] = (),
    digests: bool = False,
    labels_covered: bool = True,
) -> Path:
    """``n`` real images as MDS (columns image: bytes, label: int = the sample's id, so a batch's labels are its
    ids); the samples in ``bad`` hold bytes that are no image. ``digests``: as ``gpufeed convert`` writes them, with
    columns ``key`` (``p00012.jpg``), ``sha1`` and ``sample_sha1`` and its ``gpufeed.json``; without
    ``labels_covered``, as an earlier gpufeed convert wrote them (``sha1`` alone, format ``gpufeed.mds/1``)."""
    from streaming import MDSWriter

    from gpufeed.mds.digests import sample_digests
    from gpufeed.mds.parts import FORMAT

    columns = {"image": "bytes", "label": "int"}
    columns |= {"key": "str", "sha1": "str", "sample_sha1": "str"} if digests else {}
    if not labels_covered:  # as gpufeed convert wrote before labels were covered (gpufeed.mds/1)
        del columns["sample_sha1"]
    with MDSWriter(out=str(out), columns=columns, size_limit=size_limit, progress_bar=False) as w:
        for i in range(n):
            image = b"\xff\xd8\xff not a JPEG" if i in bad else photo(i)
            sha1, sample_sha1 = sample_digests(image, i)
            extra = {"key": f"p{i:05d}.jpg", "sha1": sha1, "sample_sha1": sample_sha1} if digests else {}
            extra = {k: v for k, v in extra.items() if k in columns}
            w.write({"image": image, "label": i, **extra})
    if digests:
        fmt = FORMAT if labels_covered else "gpufeed.mds/1"
        meta = {"format": fmt, "classes": None, "num_classes": n, "source": "test", "kind": "folder", "samples": n}
        (out / "gpufeed.json").write_text(json.dumps(meta))
    return out


def replicate(src: Path, out: Path, shards: int) -> Path:
    """A dataset of ``shards`` shards made of copies of ``src``'s (shard ``k`` is a copy of shard ``k % len``): an
    index of a thousand shards in a fraction of a second (MDSWriter takes ~10 ms a shard)."""
    import shutil

    index = json.loads((src / "index.json").read_text())
    entries = []
    out.mkdir(parents=True)
    for k in range(shards):
        entry = json.loads(json.dumps(index["shards"][k % len(index["shards"])]))
        name = f"shard.{k:05d}.mds"
        shutil.copyfile(src / entry["raw_data"]["basename"], out / name)
        entry["raw_data"]["basename"] = name
        entries.append(entry)
    (out / "index.json").write_text(json.dumps({"shards": entries, "version": 2}))
    return out


def total_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (downloads in progress included); 0 if it is gone."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except FileNotFoundError:
                pass
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a child: its engine file locks in ``tmp`` (not /tmp), the tests importable."""
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def recipe():
    """The augmentation the stream loader tests serve (torchvision's, converted by gf.stream)."""
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(12), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4), T.ToTensor()])


def open_photos(data: str, **kw):
    """gf.stream over a :func:`write_photos` dataset as the loader tests open it (global batch 8, two canonical
    nodes, shuffled, seed 3, on the CPU)."""
    import gpufeed as gf

    defaults = {"global_batch_size": 8, "transform": recipe(), "device": "cpu", "seed": 3, "shuffle": True}
    return gf.stream(num_canonical_nodes=2, **{"local": data, **defaults, **kw})


def digest(x) -> str:
    """A served image, as a hex digest of its bytes."""
    return hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest()


def _stream(photos: str, out: str, rank: int) -> None:
    """(3) gf.stream over ``photos`` in this process group: epoch 1, the state saved after 3 global batches, every
    served image's digest by sample id."""
    loader = open_photos(photos)
    loader.set_epoch(1)
    served: dict[int, str] = {}
    for k, (x, y) in enumerate(loader):
        served.update((int(i), digest(image)) for i, image in zip(y, x, strict=True))
        if k == 2:
            head = sorted(served)
            Path(f"{out}.state.{rank}.json").write_text(json.dumps({"state": loader.state_dict(), "head": head}))
    Path(f"{out}.served.{rank}.json").write_text(json.dumps(served))


def _rank(data: str, local: str, limit: int, out: str, photos: str | None = None) -> None:
    """One rank of a torchrun job: (1) the engine's own iteration of ``data`` (local) against gpufeed's plan, epochs
    0 and 1; (2) this rank's planned epoch read from ``data`` as a remote through a shared ``local`` under
    ``limit``, with a prefetcher, each sample checked; (3) with ``photos``, :func:`_stream`."""
    import torch.distributed as dist
    from streaming import StreamingDataset

    from gpufeed.mds.index import Index
    from gpufeed.mds.plan import Layout, StreamSettings, plan_epoch, plan_work, rank_order
    from gpufeed.mds.prefetch import Prefetcher
    from gpufeed.mds.shards import Shards

    dist.init_process_group("gloo")  # as a training script does (else the engine starts and ends one per dataset)
    layout = Layout.from_env()
    order = {"num_canonical_nodes": 2, "shuffle": True, "shuffle_seed": 7, "shuffle_block_size": 64}
    settings = StreamSettings(16, **order)
    ds = StreamingDataset(local=data, batch_size=16 // layout.world_size, **order)
    sizes = Index.load(Path(data) / "index.json").samples_per_shard
    result: dict = {"seen": [], "planned": []}
    for epoch in (0, 1):
        result["seen"].append([int(s["idx"]) for s in ds])
        work = plan_work(sizes, settings, layout.num_nodes, layout.ranks_per_node, epoch)
        result["planned"].append(rank_order(work, layout).tolist())
    with Shards(local, data, cache_limit=limit) as shards:
        block = shards.shuffle_block_size(1)
        settings = StreamSettings(16, 1, shuffle=True, shuffle_seed=5, shuffle_block_size=block)
        plan = plan_epoch(shards.index.samples_per_shard, settings, layout, epoch=0)
        bad = []
        with Prefetcher(shards, plan.ids, ahead=2) as ahead:
            for k in range(plan.num_batches):
                got = shards.read(plan.batch(k))
                bad += [
                    int(i)
                    for i, b, y in zip(got.ids, got.images, got.labels, strict=True)
                    if b != payload(i) or y != i % 10
                ]
                ahead.advance((k + 1) * plan.batch_size)
        result |= {"ids": plan.ids.tolist(), "bad": bad, "block": block, "engine_limit": shards.engine_cache_limit}
    Path(f"{out}.{layout.rank}.json").write_text(json.dumps(result))
    if photos is not None:
        _stream(photos, out, layout.rank)
    dist.destroy_process_group()


def _hold(remote: str, local: str, ready: str) -> None:
    """Open a reader on a remote (its shared memory made), say so, and wait to be killed."""
    from gpufeed.mds.shards import Shards

    shards = Shards(local, remote)
    Path(ready).write_text(str(os.getpid()))
    time.sleep(600)
    shards.close()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "rank":
        _rank(args[0], args[1], int(args[2]), args[3], *args[4:])
    elif mode == "hold":
        _hold(*args)
    else:
        raise SystemExit(f"unknown mode {mode}")
