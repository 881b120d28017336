"""Images of 1, 2 and 4 channels (L, LA, RGBA; 3 as everywhere else): each colour op runs as torchvision runs it,
or is refused up front where torchvision raises, naming the op, the channel count and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
import torchvision.transforms.v2 as v2
from PIL import Image
from torch.utils.data import Dataset

import gpufeed as gf
from gpufeed import augment as A
from gpufeed.errors import ConfigError, UnsupportedTransformError
from gpufeed.loading.fallback import FallbackLoader
from gpufeed.pipeline.translate import PIL_BOUNDS

from stats import gen

MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
N = 4


class Images(Dataset):
    """``(image, 0)``: random 12x10 PIL images of a mode, or uint8 (C, H, W) tensors of as many channels."""

    def __init__(self, channels: int, tensor: bool = False, transform=None):
        rng = np.random.default_rng(channels)
        self.arrays = [rng.integers(0, 256, (12, 10, channels), dtype=np.uint8) for _ in range(N)]
        self.channels, self.tensor, self.transform = channels, tensor, transform

    def __len__(self) -> int:
        return N

    def raw(self, i: int):
        a = self.arrays[i]
        if self.tensor:
            return torch.from_numpy(a).permute(2, 0, 1).contiguous()
        return Image.fromarray(a[..., 0] if self.channels == 1 else a, MODES[self.channels])

    def __getitem__(self, i: int):
        image = self.raw(i)
        return (self.transform(image) if self.transform is not None else image), 0


def _ops(m):
    """Each op at settings where torchvision calls its kernel on every sample (p=1, fixed factors where they
    would otherwise be drawn), so that its output is one image to compare with."""
    return {
        "brightness": m.ColorJitter(brightness=(1.3, 1.3)),
        "contrast": m.ColorJitter(contrast=(0.6, 0.6)),
        "saturation": m.ColorJitter(saturation=(0.4, 0.4)),
        "hue": m.ColorJitter(hue=(0.2, 0.2)),
        "jitter": m.ColorJitter(0.4, 0.4, 0.4, 0.1),
        "RandomGrayscale": m.RandomGrayscale(p=1.0),
        # batched, after a random op (before one it is cached: torchvision's own)
        "Grayscale": m.Compose([m.RandomHorizontalFlip(p=1.0), m.Grayscale()]),
        "RandomAdjustSharpness": m.RandomAdjustSharpness(2.0, p=1.0),
        "RandomAutocontrast": m.RandomAutocontrast(p=1.0),
        "RandomEqualize": m.RandomEqualize(p=1.0),
        "RandomSolarize": m.RandomSolarize(128, p=1.0),
        "RandomPosterize": m.RandomPosterize(3, p=1.0),
        "TrivialAugmentWide": m.TrivialAugmentWide(),
        "RandAugment": m.RandAugment(),
        "AutoAugment": m.AutoAugment(),
        "AugMix": m.AugMix(),
    }


_COLOUR = ("brightness", "contrast", "saturation", "hue", "jitter", "RandomAdjustSharpness")
_PER_CHANNEL_V2 = ("RandomEqualize", "RandomSolarize", "RandomPosterize")
# Where torchvision (0.29, Pillow 13) runs each op on 2- and 4-channel images; 1 and 3 channels run everywhere.
RUNS_WITH_ALPHA = {
    "PIL": (*_COLOUR, "Grayscale"),  # ImageEnhance and convert("L") take LA and RGBA; ImageOps does not
    "v1 tensor": (),  # every colour kernel: 'permitted channel values are [1, 3]'
    "v2 tensor": _PER_CHANNEL_V2,  # channel by channel, alpha as any other
}


def _said(place: str, name: str, channels: int) -> str:
    """torchvision's (or Pillow's) words for the refusal, which the message quotes."""
    if place == "PIL":
        if name == "RandomGrayscale":
            return "num_output_channels"
        return f"found {channels}" if name == "AugMix" else f"not supported for mode {MODES[channels]}"
    if place == "v1 tensor":
        return f"permitted channel values are [1, 3], but found {channels}"
    if name == "RandomGrayscale":
        return "num_output_channels must be 1 or 3"
    return "values to unpack" if name == "Grayscale" else f"found {channels}"


def _case(lib: str, source: str):
    m = T if lib == "v1" else v2
    tensor = source == "tensor"
    place = "PIL" if not tensor else f"{lib} tensor"
    tail = [] if tensor else [T.PILToTensor() if lib == "v1" else v2.ToImage()]
    return m, tensor, place, tail


def _torchvision_raises(op, images) -> bool:
    """Whether torchvision raises on any of the images under any of 40 seeds (the auto-augment family raises only
    for the ops some draws pick)."""
    for image in images:
        for seed in range(40):
            torch.manual_seed(seed)
            try:
                op(image)
            except (TypeError, ValueError, OSError):
                return True
    return False


def _loader(ds, transform, **kw):
    return gf.accelerate(
        ds, batch_size=N, shuffle=False, device="cpu", transform=transform, progress=False, cache=False, **kw
    )


@pytest.mark.parametrize("name", list(_ops(T)))
@pytest.mark.parametrize("channels", [1, 2, 4])
@pytest.mark.parametrize(("lib", "source"), [("v1", "PIL"), ("v2", "PIL"), ("v1", "tensor"), ("v2", "tensor")])
def test_each_op_runs_or_is_refused_up_front_as_torchvision_decides(lib, source, channels, name):
    m, tensor, place, tail = _case(lib, source)
    ds = Images(channels, tensor)
    op = _ops(m)[name]
    runs = channels == 1 or name in RUNS_WITH_ALPHA[place]
    assert _torchvision_raises(op, [ds.raw(i) for i in range(N)]) is not runs  # the table is torchvision's
    transform = m.Compose([op, *tail])
    if runs:
        x, _ = next(iter(_loader(ds, transform)))
        assert x.shape[0] == N
        return
    for fallback in ("error", "prefetch"):  # the per-sample pipeline would raise too: no fallback for it
        with pytest.raises(ConfigError, match="torchvision refuses it") as raised:
            _loader(ds, transform, fallback=fallback)
        message = str(raised.value)
        assert not isinstance(raised.value, UnsupportedTransformError)
        refused = op.transforms[-1] if name == "Grayscale" else op
        assert message.startswith(repr(refused)) and f"{channels} channels" in message
        fix = f"image.convert({'RGB' if channels == 4 else 'L'!r})" if not tensor else f"image[:{channels - 1}]"
        assert fix in message and _said(place, name, channels) in message


def _exact(name: str, place: str) -> bool:
    """Where gpufeed's kernel is torchvision's exactly: its tensor kernels, and on PIL images brightness and
    sharpness (ImageEnhance's blend computes as the tensor kernel); PIL's other kernels differ within
    :data:`PIL_BOUNDS` (rounding), as on RGB images."""
    return place != "PIL" or name in ("brightness", "RandomAdjustSharpness")


_RUNNING = [  # the cases torchvision runs (the others are refused: the test above)
    (lib, source, channels, name)
    for lib, source, place in (("v1", "PIL", "PIL"), ("v2", "PIL", "PIL"), ("v2", "tensor", "v2 tensor"))
    for channels in (1, 2, 4)
    for name in ("brightness", "contrast", "saturation", "hue", "Grayscale", "RandomAdjustSharpness", *_PER_CHANNEL_V2)
    if channels == 1 or name in RUNS_WITH_ALPHA[place]
]


@pytest.mark.parametrize(("lib", "source", "channels", "name"), _RUNNING)
def test_the_batched_pixels_are_torchvisions_alpha_included(lib, source, channels, name):
    m, tensor, place, tail = _case(lib, source)
    transform = m.Compose([_ops(m)[name], *tail])
    ds = Images(channels, tensor)
    got, _ = next(iter(_loader(ds, transform)))
    want = torch.stack([torch.as_tensor(transform(ds.raw(i))) for i in range(N)])
    assert got.shape == want.shape and got.dtype == want.dtype
    if _exact(name, place):
        assert torch.equal(got, want)
        return
    colour = want.shape[1] - (1 if want.shape[1] in (2, 4) else 0)
    if colour < want.shape[1]:  # alpha: kept, or opaque after hue (PIL's HSV round trip), exactly
        assert torch.equal(got[:, colour:], want[:, colour:])
    bound = {"Grayscale": 1, "RandomAutocontrast": 1}.get(name, PIL_BOUNDS.get(name, 0))
    assert (got[:, :colour].int() - want[:, :colour].int()).abs().max() <= bound


@pytest.mark.parametrize("channels", [2, 4])
def test_colorjitter_on_alpha_images_jitters_the_colour_as_alone_and_keeps_alpha_unless_hue(device, channels):
    x = torch.randint(0, 256, (32, channels, 12, 10), dtype=torch.uint8, generator=gen(1)).to(device)
    for op, alpha in ((A.ColorJitter(0.4, 0.4, 0.4), x[:, -1:]), (A.ColorJitter(0.4, 0.4, 0.4, 0.1), 255)):
        params = op.sample(x, gen(2, device))
        out = op.apply(x, params)
        assert torch.equal(out[:, :-1], op.apply(x[:, :-1].contiguous(), params))
        assert torch.equal(
            out[:, -1:], torch.broadcast_to(torch.as_tensor(alpha, dtype=torch.uint8), out[:, -1:].shape)
        )
        for i in range(4):  # torchvision on the PIL image, in the drawn order: the same alpha
            img = Image.fromarray(x[i].permute(1, 2, 0).numpy(), MODES[channels])
            for j in params["order"][i].tolist():
                if params["factors"][j] is not None:
                    kernel = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)[j]
                    img = kernel(img, float(params["factors"][j][i]))
            assert torch.equal(TF.pil_to_tensor(img)[-1], out[i, -1].cpu())


def test_a_rare_coin_is_refused_all_the_same_and_the_batched_op_refuses_before_its_coin():
    ds = Images(4)
    with pytest.raises(ConfigError, match="RandomGrayscale.*RGBA"):
        _loader(ds, T.Compose([T.RandomApply([T.RandomGrayscale(p=0.01)], p=0.01), T.ToTensor()]))
    x = torch.zeros(3, 4, 5, 5, dtype=torch.uint8)
    with pytest.raises(ConfigError, match="RandomGrayscale on 4-channel images: torchvision refuses it"):
        A.RandomGrayscale(p=0.0)(x, generator=gen())
    with pytest.raises(ConfigError, match="1 or 3 channels, or 2 or 4 with alpha.*5 channels"):
        A.ColorJitter(0.4)(torch.zeros(2, 5, 4, 4, dtype=torch.uint8), generator=gen())


def test_the_named_fix_runs_and_gives_torchvisions_images():
    convert = T.Lambda(lambda im: im.convert("RGB"))
    transform = T.Compose([convert, T.RandomEqualize(p=1.0), T.PILToTensor()])
    ds = Images(4)
    got, _ = next(iter(_loader(ds, transform, cache_lambda=True)))
    assert torch.equal(got, torch.stack([transform(ds.raw(i)) for i in range(N)]))


def test_rgba_colorjitter_is_batched_with_or_without_the_fallback_asked_for():
    transform = T.Compose([T.ColorJitter(brightness=(0.7, 0.7)), T.PILToTensor()])
    ds = Images(4)
    want = torch.stack([transform(ds.raw(i)) for i in range(N)])
    for fallback in ("error", "prefetch"):
        loader = _loader(ds, transform, fallback=fallback)
        assert loader.plan.storage != "fallback"
        assert torch.equal(next(iter(loader))[0], want)


def test_a_batched_op_that_fails_on_the_probed_samples_takes_the_fallback_when_asked(monkeypatch):
    def broken(self, x, params):
        raise ValueError("not enough values to unpack")

    monkeypatch.setattr(A.ColorJitter, "apply", broken)
    transform = T.Compose([T.ColorJitter(brightness=(0.7, 0.7)), T.PILToTensor()])
    ds = Images(3)
    with pytest.raises(UnsupportedTransformError, match="raised ValueError .*fallback='prefetch'"):
        _loader(ds, transform)
    with pytest.warns(UserWarning, match="falls back"):
        loader = _loader(ds, transform, fallback="prefetch", num_workers=0)
    assert isinstance(loader, FallbackLoader)
    assert torch.equal(next(iter(loader))[0], torch.stack([transform(ds.raw(i)) for i in range(N)]))
