"""A Hugging Face training loop: a ``datasets.Dataset`` loaded from disk, a torchvision recipe applied by a
``set_transform`` function, a collate function that stacks the fields, and a loop that reads the batches as dicts
(the shape of ``transformers``' ``run_image_classification.py`` without the Trainer).

Usage: python hf_set_transform.py DATA [--variant V] [--workers N] [--epochs E]

``DATA`` is a ``save_to_disk`` folder with the columns ``image`` (Image) and ``label`` (ClassLabel). ``--variant``:
``set_transform`` (the function names the recipe as a global), ``with_transform``, ``lambda``, ``closure`` (the
recipe reaches the function through a closure cell), ``own`` (the function applies a callable of the script's own,
not a torchvision recipe). Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
import torchvision.transforms as T
from datasets import load_from_disk
from torch.utils.data import DataLoader

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--variant", default="set_transform")
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

ds = load_from_disk(args.data)
train_tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def preprocess(batch):
    batch["pixel_values"] = [train_tf(img.convert("RGB")) for img in batch["image"]]
    del batch["image"]
    return batch


def make_preprocess(tf):
    def apply(batch):
        return {"pixel_values": [tf(img.convert("RGB")) for img in batch["image"]], "label": batch["label"]}

    return apply


class Scale:
    """A recipe of the script's own: gpufeed cannot split it into cached and batched parts."""

    def __call__(self, img):
        return T.functional.to_tensor(img.resize((32, 32)))


scale = Scale()

if args.variant == "set_transform":
    ds.set_transform(preprocess)
elif args.variant == "with_transform":
    ds = ds.with_transform(preprocess)
elif args.variant == "lambda":
    ds.set_transform(
        lambda b: {"pixel_values": [train_tf(im.convert("RGB")) for im in b["image"]], "label": b["label"]}
    )
elif args.variant == "closure":
    ds.set_transform(make_preprocess(train_tf))
elif args.variant == "own":
    ds.set_transform(lambda b: {"pixel_values": [scale(im.convert("RGB")) for im in b["image"]], "label": b["label"]})


def collate_fn(examples):
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "labels": torch.tensor([e["label"] for e in examples]),
    }


loader = DataLoader(ds, batch_size=32, shuffle=True, collate_fn=collate_fn, num_workers=args.workers)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 4, 3, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
)
model(torch.zeros(1, 3, 32, 32))  # materialise the lazy layer before the optimiser sees it
model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
seen = 0
for _ in range(args.epochs):
    for batch in loader:
        x, y = batch["pixel_values"].to(device), batch["labels"].to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {seen} loss {loss.item():.6f}", flush=True)
        seen += 1
print(f"batches seen {seen}", flush=True)
