"""What a loader state belongs to: the data fingerprint of every store kind, and how a difference is shown."""

import torch

from gpufeed.augment.ragged import Ragged
from gpufeed.encoded import Encoded
from gpufeed.identity import data_identity, describe, differences


def test_every_store_kind_is_fingerprinted_by_its_shape_and_sampled_bytes():
    dense = torch.arange(20 * 3 * 2 * 2).remainder(256).to(torch.uint8).view(20, 3, 2, 2)
    labels = torch.arange(20)
    base = data_identity(dense, labels)
    assert base == data_identity(dense.clone(), labels.clone())  # a copy is the same data
    assert base["images"] == "20 images of (3, 2, 2) torch.uint8"
    changed = dense.clone()
    changed[0, 0, 0, 0] += 1  # the first image is always sampled
    assert data_identity(changed, labels)["pixels"] != base["pixels"]
    assert data_identity(dense, labels.flip(0))["labels"] != base["labels"]

    ragged = Ragged.stack([torch.full((3, 1 + i % 3, 2), i, dtype=torch.uint8) for i in range(20)])
    r = data_identity(ragged, labels)
    assert r["images"] == "20 ragged images of torch.uint8" and r == data_identity(
        ragged.select(torch.arange(20)), labels
    )
    other = Ragged.stack([torch.full((3, 1 + i % 3, 2), i + (i == 19), dtype=torch.uint8) for i in range(20)])
    assert data_identity(other, labels)["pixels"] != r["pixels"]  # the last image differs: it is sampled

    data = torch.arange(60).remainder(256).to(torch.uint8)
    starts, lengths = torch.arange(0, 60, 3), torch.full((20,), 3)
    encoded = Encoded(data, starts, lengths, torch.tensor([[3, 8, 8]] * 20), torch.ones(20, dtype=torch.bool))
    e = data_identity(encoded, labels)
    assert e["images"] == "20 encoded images of torch.uint8"
    flipped = Encoded(data.flip(0), starts, lengths, encoded.shapes, encoded.jpeg)
    assert data_identity(flipped, labels)["pixels"] != e["pixels"]


def test_descriptions_drop_memory_addresses_and_long_differences_are_shown_where_they_start():
    def transform(x):
        return x

    assert describe(transform) == f"<function {transform.__qualname__}>"  # the same in every run
    long_a, long_b = "Compose([" + "Op(1), " * 30 + "Crop(32)])", "Compose([" + "Op(1), " * 30 + "Crop(28)])"
    (shown,) = differences({"transform": long_a, "views": 1}, {"transform": long_b, "views": 1})
    assert shown.startswith("saved with transform='...") and "Crop(32)" in shown and "Crop(28)" in shown
    assert len(shown) < 300
    assert differences({"mix": None}, {"mix": "MixUp(alpha=0.2)", "views": 2}) == [
        "saved with mix=None, but this loader has mix='MixUp(alpha=0.2)'"
    ]
