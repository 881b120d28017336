"""Images with an alpha channel (LA: 2 channels, RGBA: 4): what torchvision's colour ops do with them, and how the
batched ops follow.

torchvision decides by where an op runs (measured with torchvision 0.29 and Pillow 13 on 1-4 channel images):

- on a PIL image (v1 and v2 call the same PIL kernels), ``ImageEnhance`` adjusts the colour channels and puts
  the alpha back: ColorJitter's brightness, contrast and saturation and RandomAdjustSharpness keep alpha as it
  is; hue goes through PIL's HSV mode, which has no alpha, so the image comes back opaque (alpha 255);
  Grayscale converts to "L" (alpha dropped). ``ImageOps`` refuses these modes ("not supported for mode RGBA"):
  autocontrast, equalize, solarize, posterize, invert, and the auto-augment family on every sample that draws
  one of them; RandomGrayscale asks for as many output channels as the image has, and raises;
- on a tensor, v1 takes 1 or 3 channels only, for every colour op; v2 runs equalize, solarize, posterize and
  invert channel by channel (alpha included, as any channel) and refuses the others.

The batched ops take a 2- or 4-channel batch as PIL does (:func:`split_alpha`): a pipeline where torchvision
refuses never reaches them, since :func:`refusal_words` names what it refuses and the probe raises it first.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["ALPHA_CHANNELS", "fix_words", "join_alpha", "opaque", "refusal_words", "split_alpha"]

ALPHA_CHANNELS = (2, 4)  # LA and RGBA: the last channel is alpha

_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def split_alpha(x: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A batch's colour channels and its alpha (``None`` for 1 or 3 channels); other counts are refused."""
    c = x.shape[1]
    if c in ALPHA_CHANNELS:
        return x[:, :-1], x[:, -1:]
    if c in (1, 3):
        return x, None
    raise ConfigError(
        f"{op} takes images of 1 or 3 channels, or 2 or 4 with alpha (LA, RGBA); this batch has {c} channels"
    )


def join_alpha(colour: torch.Tensor, alpha: torch.Tensor | None) -> torch.Tensor:
    """The colour channels with the alpha put back (as ``ImageEnhance`` does), or alone without one."""
    return colour if alpha is None else torch.cat((colour, alpha), dim=1)


def opaque(alpha: torch.Tensor) -> torch.Tensor:
    """A fully opaque alpha, as PIL's HSV round trip leaves an image (255, or 1.0 in a float batch)."""
    return torch.full_like(alpha, 255 if alpha.dtype == torch.uint8 else 1.0)


# The ops whose PIL kernel is Pillow's ImageOps, which takes "L" and "RGB" only.
_IMAGE_OPS = ("RandomAutocontrast", "RandomEqualize", "RandomSolarize", "RandomPosterize", "RandomInvert")
_AUTO = ("TrivialAugmentWide", "RandAugment", "AutoAugment")
# What each place's kernels say, in torchvision's (or Pillow's) own words; {c} is the channel count.
_V1_TENSOR = "TypeError: 'Input image tensor permitted channel values are [1, 3], but found {c}'"
_V2_TENSOR = "TypeError: 'Input image tensor permitted channel values are 1 or 3, but found {c}'"


def _enabled(name: str, op: Any) -> bool:
    """Whether the op ever calls a kernel: a coin with p=0, or a ColorJitter with nothing to jitter, never does."""
    if name == "ColorJitter":
        return any(getattr(op, k, None) is not None for k in ("brightness", "contrast", "saturation", "hue"))
    return float(getattr(op, "p", 1.0)) > 0


def refusal_words(name: str | None, op: Any, channels: int, pil: bool, v2: bool) -> str | None:
    """What torchvision raises for ``op`` (named ``name``) on images of ``channels`` channels at its place in the
    pipeline (a PIL image, or a tensor), or ``None`` where it runs. Only 2 and 4 channels are ever refused.

    Example:
        >>> import torchvision.transforms as T
        >>> refusal_words("RandomEqualize", T.RandomEqualize(), 4, pil=True, v2=False)
        "OSError: 'not supported for mode RGBA' (Pillow's ImageOps)"
        >>> refusal_words("ColorJitter", T.ColorJitter(0.4), 4, pil=True, v2=False) is None
        True
    """
    if channels not in ALPHA_CHANNELS or name is None or not _enabled(name, op):
        return None
    mode = _MODES[channels]
    if pil:
        if name in _IMAGE_OPS:
            return f"OSError: 'not supported for mode {mode}' (Pillow's ImageOps)"
        if name == "RandomGrayscale":
            return (
                f"ValueError: 'num_output_channels must be 1 or 3, got {channels}.'"
                if v2
                else "ValueError: 'num_output_channels should be either 1 or 3'"
            )
        if name in _AUTO:
            return (
                f"OSError: 'not supported for mode {mode}' on every sample that draws AutoContrast, Equalize, "
                "Solarize, Posterize or Invert (Pillow's ImageOps)"
            )
        if name == "AugMix":  # it turns a PIL image into a tensor and runs the tensor kernels
            return (
                f"TypeError: 'Input image tensor can have 1 or 3 channels, but found {channels}'"
                if v2
                else _V1_TENSOR.format(c=channels)
            )
        return None  # ColorJitter, RandomAdjustSharpness, Grayscale: ImageEnhance and convert() take alpha
    if not v2:
        colour = ("ColorJitter", "RandomAdjustSharpness", "RandomGrayscale", "Grayscale", *_IMAGE_OPS, *_AUTO)
        return _V1_TENSOR.format(c=channels) if name in (*colour, "AugMix") else None
    if name in ("ColorJitter", "RandomAutocontrast"):
        return _V2_TENSOR.format(c=channels)
    if name == "RandomAdjustSharpness":
        return f"TypeError: 'Input image tensor can have 1 or 3 channels, but found {channels}'"
    if name == "RandomGrayscale":
        return f"ValueError: 'num_output_channels must be 1 or 3, got {channels}.'"
    if name == "Grayscale":
        unpack = "too many values to unpack (expected 3)" if channels == 4 else "not enough values to unpack"
        return f"ValueError: '{unpack}'"
    if name in _AUTO:
        return (
            f"{_V2_TENSOR.format(c=channels)} on every sample that draws Brightness, Color, Contrast, Sharpness or "
            "AutoContrast"
        )
    if name == "AugMix":
        return _V2_TENSOR.format(c=channels)
    return None  # v2's equalize, solarize, posterize and invert run channel by channel, alpha as any channel


def fix_words(channels: int, pil_source: bool) -> str:
    """How to give the pipeline images without alpha: in the dataset, or as the transform's first (cached) op."""
    if pil_source:
        to = "RGB" if channels == 4 else "L"
        return (
            f"the images are {_MODES[channels]} ({channels} channels): convert them in the dataset "
            f"(image.convert({to!r})), or start the transform with T.Lambda(lambda im: im.convert({to!r})) and pass "
            "cache_lambda=True (computed once, cached)"
        )
    keep = "3" if channels == 4 else "1"
    return (
        f"the images have {channels} channels (the last one alpha): drop it in the dataset (image[:{keep}]), or "
        f"start the transform with T.Lambda(lambda t: t[:{keep}]) and pass cache_lambda=True (computed once, cached)"
    )
