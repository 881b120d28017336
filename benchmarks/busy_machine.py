"""Every loader kind against the DataLoader it replaces, on a quiet machine, beside busy processes, under a CPU quota.

Issue 45: with the 2-core machine loaded, gpufeed's CPU path fell to the DataLoader's speed while the DataLoader kept
its own (torch's OpenMP team spinning at its barriers for threads the other processes had descheduled: NOTE [ Torch's
threads on a busy machine ] in gpufeed/threads.py). Each kind, built once, then timed side by side with its DataLoader
in each condition, the conditions in turn (reversed every other round), so that a change in the rest of the machine
falls on both loaders:

- ``quiet``: nothing started by the benchmark (other users' work goes on: the load and the other processes' CPU
  are recorded with every figure);
- ``busy``: ``--busy`` processes (``python -c "while True: pass"``; each stops should the benchmark die) started
  beside it and killed after;
- ``quota``: this process and its children in a cgroup with a CPU quota of ``--quota`` cores (cgroup v2 ``cpu.max``
  or v1 ``cpu.cfs_quota_us``: root and a writable cgroup file system), else pinned to that many CPUs
  (``sched_setaffinity`` on every thread): the visible-against-usable gap of a container.

The kinds (CPU, one process each side; the DataLoaders with ``--workers`` workers, the fallback with its own):

- ``device32``: DeviceLoader over a Dense store, CIFAR-shaped, RandomCrop(32, padding=4) + flip + Normalize, against
  ``DataLoader`` of the same images through PIL and torchvision's ops (what torchvision's CIFAR10 does); also the
  DeviceLoader with ``GPUFEED_THREADS=torch`` (torch's own thread count for gpufeed's ops: before issue 45);
- ``folder224``: ``gf.accelerate(ImageFolder, store="pixels")`` with RandomResizedCrop(224) + flip + ToTensor +
  Normalize, against ``DataLoader(ImageFolder)``;
- ``hf32``: ``gf.accelerate`` over a Hugging Face dataset of 32 px PNGs (CIFAR's recipe), against
  ``DataLoader(ds.with_transform(...))``;
- ``stream``: ``gf.stream`` over MDS shards of the folder's photos (RandomResizedCrop(224)), against
  ``DataLoader(StreamingDataset)`` + PIL;
- ``fallback``: ``gf.accelerate(..., fallback="prefetch")`` (an op gpufeed cannot batch: its FallbackLoader, the
  user's pipeline in DataLoader workers), against ``DataLoader`` with as many workers.

The goal (issue 45): with two busy processes beside it every kind keeps at least half its quiet lead over its
DataLoader (``kept`` >= 0.5), and DeviceLoader at 32 px stays >= 10x ``DataLoader(num_workers=0)``.

    python benchmarks/busy_machine.py [--rounds 2] [--repeats 3] [--kinds device32,folder224,...] [--out DIR]
    python benchmarks/busy_machine.py --quick     # a rehearsal at tiny sizes (tests/test_busy_machine.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import gpufeed as gf
from gpufeed import augment as A
from gpufeed.device import process_cores
from gpufeed.findings import MachineLoad, MachineMeter

from harness import environment

KINDS = ("device32", "folder224", "hf32", "stream", "fallback")
CONDITIONS = ("quiet", "busy", "quota")
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
GOAL_KEPT, GOAL_DEVICE32_BUSY = 0.5, 10.0


@dataclass
class Kind:
    """One loader kind: gpufeed's loader, the DataLoader it replaces, variants of gpufeed's (name -> environment)."""

    name: str
    gpufeed: Iterable[Any]
    baseline: Iterable[Any]
    images: int
    what: str
    baseline_what: str
    variants: dict[str, dict[str, str]] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None


# -- the kinds -------------------------------------------------------------------------------------------------------


def _pil_cifar(n: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
    from loader_throughput import PILDataset, synthetic_cifar

    data, labels = synthetic_cifar(n)
    tv = T.Compose(
        [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)]
    )
    images = torch.from_numpy(data).permute(0, 3, 1, 2).contiguous()
    return images, torch.from_numpy(labels), PILDataset(data, labels.tolist(), tv)


def device32(args: argparse.Namespace, work: Path) -> Kind:
    images, labels, ds = _pil_cifar(args.n32)
    aug = A.Compose([A.RandomCrop(32, padding=4), A.RandomHorizontalFlip(), A.Normalize(CIFAR_MEAN, CIFAR_STD)])
    loader = gf.DeviceLoader(images, labels, args.batch32, True, transform=aug, device="cpu", seed=0)
    baseline = DataLoader(ds, args.batch32, shuffle=True, num_workers=args.workers)
    return Kind(
        "device32", loader, baseline, args.n32, "DeviceLoader, Dense store, crop+flip+normalise",
        f"DataLoader(PIL per sample, num_workers={args.workers})",
        variants={"GPUFEED_THREADS=torch": {"GPUFEED_THREADS": "torch"}},
    )  # fmt: skip


def _folder(args: argparse.Namespace, work: Path) -> Any:
    from gpufeed.data.folder import synthetic_folder

    root = work / "folder" if args.quick else None  # the rehearsal's own; else generated once in gpufeed's cache
    return synthetic_folder("train", None, sizes=(args.photos, max(10, args.photos // 4)), root=root,
                            scale=0.25 if args.quick else 1.0)  # fmt: skip


def folder224(args: argparse.Namespace, work: Path) -> Kind:
    from image_folder import recipe

    folder = _folder(args, work)
    folder.transform = recipe(args.size)
    folder.samples = folder.imgs = folder.samples[: args.photos]
    folder.targets = folder.targets[: args.photos]
    loader = gf.accelerate(folder, args.batch, device="cpu", store="pixels", cache=False, progress=False)
    baseline = DataLoader(folder, args.batch, shuffle=True, num_workers=args.workers)
    return Kind(
        "folder224", loader, baseline, len(folder),
        f"accelerate(ImageFolder), pixel store, RandomResizedCrop({args.size})",
        f"DataLoader(ImageFolder, num_workers={args.workers})",
    )  # fmt: skip


def hf32(args: argparse.Namespace, work: Path) -> Kind:
    from hf_datasets import hf_dataset, recipe

    ds = hf_dataset(args.n_hf, work / "hf", "small", 32)
    aug = recipe(32, "small")

    def fn(batch: dict) -> dict:
        return {"pixel_values": [aug(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}

    loader = gf.accelerate(ds, args.batch32, device="cpu", transform=aug, cache=False, progress=False)
    dl = DataLoader(ds.with_transform(fn), args.batch32, shuffle=True, num_workers=args.workers)
    baseline = _Mapped(dl, lambda b: (b["pixel_values"], b["label"]))
    return Kind(
        "hf32", loader, baseline, len(ds),
        "accelerate(datasets.Dataset of 32 px PNGs), pixel store, crop+flip+normalise",
        f"DataLoader(ds.with_transform(...), num_workers={args.workers})",
    )  # fmt: skip


class _Mapped:
    """An iterable's batches mapped by ``fn`` (a new pass each iteration)."""

    def __init__(self, it: Iterable[Any], fn: Callable[[Any], Any]) -> None:
        self.it, self.fn = it, fn

    def __iter__(self) -> Iterator[Any]:
        return (self.fn(b) for b in self.it)


def stream(args: argparse.Namespace, work: Path) -> Kind:
    from streaming import StreamingDataset

    from stream_throughput import PILStream, convert_folder, recipe

    folder = _folder(args, work)
    root = work / "photos"  # the first --photos of the folder, linked: the shards hold what the other kinds read
    for path, label in folder.samples[: args.photos]:
        dst = root / folder.classes[label] / Path(path).name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            os.link(path, dst)
    mds = work / "mds"
    convert_folder(root, mds, shard_size=1 << 22)
    engine_local = work / "mds-engine"  # the engine holds its local directory: a linked copy of its own
    shutil.copytree(mds, engine_local, copy_function=os.link)
    tf = recipe(args.size)
    loader = gf.stream(local=str(mds), transform=tf, batch_size=args.batch, device="cpu")
    engine = StreamingDataset(local=str(engine_local), batch_size=args.batch, shuffle=True, shuffle_seed=9176)
    baseline = DataLoader(PILStream(engine, tf), args.batch, num_workers=args.workers)
    count = sum(1 for p in root.rglob("*") if p.is_file())
    return Kind(
        "stream", loader, baseline, count, f"gf.stream(local=mds), RandomResizedCrop({args.size})",
        f"DataLoader(StreamingDataset) + PIL, num_workers={args.workers}",
        close=lambda: (loader.close(), getattr(engine, "__del__", lambda: None)()),
    )  # fmt: skip


class ChannelShuffle:
    """A user's own random op, which gpufeed cannot batch: the channels of a ``(C, H, W)`` tensor in a random order."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x[torch.randperm(x.shape[0])]


def fallback(args: argparse.Namespace, work: Path) -> Kind:
    import warnings

    from loader_throughput import PILDataset, synthetic_cifar

    data, labels = synthetic_cifar(args.n_fallback)
    tv = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), ChannelShuffle(),
                    T.Normalize(CIFAR_MEAN, CIFAR_STD)])  # fmt: skip  # a user's own random op: not batched
    ds = PILDataset(data, labels.tolist(), tv)
    ds.data, ds.targets = data, labels.tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning: taken on purpose here
        loader = gf.accelerate(ds, args.batch32, device="cpu", fallback="prefetch", progress=False, cache=False)
    if loader.plan.storage != "fallback":
        raise SystemExit(f"the fallback kind's recipe runs batched now ({loader.plan.batched}): give it another op")
    workers = loader.plan.workers
    from gpufeed.workers import loader_kwargs

    baseline = DataLoader(ds, args.batch32, shuffle=True, **loader_kwargs(workers, persistent=True))
    return Kind(
        "fallback", loader, baseline, len(ds), f"accelerate(fallback='prefetch'): FallbackLoader, {workers} workers",
        f"DataLoader(PIL per sample, num_workers={workers}, persistent)",
    )  # fmt: skip


BUILD: dict[str, Callable[[argparse.Namespace, Path], Kind]] = {
    "device32": device32,
    "folder224": folder224,
    "hf32": hf32,
    "stream": stream,
    "fallback": fallback,
}


# -- the conditions --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def busy(count: int, settle: float = 0.5) -> Iterator[list[int]]:
    """``count`` processes spinning on the CPU beside this one (its children, in its session), killed after; each
    stops by itself should this one die first (it spins on ``os.getppid()``)."""
    spin = f"import os\nwhile os.getppid() == {os.getpid()}: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    try:
        time.sleep(settle)  # they are running, and the scheduler has seen them
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _cgroup_dirs(cores: float) -> tuple[Path, str, str] | None:
    """A writable cgroup for a quota: (its parent, the quota file's name, the text to write), v2 or v1; None."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").is_file() and "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
        return v2, "cpu.max", f"{int(cores * 100_000)} 100000"
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").is_file() and os.access(v1, os.W_OK):
        return v1, "cpu.cfs_quota_us", str(int(cores * 100_000))
    return None


def _tree() -> list[int]:
    import psutil

    me = psutil.Process()
    return [me.pid, *(c.pid for c in me.children(recursive=True))]


@contextlib.contextmanager
def quota(cores: float) -> Iterator[str]:
    """This process and its children under a CPU quota of ``cores`` (a new cgroup), else pinned to that many CPUs."""
    found = _cgroup_dirs(cores)
    if found is not None:
        parent, name, text = found
        group = parent / f"gpufeed-busy-machine-{os.getpid()}"
        try:
            group.mkdir()
            if name == "cpu.cfs_quota_us":
                (group / "cpu.cfs_period_us").write_text("100000")
            (group / name).write_text(text)
            own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                       if line.split(":")[1] in ("", "cpu", "cpu,cpuacct"))  # fmt: skip
            back = parent / own.strip("/")
            for pid in _tree():
                (group / "cgroup.procs").write_text(str(pid))
        except OSError as e:
            print(f"no cgroup quota ({e}): pinned to CPUs instead", file=sys.stderr)
            shutil.rmtree(group, ignore_errors=True) if not any(group.glob("*")) else None
        else:
            try:
                process_cores(fresh=True)  # gpufeed's reading, which it would take again within a second
                yield f"cgroup {name} {text} ({group})"
            finally:
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (back / "cgroup.procs").write_text(pid)
                group.rmdir()
                process_cores(fresh=True)  # and on the way out
            return
    import psutil

    keep = sorted(os.sched_getaffinity(0))[: max(1, int(cores))]
    before = {pid: psutil.Process(pid).cpu_affinity() for pid in _tree()}
    tasks = [int(t) for t in os.listdir("/proc/self/task")]
    try:
        for tid in tasks + list(before)[1:]:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, keep)
        yield f"sched_setaffinity({keep})"  # gpufeed reads its cores again when its affinity changes
    finally:
        everything = sorted(before[os.getpid()])
        for tid in [int(t) for t in os.listdir("/proc/self/task")] + list(before)[1:]:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, everything)


# -- the measurement -------------------------------------------------------------------------------------------------


def epochs(loader: Iterable[Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _batch in loader:
            pass
        out.append(time.perf_counter() - t)
    return out


@contextlib.contextmanager
def env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _load(meter: MachineMeter) -> dict[str, Any]:
    m: MachineLoad = meter.read()
    return {
        "load_1min": round(m.load, 2),
        "others_cores": round(m.others, 2),
        "own_cores": round(m.own, 2),
        "usable_cores": m.cores.usable,
        "cores": str(m.cores),
        "throttled_share": None if m.throttled_share is None else round(m.throttled_share, 3),
    }


def measure(kind: Kind, condition: str, args: argparse.Namespace, flip: bool) -> dict[str, Any]:
    """gpufeed's loader, its variants and the DataLoader, ``args.repeats`` epochs each, in one condition."""
    stack = contextlib.ExitStack()
    with stack:
        exclude: list[int] = []
        how = "nothing started"
        if condition == "busy":
            exclude = stack.enter_context(busy(args.busy, 0.1 if args.quick else 0.5))
            how = f"{args.busy} x python -c 'while True: pass' (spinning on os.getppid())"
        elif condition == "quota":
            how = stack.enter_context(quota(args.quota))
        meter = MachineMeter(exclude=exclude)
        rows: dict[str, list[float]] = {}
        order = [("gpufeed", kind.gpufeed, {}), ("baseline", kind.baseline, {})]
        order += [(name, kind.gpufeed, values) for name, values in kind.variants.items()]
        for name, loader, values in reversed(order) if flip else order:
            with env(values):
                rows[name] = epochs(loader, args.repeats)
        load = _load(meter)
    medians = {name: statistics.median(times) for name, times in rows.items()}
    return {
        "how": how,
        "seconds": {name: [round(t, 4) for t in times] for name, times in rows.items()},
        "median_s": {name: round(s, 4) for name, s in medians.items()},
        "ratio": round(medians["baseline"] / medians["gpufeed"], 2),
        "variant_ratios": {name: round(medians["baseline"] / medians[name], 2) for name in kind.variants},
        **load,
    }


def summarise(kind: Kind, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per condition the median ratio over the rounds; the lead kept busy and under the quota (ratio / quiet)."""
    ratios = {c: statistics.median(r[c]["ratio"] for r in rounds) for c in rounds[0]}
    out: dict[str, Any] = {"ratio": {c: round(v, 2) for c, v in ratios.items()}}
    if "quiet" in ratios:
        out["kept"] = {c: round(v / ratios["quiet"], 2) for c, v in ratios.items() if c != "quiet"}
        if "busy" in ratios:
            out["goal_kept_met"] = ratios["busy"] >= GOAL_KEPT * ratios["quiet"]
    if kind.name == "device32" and "busy" in ratios:
        out["goal_10x_busy_met"] = ratios["busy"] >= GOAL_DEVICE32_BUSY
    for name in kind.variants:
        out[f"ratio {name}"] = {c: statistics.median(r[c]["variant_ratios"][name] for r in rounds) for c in rounds[0]}
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS), help=f"of {','.join(KINDS)}")
    p.add_argument("--conditions", type=lambda s: s.split(","), default=list(CONDITIONS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="epochs per loader per condition (their median)")
    p.add_argument("--busy", type=int, default=2, help="busy processes in the busy condition")
    p.add_argument("--quota", type=float, default=1.0, help="the quota condition's CPU quota, in cores")
    p.add_argument("--workers", type=int, default=0, help="the DataLoaders' num_workers (the fallback: its own)")
    p.add_argument("--n32", type=int, default=10_000, help="device32: CIFAR-shaped images")
    p.add_argument("--batch32", type=int, default=256)
    p.add_argument("--n-hf", type=int, default=5_000, help="hf32: PNGs of 32 px")
    p.add_argument("--n-fallback", type=int, default=4_096)
    p.add_argument("--photos", type=int, default=500, help="folder224 and stream: photos around 375x500")
    p.add_argument("--size", type=int, default=224, help="RandomResizedCrop's size")
    p.add_argument("--batch", type=int, default=64, help="folder224 and stream")
    p.add_argument("--quick", action="store_true", help="a rehearsal at tiny sizes (seconds)")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    unknown = set(args.kinds) - set(KINDS) or set(args.conditions) - set(CONDITIONS)
    if unknown:
        p.error(f"unknown: {sorted(unknown)}")
    if args.quick:
        args.rounds, args.repeats, args.n32, args.batch32, args.n_hf, args.n_fallback = 1, 1, 512, 64, 64, 128
        args.photos, args.size, args.batch = 16, 32, 8
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill leaves no cgroup and no busy process behind
    device = torch.device("cpu")
    start = time.perf_counter()
    load_at_start = os.getloadavg()
    cores_at_start = str(process_cores())
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.kinds:
            t = time.perf_counter()
            kind = BUILD[name](args, Path(tmp) / name)
            try:
                epochs(kind.gpufeed, 1), epochs(kind.baseline, 1)  # warm-up: compiles, workers, page cache
                for variant in kind.variants.values():
                    with env(variant):
                        epochs(kind.gpufeed, 1)
                built = time.perf_counter() - t
                rounds = []
                for r in range(args.rounds):
                    conditions = args.conditions if r % 2 == 0 else list(reversed(args.conditions))
                    rounds.append({c: measure(kind, c, args, flip=(r % 2 == 1)) for c in conditions})
                    print(f"{name} round {r + 1}: " + ", ".join(
                        f"{c} {v['ratio']}x (load {v['load_1min']}, others {v['others_cores']} cores)"
                        for c, v in rounds[-1].items()), flush=True)  # fmt: skip
            finally:
                kind.close()
            results[name] = {
                "gpufeed": kind.what, "baseline": kind.baseline_what, "images": kind.images,
                "built_s": round(built, 1), "rounds": rounds, **summarise(kind, rounds),
            }  # fmt: skip
    environ = environment(
        device, kinds=args.kinds, conditions=args.conditions, rounds=args.rounds, repeats=args.repeats,
        busy_processes=args.busy, quota_cores=args.quota, workers=args.workers, quick=args.quick,
        torch_threads=torch.get_num_threads(), cores=cores_at_start, load_at_start=load_at_start,
        load_at_end=os.getloadavg(),
        autogroup=Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
        if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() else None,
        sizes={"n32": args.n32, "batch32": args.batch32, "n_hf": args.n_hf, "n_fallback": args.n_fallback,
               "photos": args.photos, "size": args.size, "batch": args.batch},
    )  # fmt: skip
    print(", ".join(f"{k}={v}" for k, v in environ.items() if k != "sizes"))
    header = f"{'kind':<10} " + " ".join(f"{c + ' x':>9}" for c in args.conditions) + "  kept busy / quota  goal"
    print(header)
    for name, r in results.items():
        kept = r.get("kept", {})
        goal = r.get("goal_kept_met")
        print(f"{name:<10} " + " ".join(f"{r['ratio'].get(c, float('nan')):9.2f}" for c in args.conditions)
              + f"  {kept.get('busy', float('nan')):.2f} / {kept.get('quota', float('nan')):.2f}"
              + ("" if goal is None else ("  met" if goal else "  MISSED")))  # fmt: skip
        for key in [k for k in r if k.startswith("ratio ")]:
            print(f"  {key}: {r[key]}")
    summary = {"environment": environ, "kinds": results, "total_s": round(time.perf_counter() - start, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "busy_machine.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"wrote {args.out / 'busy_machine.json'} ({summary['total_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
