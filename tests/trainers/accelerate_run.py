"""A Hugging Face Accelerate run over a gpufeed loader, under ``torch.distributed.run``; traces every batch.

Usage: python -m torch.distributed.run --nproc-per-node 2 accelerate_run.py OUT [--save-at K] [--load DIR]
  [--fallback]

The loader is built after ``Accelerator()`` (so it reads the process group), registered for
checkpointing, and trained for 2 epochs with gradient accumulation over 2 steps. Writes
OUT/trace-<rank>.json: [epoch, labels, pixel sum, sync_gradients, end_of_dataloader] per step;
``--save-at K`` saves the state after global step K into OUT/state.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
import torchvision.transforms.v2 as v2
from accelerate import Accelerator
from torch.utils.data import TensorDataset

import gpufeed as gf

N, BATCH, EPOCHS = 40, 4, 2


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--load", default=None)
    p.add_argument("--fallback", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    images = torch.arange(N * 3 * 8 * 8, dtype=torch.int64).remainder(251).to(torch.uint8).view(N, 3, 8, 8)
    ops = [v2.RandomCrop(8, padding=2), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]
    extra: dict = {"fallback": "prefetch", "num_workers": 0} if args.fallback else {}
    if args.fallback:
        ops.insert(0, v2.ElasticTransform(alpha=10.0, sigma=1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = gf.accelerate(
            TensorDataset(images, torch.arange(N)),
            batch_size=BATCH,
            device="cpu",
            seed=7,
            cache=False,
            progress=False,
            transform=v2.Compose(ops),
            **extra,
        )
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 8 * 8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # the loader passes through
    accelerator.register_for_checkpointing(loader)
    if args.load:
        accelerator.load_state(args.load)
    trace, step = [], 0
    for epoch in range(loader.epoch, EPOCHS):  # after load_state: the epoch the loader resumes in
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = model(x.flatten(1)).pow(2).mean()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            state = accelerator.gradient_state
            trace.append(
                [epoch, y.tolist(), round(float(x.double().sum()), 6), state.sync_gradients, state.end_of_dataloader]
            )
            step += 1
            if step == args.save_at:
                accelerator.save_state(str(out / "state"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trace-{accelerator.process_index}.json").write_text(json.dumps(trace))
    accelerator.end_training()


if __name__ == "__main__":
    main()
