"""A plain DDP loop under ``torch.distributed.run`` over a gpufeed loader; traces every batch.

Usage: python -m torch.distributed.run --nproc-per-node 2 torchrun_run.py OUT [--save-at K] [--load FILE]
  [--before-init]

Rank 0 alone saves the loader's state (what checkpoints usually hold) after global step K to
OUT/loader.pt; ``--load`` resumes every rank from such a file. ``--before-init`` builds the loader
before ``init_process_group`` (a mistake gpufeed must refuse). Writes OUT/trace-<rank>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torchvision.transforms.v2 as v2
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import gpufeed as gf

N, BATCH, EPOCHS = 40, 4, 2


def build() -> object:
    images = torch.arange(N * 3 * 8 * 8, dtype=torch.int64).remainder(251).to(torch.uint8).view(N, 3, 8, 8)
    tf = v2.Compose([v2.RandomCrop(8, padding=2), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    ds = TensorDataset(images, torch.arange(N))
    return gf.accelerate(ds, batch_size=BATCH, device="cpu", seed=7, cache=False, progress=False, transform=tf)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--load", default=None)
    p.add_argument("--before-init", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loader = build() if args.before_init else None
    dist.init_process_group("gloo")
    if loader is None:
        loader = build()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3 * 8 * 8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.load:
        loader.load_state_dict(torch.load(args.load))
    trace, step = [], 0
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            model(x.flatten(1)).pow(2).mean().backward()
            optimizer.step()
            trace.append([epoch, y.tolist(), round(float(x.double().sum()), 6)])
            step += 1
            if step == args.save_at and rank == 0:
                torch.save(loader.state_dict(), out / "loader.pt")
    (out / f"trace-{rank}.json").write_text(json.dumps(trace))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
