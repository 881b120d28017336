"""Peak host memory of ``gf.accelerate`` while it ingests, beyond the dataset's own array.

Question: how many copies of the images does accelerate hold at its peak? The goal (issue 9) is at
most one beyond the dataset's array (the ``(N, C, H, W)`` store itself).

Each case runs in a fresh process: the dataset is loaded, the kernel's peak-RSS mark is reset
(``/proc/self/clear_refs``), accelerate runs, and the new peak (``VmHWM``) minus the resident size
before the call is the figure. Run: ``python benchmarks/ingest_memory.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from harness import environment

_CHILD = """
import ctypes, gc, json, sys, warnings
import torchvision.transforms as T
import gpufeed as gf
from gpufeed.data import cifar10
from gpufeed.train.loaders import train_transform

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

case, root = sys.argv[1], sys.argv[2]
transform = train_transform()
if case == "per-sample (Resize cached)":
    transform = T.Compose([T.Resize(32), *transform.transforms])
ds = cifar10("synthetic", train=True, transform=transform)
kwargs = {"cache": False}
if case.startswith("cache"):
    kwargs = {"cache": root}
    if case == "cache hit":  # build it first, in this process, then measure the read
        gf.accelerate(ds, batch_size=256, device="cpu", progress=False, **kwargs)
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # return freed heap to the OS, so reuse of it is not hidden
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current resident size
before = status("VmRSS")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    loader = gf.accelerate(ds, batch_size=256, device="cpu", progress=False, num_workers=0, **kwargs)
peak = status("VmHWM")
print(json.dumps({"extra": peak - before, "images": ds.data.nbytes, "ingest": loader.plan.ingest}))
"""

CASES = ["arrays (nothing cached)", "cache written", "cache hit", "per-sample (Resize cached)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="folder for ingest_memory.json")
    args = parser.parse_args()
    rows = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="gpufeed-mem-") as root:
            run = subprocess.run([sys.executable, "-c", _CHILD, case, root], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{case}: {run.stderr}")
        r = json.loads(run.stdout.strip().splitlines()[-1])
        rows.append({"case": case, **r, "copies": r["extra"] / r["images"]})
        print(
            f"{case:<30} peak beyond the dataset {r['extra'] / 2**20:7.1f} MiB = {rows[-1]['copies']:.2f} x the "
            f"images ({r['images'] / 2**20:.1f} MiB); {r['ingest']}"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        env = environment(torch.device("cpu"), images=50_000)
        (args.out / "ingest_memory.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
