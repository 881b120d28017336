"""A Lightning script with a ``LightningDataModule`` whose ``train_dataloader()`` builds a ``DataLoader`` over an
image folder with a torchvision recipe, passed to ``Trainer.fit(model, datamodule=dm)``.

Usage: python lightning_datamodule.py DATA [--workers N] [--epochs E] [--size S]

Prints ``step K loss L`` per training step and ``batches seen N`` after ``fit``.
"""

from __future__ import annotations

import argparse
import warnings

import lightning as L
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder


class FolderData(L.LightningDataModule):
    def __init__(self, root: str, size: int, workers: int) -> None:
        super().__init__()
        self.root, self.size, self.workers = root, size, workers

    def setup(self, stage: str) -> None:
        recipe = T.Compose([T.RandomResizedCrop(self.size), T.RandomHorizontalFlip(), T.ToTensor()])
        self.train_set = ImageFolder(self.root, transform=recipe)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=16, shuffle=True, num_workers=self.workers)


class Classifier(L.LightningModule):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.Flatten(), torch.nn.LazyLinear(2))
        self.net(torch.zeros(1, 3, size, size))
        self.seen = 0

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
    p.add_argument("data")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--size", type=int, default=32)
    args = p.parse_args()
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging, not this test's subject
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    model = Classifier(args.size)
    trainer.fit(model, datamodule=FolderData(args.data, args.size, args.workers))
    print(f"batches seen {model.seen}", flush=True)


if __name__ == "__main__":
    main()
