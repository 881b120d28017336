"""Time to the first batch and to the fused kernels' takeover, cold and warm Inductor cache (issue 45).

``gf.accelerate`` of CIFAR-shaped data (synthetic CIFAR-10, 32 px) with RandomCrop + flip + ColorJitter(0.4, 0.4,
0.4, 0.1) + Normalize on the CPU: each run a fresh process (its compiler starts cold in memory), timed from the call
of ``gf.accelerate``: to its return, to the first batch, and to the first batch the fused kernels served (the plan's
``took over`` line). "cold": a fresh ``TORCHINDUCTOR_CACHE_DIR`` (a temporary folder); "warm": the same folder again.
The 1-minute load average is recorded with each run: on a shared machine every figure moves with it.

    PYTHONPATH=src python benchmarks/compile_wait.py --runs 2 --out bench-out
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from harness import environment

GOAL_S = 10.0  # issue 45: the first batch within 10 s of the call, cold, on the 2-core machine

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torchvision.transforms as T
import gpufeed as gf
from gpufeed.data import cifar10
from gpufeed.train.loaders import subset
imported = time.perf_counter() - t0
tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                T.ToTensor(), T.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))])
ds = subset(cifar10("synthetic", train=True, transform=tf), int(sys.argv[1]))
t = time.perf_counter()
loader = gf.accelerate(ds, batch_size=256, shuffle=True, device="cpu", cache=False, progress=False)
built = time.perf_counter() - t
first = took = None
batches = 0
deadline = t + float(sys.argv[2])
while took is None and time.perf_counter() < deadline:
    for x, _ in loader:
        batches += 1
        if first is None:
            first = time.perf_counter() - t
        if loader.takeover.at is not None:
            took = time.perf_counter() - t
            break
print(json.dumps({"import_s": imported, "accelerate_s": built, "first_batch_s": first, "takeover_s": took,
                  "batches_eager": batches - (took is not None), "note": loader.compile_note,
                  "load_1min": os.getloadavg()[0]}))
"""


def run_once(cache: Path, n: int, limit_s: float) -> dict:
    """One fresh process's timings (see the module's text)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "GPUFEED_COMPILE": "1"}
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(n), str(limit_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=limit_s + 300,
        check=True,
    )
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["load_1min_before"] = load
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="cold runs (each with its own fresh cache), each then warm")
    p.add_argument("--n", type=int, default=10_000, help="training images")
    p.add_argument("--limit", type=float, default=900.0, help="seconds a run may wait for the takeover")
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    rows = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpufeed-inductor-") as cache:
            for kind in ("cold", "warm"):
                row = {"run": i, "cache": kind, **run_once(Path(cache), args.n, args.limit)}
                rows.append(row)
                took = f"{row['takeover_s']:.1f}" if row["takeover_s"] is not None else "-"
                print(
                    f"{kind}: accelerate {row['accelerate_s']:.1f} s, first batch {row['first_batch_s']:.1f} s "
                    f"(goal {GOAL_S:g}), fused from {took} s, {row['batches_eager']} batches eager; load "
                    f"{row['load_1min_before']:.1f}-{row['load_1min']:.1f}",
                    flush=True,
                )
    env = environment(torch.device("cpu"), n=args.n, batch_size=256)
    path = args.out / "compile_wait.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": env, "goal_first_batch_s": GOAL_S, "runs": rows}, indent=2, default=str))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
