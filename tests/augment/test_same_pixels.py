"""A seed's pixels do not depend on whether a compiler runs (RELIABILITY.md, issue 45): every fused op's eager code is
the same arithmetic as its compiled code, so compiled, with ``GPUFEED_COMPILE=0``, past the limit of versions and
without a compiler, the batches are the same bits (on the CPU).

The shapes below reuse the tap counts tests/augment/test_fusion.py compiles (each tap count and each Normalize-or-not
is a compile of its own, seconds cold): (5, 7) and (4, 4) with and without Normalize, (7, 11) without; (3, 3) is this
file's own."""

import contextlib

import pytest
import torch

import gpufeed as gf
from gpufeed.augment import (
    ColorJitter,
    Compose,
    Normalize,
    RandAugment,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    TrivialAugmentWide,
    fusion,
    taps,
)
from gpufeed.augment.paths import device_path

pytestmark = pytest.mark.filterwarnings("error:gpufeed could not compile")

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.25)


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setenv("GPUFEED_COMPILE", "1")  # the rest of the suite runs the eager ops (tests/conftest.py)
    monkeypatch.setattr(fusion, "_FAILED", {})


def _tail(flips: bool, normalize: bool) -> list:
    return [RandomHorizontalFlip(), RandomVerticalFlip()] * flips + [Normalize(MEAN, STD)] * normalize


# (batch, height, width) -> output, interpolation, antialias, flips, Normalize: growing and shrinking, both
# interpolations, antialias on and off, the tail folded into the resize or not
RESIZES = {
    "shrink-bilinear-antialias-tail": ((5, 37, 50), (24, 20), "bilinear", True, True, True),  # taps (5, 7)
    "grow-bicubic-tail": ((4, 30, 30), (45, 40), "bicubic", False, True, True),  # (4, 4)
    "grow-bicubic-alone": ((4, 30, 30), (45, 40), "bicubic", False, False, False),  # (4, 4), uint8 out
    "grow-bilinear-antialias-tail": ((6, 16, 16), (24, 20), "bilinear", True, True, True),  # (3, 3)
    "shrink-bilinear-plain-tail": ((5, 37, 50), (24, 20), "bilinear", False, False, True),  # (3, 3)
    "shrink-bicubic-antialias-flips": ((24, 30, 26), (20, 12), "bicubic", True, True, False),  # (7, 11)
}


def _both(recipe, x: torch.Tensor, seed: int, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe on ``x`` compiled (its fused op has run compiled: counted), then with GPUFEED_COMPILE=0."""
    with fusion.foreground():  # compiled at this call, not in the background
        recipe(x, generator=torch.Generator().manual_seed(seed + 100))
    ours = recipe(x, generator=torch.Generator().manual_seed(seed))
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    eager = recipe(x, generator=torch.Generator().manual_seed(seed))
    monkeypatch.setenv("GPUFEED_COMPILE", "1")
    return ours, eager


@pytest.mark.parametrize("case", RESIZES, ids=str)
def test_the_resize_gives_the_same_pixels_compiled_and_not(compiled, monkeypatch, case):
    shape, out, mode, antialias, flips, normalize = RESIZES[case]
    x = torch.randint(0, 256, (shape[0], 3, *shape[1:]), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    x[0, :, :, : shape[2] // 3] = 255  # white: bicubic overshoots and clamps
    recipe = Compose([RandomResizedCrop(out, interpolation=mode, antialias=antialias), *_tail(flips, normalize)])
    calls = []
    fused = taps._fused_taps
    monkeypatch.setattr(taps, "_fused_taps", lambda *a: (fused(*a), calls.append(1))[0])  # counted when it returned
    ours, eager = _both(recipe, x, 1, monkeypatch)
    assert ours.dtype == (torch.float32 if normalize else torch.uint8)
    assert torch.equal(ours, eager)
    assert len(calls) == 2  # both runs compiled (GPUFEED_COMPILE=0: not called)


# the loaders' epochs, compiled (in the foreground: at construction) and with GPUFEED_COMPILE=0; the moves and the
# auto-augment colour ops compile on the device's path (a GPU's), here on the CPU
LOADERS = {
    "colorjitter": (
        lambda: [ColorJitter(0.4, 0.4), RandomCrop(16, padding=2), RandomHorizontalFlip(), Normalize(MEAN, STD)],
        (16, 16),
        False,
    ),  # fmt: skip
    "resize": (lambda: [RandomResizedCrop((24, 16)), RandomHorizontalFlip(), Normalize(MEAN, STD)], (40, 36), False),
    "moves": (lambda: [RandomCrop(20, padding=2), RandomHorizontalFlip()], (24, 24), True),
    "trivialaugment": (lambda: [TrivialAugmentWide()], (32, 32), True),
    "randaugment": (lambda: [RandAugment(), RandomCrop(28, padding=2)], (32, 32), True),
}


@pytest.mark.parametrize("name", LOADERS)
def test_a_loaders_epoch_is_the_same_compiled_and_not(compiled, monkeypatch, name):
    ops, side, on_device_path = LOADERS[name]
    images = torch.randint(0, 256, (40, 3, *side), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))

    def epoch() -> tuple[list[torch.Tensor], str | None]:
        with device_path() if on_device_path else contextlib.nullcontext():
            loader = gf.DeviceLoader(images, torch.arange(40), 16, transform=Compose(ops()), device="cpu", seed=3)
            return [x for x, _ in loader], loader.compile_note

    with fusion.foreground():
        ours, note = epoch()
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    theirs, none = epoch()
    assert "compiled" in note and none is None
    assert len(ours) == 3 and all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
