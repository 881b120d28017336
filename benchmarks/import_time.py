"""What ``import gpufeed`` and a no-op CLI call cost against ``import torch``, side by side in one run.

Each command runs in a fresh interpreter (bytecode compiled first, as ``make test`` does), the three kinds in turn
(``import torch``, ``import gpufeed``, ``gpufeed --help``) so that a drift of the machine's speed falls on all of
them; the figure per kind is the median wall time of ``--repeats`` runs, and the ratios are against ``import torch``
(goal: ``import gpufeed`` under 1.3x). Also recorded: the top-level packages ``import gpufeed`` adds to torch's.

    python benchmarks/import_time.py [--repeats 9] [--out bench-out]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL = 1.3
KINDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import gpufeed": [sys.executable, "-c", "import gpufeed"],
    "gpufeed --help": [sys.executable, "-m", "gpufeed", "--help"],
}
ADDED = (
    "import sys, torch; before = {m.split('.')[0] for m in sys.modules}; import gpufeed; "
    "print(sorted({m.split('.')[0] for m in sys.modules} - before))"
)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for cmd in KINDS.values():  # a first run of each: the OS's file cache warm for all
        subprocess.run(cmd, check=True, capture_output=True)
    for _ in range(args.repeats):
        for kind, cmd in KINDS.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times[kind].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    added = subprocess.run([sys.executable, "-c", ADDED], check=True, capture_output=True, text=True).stdout.strip()
    result = {
        "repeats": args.repeats,
        "median_s": median,
        "ratio_to_torch": {k: median[k] / median["import torch"] for k in KINDS},
        "packages_added": added,
        "goal": GOAL,
    }
    result["ok"] = result["ratio_to_torch"]["import gpufeed"] <= GOAL
    for kind in KINDS:
        print(f"{kind:<16} {median[kind]:.2f} s  {result['ratio_to_torch'][kind]:.2f}x import torch")
    print(f"import gpufeed adds the packages {added} to torch's")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "import_time.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
