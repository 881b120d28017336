"""Every GPU check of gpufeed in one run, a few minutes on one GPU; writes OUT/gpu_check.json.

    PYTHONPATH=src python benchmarks/gpu_check.py --out "$OUT"

1. the CUDA-marked tests (pytest -m cuda);
2. loader throughput, side by side: gpufeed DeviceLoader, torchvision DataLoader, and airbench's
   CifarLoader (from a wheel in .whl/, built with `pip wheel --no-deps airbench==0.1.8 -w .whl`);
3. the prefetcher race check: a slow consumer (device sleep), per-batch checksums, >= 1,000 batches;
4. no host-device synchronisation in steady state (torch.cuda.set_sync_debug_mode("error")) for
   DeviceLoader and prefetch;
5. accelerate(): the tier fallback under torch.cuda.set_per_process_memory_fraction (same batches),
   and each tier against torchvision's DataLoader (benchmarks/accelerate_tiers.py);
6. the ``gpufeed bench`` ladder: VGG16 on 50,000 images (about 2 minutes on an H200);
7. one GPU under torchrun --nproc-per-node 1 (NCCL, DDP) against the plain run;
8. tune_dataloader() against the rule of thumb (num_workers = cores) on 16 cores.
Parts run in this order and the JSON is rewritten after each, so a run cut short keeps what it did.
Each part records its own error instead of stopping the others.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = f"{ROOT / 'src'}:{ROOT / 'benchmarks'}"  # DataLoader workers import from both
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpufeed as gf  # noqa: E402
from gpufeed import augment as A  # noqa: E402

from harness import environment  # noqa: E402

# --cpu-rehearsal runs every part that can run without a GPU on the CPU, at small sizes, so the
# script's own code is exercised before a GPU session spends minutes on it.
DEV = "cuda"
SMALL = False


def run_cuda_tests(out: Path) -> dict:
    t = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", str(ROOT / "tests")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ,
    )
    (out / "pytest_cuda.txt").write_text(r.stdout + r.stderr)
    return {
        "returncode": r.returncode,
        "summary": (r.stdout.strip().splitlines() or [""])[-1],
        "seconds": round(time.perf_counter() - t, 1),
    }


def add_airbench_wheel() -> str | None:
    wheels = sorted((ROOT / ".whl").glob("airbench-*.whl"))
    if not wheels:
        return None
    target = Path(tempfile.mkdtemp(prefix="airbench-"))
    zipfile.ZipFile(wheels[-1]).extractall(target)
    sys.path.insert(0, str(target))
    return wheels[-1].name


def loader_throughput(out: Path, n: int) -> dict:
    import loader_throughput as lt

    workers = "0,2" if SMALL else "0,16"
    lt.main(
        [
            "--n",
            str(n),
            "--device",
            DEV,
            "--workers",
            workers,
            "--repeats",
            "1" if SMALL else "5",
            "--torch-repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    return json.loads((out / "loader_throughput.json").read_text())


def prefetch_race_check(batches: int = 1200, depth: int = 3) -> dict:
    """A consumer slower than the copies; any missing wait or record_stream corrupts a checksum."""
    shape = (256, 3, 32, 32)
    source = ((torch.full(shape, float(i % 997)), torch.tensor([i])) for i in range(batches))
    sums = torch.zeros(batches, dtype=torch.float64, device=DEV)
    labels = torch.zeros(batches, dtype=torch.int64, device=DEV)
    for i, (x, y) in enumerate(gf.prefetch(source, device=DEV, depth=depth)):
        if DEV == "cuda":
            torch.cuda._sleep(1_000_000)  # ~0.5 ms of device time before reading the batch
        sums[i] = x.double().sum()
        labels[i] = y[0]
        del x, y  # hand the memory back at once: the allocator must still not reuse it early
    if DEV == "cuda":
        torch.cuda.synchronize()
    expected = torch.tensor([float(i % 997) * 256 * 3 * 32 * 32 for i in range(batches)], dtype=torch.float64)
    bad = (sums.cpu() != expected) | (labels.cpu() != torch.arange(batches))
    return {"batches": batches, "depth": depth, "corrupted": int(bad.sum()), "ok": not bool(bad.any())}


def sync_free_check() -> dict:
    res = {}
    aug = A.Compose([A.RandomCrop(32, padding=4), A.RandomHorizontalFlip(), A.Normalize([0.5] * 3, [0.25] * 3)])
    images = torch.randint(0, 256, (20_000, 3, 32, 32), dtype=torch.uint8)
    loader = gf.DeviceLoader(
        images,
        torch.randint(0, 10, (20_000,)),
        batch_size=256,
        transform=aug,
        device="cuda",
        dtype=torch.bfloat16,
        channels_last=True,
    )
    list(loader)  # warm-up: constants cached on the device
    source = [(torch.rand(256, 3, 32, 32), torch.arange(256)) for _ in range(20)]
    list(gf.prefetch(source, device="cuda"))
    for name, make in [("DeviceLoader", lambda: loader), ("prefetch", lambda: gf.prefetch(source, device="cuda"))]:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            count = sum(1 for _ in make())
            res[name] = {"ok": True, "batches": count}
        except RuntimeError as e:
            res[name] = {"ok": False, "error": str(e)[:500]}
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return res


_TIER_SCRIPT = """
import json, sys, warnings, torch
import torchvision.transforms.v2 as v2
from torch.utils.data import TensorDataset
import gpufeed as gf
g = torch.Generator().manual_seed(0)
# 600 MB of uint8 images: over the capped budget (0.006 x 141 GB / 2 = 420 MB), while the cap still
# leaves room for a chunk's working memory (about 300 MB).
ds = TensorDataset(torch.randint(0, 256, (200_000, 3, 32, 32), dtype=torch.uint8, generator=g),
                   torch.randint(0, 10, (200_000,), generator=g))
tf = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                 v2.Normalize([0.5] * 3, [0.25] * 3)])
if sys.argv[1] != "none":
    torch.cuda.set_per_process_memory_fraction(float(sys.argv[1]))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = gf.accelerate(ds, device="cuda", seed=1, cache=False, progress=False, transform=tf)
it = iter(loader)
sums = [float(next(it)[0].double().sum()) for _ in range(20)]
print(json.dumps({"storage": loader.plan.storage, "warnings": [str(w.message) for w in caught], "sums": sums}))
"""


def tier_fallback_check() -> dict:
    """Under a small per-process memory cap the data goes to pinned host memory: same batches, one warning."""
    runs = {}
    for cap in ("none", "0.006"):
        r = subprocess.run([sys.executable, "-c", _TIER_SCRIPT, cap], capture_output=True, text=True, env=os.environ)
        if r.returncode:
            return {"error": r.stderr[-2000:]}
        runs[cap] = json.loads(r.stdout.strip().splitlines()[-1])
    same = runs["none"]["sums"] == runs["0.006"]["sums"]
    return {
        "uncapped": runs["none"]["storage"],
        "capped": runs["0.006"]["storage"],
        "capped_warnings": runs["0.006"]["warnings"],
        "identical_batches": same,
        "ok": same and runs["none"]["storage"] == "device" and runs["0.006"]["storage"] == "pinned",
    }


def accelerate_tiers(out: Path) -> dict:
    import accelerate_tiers as at

    at.main(
        ["--device", DEV, "--workers", "2" if SMALL else "16", "--repeats", "1" if SMALL else "5", "--out", str(out)]
    )
    return json.loads((out / "accelerate_tiers.json").read_text())


def bench_ladder(out: Path) -> dict:
    from gpufeed.bench import run_bench

    rows = run_bench(
        DEV,
        out=out / "bench",
        log=lambda line: print(line, flush=True),
        train_size=512 if SMALL else None,
        test_size=256 if SMALL else None,
    )
    return json.loads((out / "bench" / "bench.json").read_text()) if rows else {}


def tune_vs_rule_of_thumb(out: Path) -> dict:
    import tune_throughput as tt

    tt.main(
        [
            "--device",
            DEV,
            "--budget",
            "5" if SMALL else "45",
            "--n",
            "4000" if SMALL else "20000",
            "--repeats",
            "1" if SMALL else "2",
            "--out",
            str(out),
        ]
    )
    return json.loads((out / "tune_throughput.json").read_text())


def ddp_overhead(out: Path) -> dict:
    """One GPU: the same run plain and under torchrun --nproc-per-node 1 (NCCL, DDP); last-epoch times."""
    model = "small" if SMALL else "resnet9"
    base = [
        sys.executable,
        "-m",
        "gpufeed",
        "train",
        "--model",
        model,
        "--epochs",
        "3",
        "--amp",
        "bf16",
        "--channels-last",
        "--no-progress",
        "--device",
        DEV,
    ]
    if SMALL:
        base += ["--train-size", "1024", "--test-size", "256"]
    res = {}
    for name, extra in [("plain", []), ("torchrun_1", ["--nproc-per-node", "1"])]:
        r = subprocess.run(
            [*base, *extra, "--out", str(out / f"ddp_{name}")], capture_output=True, text=True, env=os.environ, cwd=ROOT
        )
        if r.returncode:
            return {"error": f"{name}: {r.stderr[-2000:]}"}
        epochs = json.loads((out / f"ddp_{name}" / "train.json").read_text())["epochs"]
        res[name] = {"epoch_s": [e["epoch_s"] for e in epochs], "test_acc": epochs[-1]["test_acc"]}
    res["overhead"] = res["torchrun_1"]["epoch_s"][-1] / res["plain"]["epoch_s"][-1] - 1
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--parts", nargs="*", default=None, help="run only these parts (default: all, in order)")
    p.add_argument("--cpu-rehearsal", action="store_true", help="the CPU-capable parts on the CPU, small")
    args = p.parse_args()
    global DEV, SMALL
    if args.cpu_rehearsal:
        DEV, SMALL, args.n = "cpu", True, 2000
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"environment": environment(torch.device(DEV), images=args.n), "airbench": add_airbench_wheel()}
    parts = [
        ("cuda_tests", lambda: run_cuda_tests(args.out)),
        ("prefetch_race", prefetch_race_check),
        ("sync_free", sync_free_check),
        ("tier_fallback", tier_fallback_check),
        ("loader_throughput", lambda: loader_throughput(args.out, args.n)),
        ("accelerate_tiers", lambda: accelerate_tiers(args.out)),
        ("bench_ladder", lambda: bench_ladder(args.out)),
        ("ddp_overhead", lambda: ddp_overhead(args.out)),
        ("tune", lambda: tune_vs_rule_of_thumb(args.out)),
    ]
    if args.parts:
        parts = [(name, fn) for name, fn in parts if name in args.parts]
    if SMALL:  # these need a GPU by nature
        parts = [(name, fn) for name, fn in parts if name not in ("cuda_tests", "sync_free", "tier_fallback")]
    for name, fn in parts:
        t = time.perf_counter()
        try:
            summary[name] = fn()
        except Exception:
            summary[name] = {"error": traceback.format_exc()[-3000:]}
        print(f"[{name}] {time.perf_counter() - t:.1f}s: {json.dumps(summary[name])[:600]}", flush=True)
        (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
