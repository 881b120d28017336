"""A Lightning ``Trainer.fit`` script whose dataset is slow (it sleeps per sample): data-bound.

Usage: python lightning_fit.py [--epochs E] [--sample-s S]

Prints ``step K loss L`` per training step and ``batches seen N`` after ``fit``.
"""

from __future__ import annotations

import argparse
import warnings

import lightning as L
import torch
from slow_features import SlowFeatures
from torch.utils.data import DataLoader


class Classifier(L.LightningModule):
    def __init__(self, sample_s: float) -> None:
        super().__init__()
        self.net, self.sample_s, self.seen = torch.nn.Linear(16, 2), sample_s, 0

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SlowFeatures(64, self.sample_s), batch_size=8, shuffle=True)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        print(f"step {self.seen} loss {loss.item():.6f}", flush=True)
        self.seen += 1
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sample-s", type=float, default=0.003)
    args = p.parse_args()
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging, not this test's subject
    L.seed_everything(0, verbose=False)
    model = Classifier(args.sample_s)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    print(f"batches seen {model.seen}", flush=True)


if __name__ == "__main__":
    main()
