"""The fallback seeds each sample's global generators from (seed, epoch, index): in a DataLoader worker without saving
and restoring them (they are the worker's own; numpy's state alone took 0.12 ms a sample to save), in the caller's
process restored after each sample. The batches are the same either way."""

import random
import warnings

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

import gpufeed as gf
from gpufeed.sampling import global_seed, seed_globals


class _Shuffled:
    """A user's own random op gpufeed cannot batch, drawing from torch's, Python's and numpy's global generators."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x[torch.randperm(3)] * random.random() + float(np.random.rand())


class _Images:
    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.images = [Image.fromarray(a) for a in rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)]
        self.transform = T.Compose([T.RandomCrop(8, padding=2), T.ToTensor(), _Shuffled()])

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), i


def test_seed_globals_draws_as_global_seed_does_and_leaves_the_generators_seeded():
    with global_seed(123):
        inside = (torch.rand(2), random.random(), np.random.rand())
    seed_globals(123)
    after = (torch.rand(2), random.random(), np.random.rand())
    assert torch.equal(inside[0], after[0]) and inside[1:] == after[1:]


def test_the_fallback_s_batches_are_the_same_in_workers_and_in_the_caller_s_process_which_keeps_its_state():
    batches = {}
    for workers in (0, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = gf.accelerate(_Images(24), 8, device="cpu", seed=5, fallback="prefetch", num_workers=workers)
        assert isinstance(loader, gf.FallbackLoader)
        random.seed(7), np.random.seed(7)
        batches[workers] = [x for x, _ in loader]
        if workers == 0:  # the caller's generators as they were (torch's: the DataLoader draws its base seed there)
            drawn = (random.random(), np.random.rand())
            random.seed(7), np.random.seed(7)
            assert (random.random(), np.random.rand()) == drawn
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2], strict=True))
