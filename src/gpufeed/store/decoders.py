"""The image decoders gpufeed calls: TorchCodec's where it is installed, torchvision.io's otherwise.

torchvision 0.29 deprecates its image decoders in favour of TorchCodec's and warns on every call;
a training run that decodes on threads or in workers printed that ``DeprecationWarning`` dozens of
times. So:

- with ``torchcodec`` installed (``pip install gpufeed[torchcodec]``), JPEGs decode with its
  ``decode_jpeg`` (libjpeg-turbo on the CPU, nvJPEG on a GPU, batched), and 8-bit PNGs and still
  WebPs with its ``decode_png`` / ``decode_webp``. It needs no system FFmpeg for images. Measured:
  the same pixels as ``PIL.Image.open(f).convert("RGB")`` for baseline, progressive, grayscale and
  CMYK JPEGs, PNGs (RGB, gray, palette, alpha) and WebPs (tests/test_decoders.py). TorchCodec
  turns an image upright by its EXIF orientation, which ``ImageFolder``'s loader does not: such
  files go to PIL;
- without it, torchvision.io decodes JPEGs (the same libjpeg-turbo, the same pixels) and its
  deprecation warning is filtered by its message only, never shown to users;
- whatever neither reads as PIL would (16-bit PNGs, animated WebPs, GIFs, ...) returns ``None``
  here, and the caller decodes it with PIL, as the user's own loader does.

A TorchCodec that is installed but cannot load (built for another torch) is reported once by a
warning that names the error, and torchvision.io is used.
"""

from __future__ import annotations

import functools
import re
import threading
import warnings
from typing import Any

import torch

__all__ = ["backend", "decode_jpeg", "decode_jpegs", "decode_still", "warn_once"]

# torchvision.io's message (0.29): only this warning is filtered, nothing else of torchvision's.
_TORCHVISION_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@functools.cache
def _torchcodec() -> Any | None:
    """``torchcodec.decoders``, or ``None`` where it is not installed or cannot load (said once)."""
    import importlib.util

    if importlib.util.find_spec("torchcodec") is None:
        return None
    try:
        import torchcodec.decoders as decoders

        decoders.decode_jpeg  # noqa: B018  (an old torchcodec without the image decoders fails here)
    except Exception as e:  # a build for another torch fails as it loads its library: OSError, RuntimeError, ...
        warnings.warn(
            f"gpufeed: torchcodec is installed but cannot be used ({type(e).__name__}: {e}); images decode with "
            "torchvision.io instead. Install the torchcodec that matches your torch to use it",
            stacklevel=3,
        )
        return None
    return decoders


def backend() -> str:
    """``"torchcodec"`` or ``"torchvision"``: which library decodes JPEGs here.

    Example:
        >>> backend() in ("torchcodec", "torchvision")
        True
    """
    return "torchcodec" if _torchcodec() is not None else "torchvision"


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Warn ``message`` the first time ``key`` comes up in this process (the decoders run per chunk, on threads)."""
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, stacklevel=3)


def _quiet_torchvision() -> None:
    """Filter torchvision.io's deprecation warning, by its message alone.

    ``warnings.catch_warnings`` is not thread-safe (it swaps the process's filters, and the decoders run on
    threads), so a filter is added to the process's list instead: checked on every call, since a
    ``catch_warnings`` block elsewhere (pytest runs each test in one) restores the list without it.
    """
    for action, message, category, _, _ in warnings.filters:
        if (
            action == "ignore"
            and category is DeprecationWarning
            and message is not None
            and message.pattern == re.escape(_TORCHVISION_DEPRECATION)
        ):
            return
    warnings.filterwarnings("ignore", message=re.escape(_TORCHVISION_DEPRECATION), category=DeprecationWarning)


def decode_jpeg(data: torch.Tensor) -> torch.Tensor | None:
    """One JPEG (its bytes, a 1-D uint8 CPU tensor) decoded to RGB on the CPU, as ``(C, H, W)`` uint8; ``None``
    for a file PIL must decode (see :func:`decode_jpegs`).

    Raises RuntimeError for a file the decoder refuses (the caller then tries PIL).
    """
    codec = _torchcodec()
    if codec is not None:
        return None if _rotated_jpeg(data) else codec.decode_jpeg(data, mode="RGB")
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as tv_decode

    _quiet_torchvision()
    return tv_decode(data, mode=ImageReadMode.RGB)  # (torchvision applies no EXIF orientation by default)


def decode_jpegs(files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """JPEGs decoded to RGB on ``device`` in one batched call (nvJPEG on a GPU), each ``(C, H, W)`` uint8.

    ``None`` in place of a JPEG that carries an EXIF orientation: TorchCodec turns it upright, which
    ``ImageFolder``'s loader does not, so PIL decodes it. Raises RuntimeError when the decoder refuses any
    of them (the caller then decodes them one by one).
    """
    codec = _torchcodec()
    if codec is not None:
        upright = [i for i, f in enumerate(files) if not _rotated_jpeg(f)]
        out: list[torch.Tensor | None] = [None] * len(files)
        if upright:
            images = codec.decode_jpeg([files[i] for i in upright], mode="RGB", device=device)
            for i, image in zip(upright, images, strict=True):
                out[i] = image
        return out
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as tv_decode

    _quiet_torchvision()
    return list(tv_decode(files, mode=ImageReadMode.RGB, device=device))


def _rotated_jpeg(data: torch.Tensor) -> bool:
    """Whether a JPEG's EXIF orientation asks for a rotation or a flip (its APP segments come first)."""
    # read in place: a copy of the first 128 KiB (the whole file, often) cost 17 us an image under the GIL
    return _jpeg_orientation(data[: 1 << 17].numpy().data) not in (0, 1)


def _jpeg_orientation(data: bytes | memoryview) -> int:
    """The EXIF orientation tag (1: as stored) of a JPEG, read from its APP1 segment; 1 when it has none."""
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: the metadata is behind
            break
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\x00\x00":
            return _tiff_orientation(bytes(data[i + 10 : i + 2 + length]))
        i += 2 + length
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = int.from_bytes(tiff[4:8], order)  # type: ignore[arg-type]
    count = int.from_bytes(tiff[ifd : ifd + 2], order) if ifd + 2 <= len(tiff) else 0  # type: ignore[arg-type]
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(tiff):
            break
        if int.from_bytes(tiff[entry : entry + 2], order) == 0x0112:  # type: ignore[arg-type]
            return int.from_bytes(tiff[entry + 8 : entry + 10], order)  # type: ignore[arg-type]
    return 1


def _png_is_8_bit(data: bytes) -> bool:
    # IHDR is the first chunk: signature (8), length (4), "IHDR" (4), width (4), height (4), bit depth (1).
    return len(data) > 24 and data[12:16] == b"IHDR" and data[24] <= 8


def decode_still(data: torch.Tensor) -> torch.Tensor | None:
    """A PNG or a still WebP decoded to RGB on the CPU as ``(C, H, W)`` uint8 by TorchCodec; ``None`` for
    anything else, or without TorchCodec: the caller decodes it with PIL.

    16-bit PNGs are left to PIL: TorchCodec scales them to 8 bits, PIL keeps the high byte (or clips a
    16-bit gray image); the user's loader gets PIL's values.
    """
    codec = _torchcodec()
    if codec is None:
        return None
    head = bytes(data[:32].numpy())
    try:
        # EXIF (PNG's eXIf chunk, WebP's flag in VP8X): TorchCodec would apply its orientation, the loader does not.
        if head.startswith(_PNG_MAGIC) and _png_is_8_bit(head) and b"eXIf" not in bytes(data.numpy()):
            return codec.decode_png(data, mode="RGB")
        exif = head[12:16] == b"VP8X" and len(head) > 20 and head[20] & 0x08
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and not exif:
            image = codec.decode_webp(data, mode="RGB")
            return image if image.dim() == 3 else None  # animated: PIL's first frame, by PIL
    except RuntimeError:  # a damaged file: PIL decides, as the user's loader would
        return None
    return None
