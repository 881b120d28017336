"""benchmarks/launches.py: the count of kernel-launching operators on the device's code path, and peers.py's
recipes, which must be the same recipe three ways for its ratios to mean anything."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from launches import count, recipes  # noqa: E402


def test_views_allocations_and_metadata_are_free_and_a_scalar_read_is_a_host_read():
    def op(x, generator):
        y = torch.empty_like(x).copy_(x).view(-1)  # an allocation, one copy, a view
        assert y.shape[0] == x.numel()
        if bool((y > 300).any()):  # a comparison, a reduction and a host read
            return y
        return (y + 1).reshape(x.shape)  # one add

    c = count(op, torch.zeros(2, 3, dtype=torch.int32))
    assert dict(c.ops) == {"copy_": 1, "gt": 1, "any": 1, "add": 1} and c.total == 4 and c.host_reads == 1


def test_the_device_path_is_what_is_counted():
    x = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    jitter = recipes(16)["ColorJitter(0.4,0.4,0.4,0.1)+crop+flip+normalise"]
    c = count(jitter, x)
    # on the device path each of the 4 slots runs the 4 adjustments on the whole batch: a fixed count per batch,
    # no host read (the host path's sample subsets read each subset's size)
    assert c.host_reads == 0 and c.total == count(jitter, x, seed=5).total > 100
    assert c.ops["where"] >= 16  # each slot keeps each adjustment's samples by mask


def test_peers_recipes_are_the_same_ops_in_torchvision_and_gpufeed():
    from peers import RECIPES, gpufeed_recipe, torchvision_recipe

    for name in RECIPES:
        ours = [type(t).__name__ for t in gpufeed_recipe(name, 32).transforms]
        theirs = [type(t).__name__ for t in torchvision_recipe(name, 32).transforms if type(t).__name__ != "ToTensor"]
        assert ours == theirs, name
