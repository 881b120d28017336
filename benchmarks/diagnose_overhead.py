"""What ``gpufeed diagnose -- CMD`` costs a training loop: step time with and without its hook, side by side.

A small training loop (an MLP on CPU over an in-memory ``TensorDataset`` through a ``DataLoader``) runs in a
process started as ``gpufeed diagnose`` starts a script (``watch/site`` first on ``PYTHONPATH``,
``GPUFEED_WATCH_DIR`` set: the hook is installed, its CPU sampler thread runs). Its epochs alternate between the
hook's timing of each batch and torch's own methods (the hook's patched ``_BaseDataLoaderIter.__init__``, ``_reset``
and ``__next__`` swapped for the originals they wrap, ``__wrapped__``), in the order ABBA so that a
drift of the machine's speed cancels. Alternating within one process, epoch by epoch, resolves a difference far
smaller than comparing separate processes does: on a shared machine, process-to-process noise was 8%.

The overhead is the median over processes of ``hooked / plain - 1`` (each process's median epoch of each kind);
the sampler thread, which runs in both kinds of epoch, is given apart as the CPU it used. Goal: under 2%.

    python benchmarks/diagnose_overhead.py                  # num_workers 0 and 2, 5 processes each
    python benchmarks/diagnose_overhead.py --repeats 9 --workers 0 --out bench-out
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SITE = Path(__file__).resolve().parents[1] / "src" / "gpufeed" / "watch" / "site"
GOAL = 0.02
WARM_UP = 4  # epochs left out: the workers' start, the allocator's and the caches' warm-up
ORDER = (True, False, False, True)  # ABBA: hooked, plain, plain, hooked


def child(workers: int, blocks: int, batches: int, batch_size: int) -> None:
    """One process: ``blocks`` ABBA blocks of epochs after the warm-up, first over the batches alone, then training;
    prints each block's (hooked, plain) seconds per batch and the CPU the hook's sampler thread used (share of a
    core over the process's run)."""
    import torch
    import torch.utils.data.dataloader as dl
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)  # one core per step: a thread pool on shared cores turns the step time into noise
    torch.manual_seed(0)
    n = batches * batch_size
    data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hot = [(dl._BaseDataLoaderIter, name) for name in ("__init__", "_reset", "__next__")]
    patched = {(cls, name): cls.__dict__[name] for cls, name in hot}
    if not all(hasattr(fn, "__wrapped__") for fn in patched.values()):
        raise SystemExit("the hook is not installed: run this through the parent, not with --child alone")

    def use(hooked: bool) -> None:
        for (cls, name), fn in patched.items():
            setattr(cls, name, fn if hooked else fn.__wrapped__)

    def epoch(train: bool) -> float:
        t0, steps = time.perf_counter(), 0
        for x, y in loader:
            if train:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            steps += 1
        return (time.perf_counter() - t0) / steps

    t_start = time.perf_counter()
    out: dict[str, Any] = {}
    for train in (False, True):  # the batches alone (the hook's cost per batch), then the training loop
        times = []
        for k in range(WARM_UP + 4 * blocks):
            use(ORDER[k % len(ORDER)])
            times.append(epoch(train))
        kind = "step" if train else "batch"
        out[kind] = _blocks(times[WARM_UP:])
    out["sampler_core"] = _sampler_cpu_s() / (time.perf_counter() - t_start)
    print(json.dumps(out))


def _blocks(times: list[float]) -> list[tuple[float, float]]:
    """Each ABBA block's (hooked, plain) mean seconds per batch."""
    return [
        ((times[i] + times[i + 3]) / 2, (times[i + 1] + times[i + 2]) / 2) for i in range(0, len(times), len(ORDER))
    ]


def _sampler_cpu_s() -> float:
    """CPU seconds the hook's sampler thread has used (0 if it is not found)."""
    import psutil

    ids = {t.native_id for t in threading.enumerate() if "sampler" in t.name}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def run_once(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """One process started as ``gpufeed diagnose`` starts a script (the hook in it), its figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFEED_WATCH")}
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, __file__, "--child", "--workers", str(workers), "--blocks", str(args.blocks)]
    cmd += ["--batches", str(args.batches), "--batch-size", str(args.batch_size)]
    with tempfile.TemporaryDirectory() as watch_dir:
        env |= {"GPUFEED_WATCH_DIR": watch_dir, "GPUFEED_WATCH_STEPS": "0", "GPUFEED_WATCH_SIDE": "0"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the loop failed:\n{done.stderr}")
        if not list(Path(watch_dir).glob("record-*.json")):
            raise RuntimeError(f"the hook wrote no record: it did not run\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """The figures over ``repeats`` processes: every ABBA block of every process pooled, medians of them."""
    runs = [run_once(workers, args) for _ in range(args.repeats)]
    row: dict[str, Any] = {"workers": workers, "repeats": args.repeats, "blocks": args.blocks}
    for kind in ("batch", "step"):
        blocks = [tuple(b) for r in runs for b in r[kind]]
        ratios = [hooked / plain - 1 for hooked, plain in blocks]
        row[f"{kind}_plain_us"] = 1e6 * statistics.median(plain for _, plain in blocks)
        row[f"{kind}_hooked_us"] = 1e6 * statistics.median(hooked for hooked, _ in blocks)
        row[f"{kind}_cost_us"] = 1e6 * statistics.median(hooked - plain for hooked, plain in blocks)
        row[f"{kind}_overhead"] = statistics.median(ratios)
        row[f"{kind}_quartiles"] = statistics.quantiles(ratios, n=4)[::2] if len(ratios) > 1 else [ratios[0]] * 2
    # the hook's cost per batch, measured on the batches alone, over the step it is part of
    row["implied_overhead"] = row["batch_cost_us"] / row["step_plain_us"]
    row["sampler_core"] = statistics.median(r["sampler_core"] for r in runs)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workers", default="0,2", help="DataLoader num_workers values, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="processes per num_workers value")
    p.add_argument("--blocks", type=int, default=6, help=f"ABBA blocks of epochs per process (after {WARM_UP} warm-up)")
    p.add_argument("--batches", type=int, default=100, help="batches per epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", type=Path, default=None, help="folder for diagnose_overhead.json")
    args = p.parse_args()
    if args.child:
        child(int(args.workers), args.blocks, args.batches, args.batch_size)
        return
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from harness import environment

    rows = [measure(int(w), args) for w in args.workers.split(",")]
    print(f"gpufeed diagnose's hook on a training loop: MLP 256-512-10 on CPU (1 thread), batch {args.batch_size},")
    print(f"in-memory DataLoader, {args.batches} batches an epoch; epochs alternate hook / no hook (ABBA),")
    print(f"{args.blocks} blocks in each of {args.repeats} processes; medians over the blocks")
    header = (
        f"{'num_workers':>11} {'loop':>13} {'us/batch, no hook':>17} {'hook':>9} {'cost us':>8} {'overhead':>9} "
        f"{'(quartiles)':>17}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        for kind, what in (("batch", "batches alone"), ("step", "training")):
            low, high = r[f"{kind}_quartiles"]
            print(
                f"{r['workers']:>11} {what:>13} {r[kind + '_plain_us']:17.1f} {r[kind + '_hooked_us']:9.1f} "
                f"{r[kind + '_cost_us']:8.1f} {100 * r[kind + '_overhead']:8.2f}% "
                f"{f'{100 * low:+.2f} .. {100 * high:+.2f}%':>17}"
            )
        print(
            f"{'':>11} the hook's cost per batch over the training step: {100 * r['implied_overhead']:.2f}%; "
            f"its sampler thread: {100 * r['sampler_core']:.2f}% of one core"
        )
    for r in rows:
        low, high = r["step_quartiles"]
        resolved = "resolved" if low > 0 or high < 0 else "not resolved: its quartiles straddle 0"
        cost = "met" if r["implied_overhead"] < GOAL else "MISSED"
        print(
            f"num_workers {r['workers']}: goal under {100 * GOAL:.0f}% of the step: the cost per batch "
            f"{100 * r['implied_overhead']:.2f}% ({cost}); the training loop's difference "
            f"{100 * r['step_overhead']:+.2f}% ({resolved})"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"environment": environment(torch.device("cpu")), "goal": GOAL, "rows": rows}
        (args.out / "diagnose_overhead.json").write_text(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
