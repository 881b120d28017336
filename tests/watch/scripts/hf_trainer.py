"""The shape of ``transformers``' ``examples/pytorch/image-classification/run_image_classification.py``: a
``datasets`` image dataset, a torchvision recipe applied by a ``set_transform`` function, a ``collate_fn`` that
stacks ``pixel_values`` and ``labels``, a model from a config, and ``Trainer(...).train()`` (whose training loader
``Trainer.get_train_dataloader`` builds and Accelerate prepares: ``batch_size=None``, a batch sampler).

Usage: python hf_trainer.py DATA [--max-steps N] [--batch-size B]

``DATA`` is a ``save_to_disk`` folder with the columns ``image`` (Image) and ``label`` (ClassLabel). Prints ``step K
loss L`` per training step (a callback) and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
from datasets import load_from_disk
from torchvision.transforms import Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop, ToTensor
from transformers import ResNetConfig, ResNetForImageClassification, Trainer, TrainerCallback, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--max-steps", type=int, default=16)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--output-dir", default=None)


class Printed(TrainerCallback):
    """The script's own log line per step (what a diagnosed run must leave unchanged)."""

    def __init__(self) -> None:
        self.seen = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"step {self.seen} loss {float(logs['loss']):.6f}", flush=True)
            self.seen += 1


def main() -> None:
    args = parser.parse_args()
    torch.manual_seed(0)
    dataset = load_from_disk(args.data)
    labels = dataset.features["label"].names
    config = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8], depths=[1], num_labels=len(labels), layer_type="basic"
    )
    model = ResNetForImageClassification(config)
    size = 32
    normalize = Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    _train_transforms = Compose([RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(), normalize])

    def train_transforms(example_batch):
        """Apply _train_transforms across a batch."""
        example_batch["pixel_values"] = [
            _train_transforms(pil_img.convert("RGB")) for pil_img in example_batch["image"]
        ]
        return example_batch

    dataset.set_transform(train_transforms)

    def collate_fn(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example["label"] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    training_args = TrainingArguments(
        output_dir=args.output_dir or "hf-trainer-out",
        per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps,
        learning_rate=0.01,
        remove_unused_columns=False,  # the example's: set_transform reads the image column
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    printed = Printed()
    trainer = Trainer(
        model=model, args=training_args, train_dataset=dataset, data_collator=collate_fn, callbacks=[printed]
    )
    trainer.train()
    print(f"batches seen {printed.seen}", flush=True)


if __name__ == "__main__":
    main()
