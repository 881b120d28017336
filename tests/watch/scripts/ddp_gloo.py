"""A plain DDP loop for ``torchrun`` on gloo (CPU): ``DistributedSampler``, ``DistributedDataParallel``. Rank 1's
samples are slower to read than rank 0's (``--slow-rank``), so rank 1 waits most and rank 0 waits for it inside
the gradient all-reduce.

Usage: torchrun --nproc-per-node 2 ddp_gloo.py [--epochs E] [--sample-s S] [--slow-rank R]

Prints ``rank R step K loss L`` per batch and ``rank R batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from slow_features import SlowFeatures
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sample-s", type=float, default=0.002)
    p.add_argument("--slow-rank", type=int, default=1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    sample_s = args.sample_s * (4 if rank == args.slow_rank else 1)
    dataset = SlowFeatures(64, sample_s)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"rank {rank} step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"rank {rank} batches seen {seen}", flush=True)
    # every rank done with the group, and DDP's reducer (which holds gloo work) gone before the group: gloo's
    # threads otherwise may still hold work at interpreter exit and abort the process ("terminate called without
    # an active exception", seen once in make test on the plain run)
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
