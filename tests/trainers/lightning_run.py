"""A Lightning run over a gpufeed loader whose labels are the sample indices, tracing every batch.

Usage: python lightning_run.py OUT_DIR MODE [--devices N] [--ckpt PATH] [--limit K] [--epochs E]
  [--every K] [--outside] [--explicit] [--fallback] [--evaluate]

Writes OUT_DIR/trace-<rank>.json: one [epoch, batch_idx, labels, pixel sum] per training step, and
the checkpoints ModelCheckpoint saved (every --every steps, or at epoch ends).

``--evaluate`` adds gpufeed loaders of N_EVAL samples (labels: their indices) from
``val_dataloader()`` (``even="pad"``, validation every half epoch), ``test_dataloader()``
(``even=False``) and ``predict_dataloader()`` (``even=False``), runs ``trainer.test`` and
``trainer.predict`` after ``fit``, and writes OUT_DIR/eval-<rank>.json: one [stage, labels served,
labels kept (the first ``loader.real_counts[batch_idx]`` of each batch)] per evaluation run, and the
metrics logged with ``sync_dist`` (real samples summed over steps and ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import lightning as L
import torch
import torchvision.transforms.v2 as v2
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

import gpufeed as gf

N, BATCH = 40, 4
N_EVAL = 26  # not a multiple of BATCH * 2: two ranks get padded (even="pad") or unequal (even=False) shares


def make_loader(args: argparse.Namespace, explicit_world: int | None = None) -> object:
    images = torch.arange(N * 3 * 8 * 8, dtype=torch.int64).remainder(251).to(torch.uint8).view(N, 3, 8, 8)
    ds = TensorDataset(images, torch.arange(N))
    ops = [v2.RandomCrop(8, padding=2), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]
    if args.fallback:
        ops.insert(0, v2.ElasticTransform(alpha=10.0, sigma=1.0))  # not batched: the per-sample fallback runs it
    kwargs: dict = {"batch_size": BATCH, "device": "cpu", "seed": 7, "cache": False, "progress": False}
    if explicit_world is not None:
        kwargs.update(rank=int(os.environ.get("LOCAL_RANK", "0")), world_size=explicit_world)
    if args.fallback:
        kwargs.update(fallback="prefetch", num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gf.accelerate(ds, transform=v2.Compose(ops), **kwargs)


def make_eval_loader(even: bool | str) -> object:
    images = torch.arange(N_EVAL * 3 * 8 * 8, dtype=torch.int64).remainder(241).to(torch.uint8).view(N_EVAL, 3, 8, 8)
    ds = TensorDataset(images, torch.arange(N_EVAL))
    tf = v2.Compose([v2.ToDtype(torch.float32, scale=True)])
    kwargs = {"batch_size": BATCH, "device": "cpu", "seed": 3, "cache": False, "progress": False}
    return gf.accelerate(ds, transform=tf, shuffle=False, even=even, **kwargs)


class Traced(L.LightningModule):
    def __init__(self, args: argparse.Namespace, loader: object | None) -> None:
        super().__init__()
        self.args, self.outside_loader, self.trace = args, loader, []
        self.layer = torch.nn.Linear(3 * 8 * 8, 1)

    def train_dataloader(self):  # type: ignore[no-untyped-def]
        return self.outside_loader if self.outside_loader is not None else make_loader(self.args)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        self.trace.append([self.current_epoch, batch_idx, y.tolist(), round(float(x.double().sum()), 6)])
        return self.layer(x.flatten(1)).pow(2).mean()

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        out = Path(self.args.out) / f"trace-{self.global_rank}.json"
        out.write_text(json.dumps(self.trace))


class Evaluated(Traced):
    """Traced, with gpufeed loaders for validation, test and predict, recording every evaluation run."""

    def __init__(self, args: argparse.Namespace, loader: object | None) -> None:
        super().__init__(args, loader)
        self.evaluation: list[list] = []  # [stage, labels served, labels kept] per evaluation run

    def val_dataloader(self):  # type: ignore[no-untyped-def]
        return make_eval_loader("pad")

    def test_dataloader(self):  # type: ignore[no-untyped-def]
        return make_eval_loader(False)

    def predict_dataloader(self):  # type: ignore[no-untyped-def]
        return make_eval_loader(False)

    def _evaluate(self, stage: str, batch, batch_idx: int, loader) -> torch.Tensor:  # type: ignore[no-untyped-def]
        x, y = batch
        if batch_idx == 0:
            self.evaluation.append([stage, [], []])
        real = loader.real_counts[batch_idx]  # the rest of the batch repeats samples to even the ranks out
        self.evaluation[-1][1].extend(y.tolist())
        self.evaluation[-1][2].extend(y[:real].tolist())
        if stage != "predict":
            self.log(f"{stage}_real", float(real), reduce_fx="sum", sync_dist=True, on_step=False, on_epoch=True)
        return self.layer(x.flatten(1))[:real]

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        self._evaluate("val", batch, batch_idx, self.trainer.val_dataloaders)

    def test_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        self._evaluate("test", batch, batch_idx, self.trainer.test_dataloaders)

    def predict_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        return self._evaluate("predict", batch, batch_idx, self.trainer.predict_dataloaders)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--ckpt", default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=None)
    p.add_argument("--outside", action="store_true", help="build the loader before Trainer.fit")
    p.add_argument("--explicit", action="store_true", help="outside, with rank= and world_size= given")
    p.add_argument("--evaluate", action="store_true", help="validate every half epoch, then test and predict")
    p.add_argument("--fallback", action="store_true")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    loader = make_loader(args, args.devices if args.explicit else None) if args.outside else None
    every = {"every_n_train_steps": args.every, "save_on_train_epoch_end": False} if args.every else {}
    checkpoints = ModelCheckpoint(dirpath=Path(args.out) / "ckpt", save_top_k=-1, **every)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        limit_train_batches=args.limit,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **({"val_check_interval": 0.5} if args.evaluate else {}),
    )
    torch.manual_seed(0)
    model = (Evaluated if args.evaluate else Traced)(args, loader)
    trainer.fit(model, ckpt_path=args.ckpt)
    if args.evaluate:
        metrics = {"val_real": float(trainer.callback_metrics["val_real"])}
        metrics.update({k: float(v) for k, v in trainer.test(model, verbose=False)[0].items()})
        trainer.predict(model, return_predictions=False)
        record = {"evaluation": model.evaluation, "metrics": metrics}
        (Path(args.out) / f"eval-{trainer.global_rank}.json").write_text(json.dumps(record))
    if torch.distributed.is_initialized():  # gloo's threads must not outlive the interpreter (SIGABRT)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
