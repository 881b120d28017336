"""What per-sample keyed draws cost against one ``torch.Generator`` per chunk, side by side in one run.

Every loader now draws each sample's augmentation from its own key (seed, epoch, sample id:
:class:`gpufeed.augment.keyed.KeyedDraws`), so a seed gives the same batches at any chunk size, world size and on
any device; before, each chunk of batches drew from one generator. This times the same batched recipe on the same
chunk of uint8 images both ways, alternating (ABBA) so that a drift of the machine falls on both, and reports the
median seconds per chunk and the keyed draws' cost relative to the generator's.

    python benchmarks/keyed_draws.py [--device cpu] [--batch 256] [--chunk 4] [--repeats 7] [--out bench-out]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from gpufeed.augment import (
    ColorJitter,
    Compose,
    ConvertDtype,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    TrivialAugmentWide,
)
from gpufeed.augment.keyed import KeyedDraws
from gpufeed.device import resolve_device, sync

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def recipes(size: int) -> dict[str, Compose]:
    tail = [ConvertDtype(torch.float32), Normalize(MEAN, STD)]
    return {
        "crop+flip+normalise": Compose([RandomCrop(size, padding=4), RandomHorizontalFlip(), *tail]),
        "RandomResizedCrop+flip+normalise": Compose([RandomResizedCrop(size), RandomHorizontalFlip(), *tail]),
        "ColorJitter+crop+flip+normalise": Compose(
            [ColorJitter(0.4, 0.4, 0.4, 0.1), RandomCrop(size, padding=4), RandomHorizontalFlip(), *tail]
        ),
        "TrivialAugmentWide+crop+flip+normalise": Compose(
            [TrivialAugmentWide(), RandomCrop(size, padding=4), RandomHorizontalFlip(), *tail]
        ),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=4, help="batches per chunk (one transform call)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    n = args.batch * args.chunk
    seeded = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, args.size, args.size), dtype=torch.uint8, generator=seeded).to(device)
    ids = torch.arange(n, device=device)
    rows = []
    for name, aug in recipes(args.size).items():

        def generator_call(epoch: int, aug: Compose = aug) -> None:
            aug(x, generator=torch.Generator(device=device).manual_seed(epoch))

        def keyed_call(epoch: int, aug: Compose = aug) -> None:
            aug(x, generator=KeyedDraws(0, epoch, ids))

        times: dict[str, list[float]] = {"generator": [], "keyed": []}
        for call in (generator_call, keyed_call):  # warm-up: allocator, lazy tables
            call(0)
        for r in range(args.repeats):
            for kind, call in (("generator", generator_call), ("keyed", keyed_call), ("keyed", keyed_call),
                               ("generator", generator_call)):  # fmt: skip
                sync(device)
                t0 = time.perf_counter()
                call(r + 1)
                sync(device)
                times[kind].append(time.perf_counter() - t0)
        g, k = statistics.median(times["generator"]), statistics.median(times["keyed"])
        rows.append({"recipe": name, "generator_s": g, "keyed_s": k, "keyed_vs_generator": k / g})
        print(f"{name:<42} generator {g * 1e3:8.1f} ms  keyed {k * 1e3:8.1f} ms  ({k / g - 1:+.1%})", flush=True)
    result = {"device": str(device), "size": args.size, "batch": args.batch, "chunk": args.chunk, "rows": rows,
              "torch": torch.__version__, "threads": torch.get_num_threads()}  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "keyed_draws.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
