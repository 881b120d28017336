"""gpufeed.store.decoders: TorchCodec where installed, torchvision.io otherwise; PIL's pixels either way, and never
torchvision's deprecation warning."""

import io
import warnings

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import pil_loader
from torchvision.transforms.functional import pil_to_tensor

import gpufeed as gf
from gpufeed.read.files import read_files
from gpufeed.store import decoders
from gpufeed.store.encoded import decode

from fakes import PHOTO_KINDS

HAS_TORCHCODEC = decoders._torchcodec() is not None
BACKENDS = [
    pytest.param("torchcodec", marks=pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec is not installed")),
    "torchvision",
]

KINDS = PHOTO_KINDS


@pytest.fixture
def use(monkeypatch):
    """Select the backend: ``use("torchvision")`` hides TorchCodec as if it were not installed."""

    def select(name: str) -> None:
        if name == "torchvision":
            monkeypatch.setattr(decoders, "_torchcodec", lambda: None)
        assert decoders.backend() == name

    return select


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(xx / (7 + c) + yy / (11 + 2 * c) + seed) for c in range(3)], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def _image(mode: str, h: int, w: int, seed: int) -> Image.Image:
    pixels = _photo(h, w, seed)
    if mode == "I;16":  # a 16-bit gray PNG: PIL clips it to 255 in convert("RGB"); the loader's values are those
        return Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)
    if mode == "RGBA":  # a real alpha channel: convert("RGB") drops it, nothing composited
        alpha = np.random.default_rng(seed).integers(0, 256, (h, w, 1), dtype=np.uint8)
        return Image.fromarray(np.concatenate([pixels, alpha], -1), "RGBA")
    return Image.fromarray(pixels).convert(mode)


def _folder(root):
    for k, (name, mode, fmt, options) in enumerate(KINDS):
        folder = root / f"class{k % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        _image(mode, 37 + 5 * k, 50 + 3 * k, k).save(folder / name, format=fmt, **options)
    return root


@pytest.mark.parametrize("name", BACKENDS)
def test_every_kind_of_file_decodes_to_pil_s_pixels_with_either_backend(tmp_path, use, name):
    use(name)
    ds = ImageFolder(str(_folder(tmp_path)))
    encoded, _ = read_files(ds, progress=False)
    images = decode(encoded, torch.device("cpu"), threads=2)
    for i, (path, _) in enumerate(ds.samples):
        assert torch.equal(images.image(i), pil_to_tensor(pil_loader(path))), path  # bit for bit


@pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec is not installed")
def test_torchcodec_decodes_jpegs_pngs_and_webps_itself():
    def encoded(mode: str, fmt: str, **options) -> torch.Tensor:
        buf = io.BytesIO()
        _image(mode, 20, 30, 1).save(buf, format=fmt, **options)
        return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)

    assert decoders.decode_jpeg(encoded("CMYK", "JPEG")).shape == (3, 20, 30)
    assert decoders.decode_jpegs([encoded("RGB", "JPEG")] * 2, torch.device("cpu"))[1].shape == (3, 20, 30)
    assert decoders.decode_still(encoded("P", "PNG")).shape == (3, 20, 30)
    assert decoders.decode_still(encoded("RGB", "WEBP")).shape == (3, 20, 30)
    assert decoders.decode_still(encoded("I;16", "PNG")) is None  # PIL's values differ from a scaled 16 bits


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_an_exif_orientation_is_not_applied_as_the_user_s_loader_applies_none(tmp_path, use, name, fmt):
    use(name)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90": TorchCodec would turn the image upright, PIL's loader does not
    folder = tmp_path / "data" / "a"
    folder.mkdir(parents=True)
    path = folder / f"rotated.{fmt.lower()}"
    Image.fromarray(_photo(21, 34, 3)).save(path, format=fmt, exif=exif.tobytes(), quality=95)
    ds = ImageFolder(str(tmp_path / "data"))
    encoded, _ = read_files(ds, progress=False)
    image = decode(encoded, torch.device("cpu"), threads=1).image(0)
    assert torch.equal(image, pil_to_tensor(pil_loader(str(path))))  # (3, 21, 34): as stored


@pytest.mark.parametrize("name", BACKENDS)
def test_decoding_a_folder_through_accelerate_emits_no_deprecation_warning(tmp_path, use, name):
    use(name)
    ds = ImageFolder(
        str(_folder(tmp_path / "data")),
        transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()]),
    )
    with warnings.catch_warnings():
        # as `python -W error::DeprecationWarning`: any DeprecationWarning, on any decoding thread, fails the test
        warnings.simplefilter("error", DeprecationWarning)
        loader = gf.accelerate(ds, batch_size=4, device="cpu", store="jpeg", cache=False, num_workers=2, progress=False)
        batches = [x for x, _ in loader]
        with pytest.raises(DeprecationWarning, match="another"):  # only torchvision's own message is filtered
            warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    assert sum(x.shape[0] for x in batches) == len(KINDS) and batches[0].shape[1:] == (3, 16, 16)


def test_a_torchcodec_that_cannot_load_is_said_once_and_torchvision_decodes(monkeypatch):
    import builtins
    import importlib.util

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name.startswith("torchcodec"):
            raise OSError("libtorchcodec_core8.so: undefined symbol (built for another torch)")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torchcodec" else None)
    monkeypatch.setattr(builtins, "__import__", broken)
    decoders._torchcodec.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"torchcodec is installed but cannot be used \(OSError: libtorchcodec"):
            assert decoders.backend() == "torchvision"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert decoders.backend() == "torchvision"  # said once: the answer is kept
    finally:
        monkeypatch.undo()
        decoders._torchcodec.cache_clear()


def test_a_gpu_decoder_that_refuses_every_jpeg_is_said_once_and_pil_decodes_them(tmp_path, monkeypatch):
    from gpufeed.store.encoded import _decode_cuda

    def refuses(files, device):
        raise RuntimeError("nvjpeg: CUDA driver version is insufficient")

    ds = ImageFolder(str(_folder(tmp_path)))
    encoded, _ = read_files(ds, progress=False)
    monkeypatch.setattr(decoders, "decode_jpegs", refuses)
    monkeypatch.setattr(decoders, "_WARNED", set())
    sizes = encoded.shapes.prod(1)
    starts = torch.cumsum(sizes, 0) - sizes
    with pytest.warns(UserWarning, match=r"refused every JPEG of a chunk \(nvjpeg: CUDA driver version"):
        images = _decode_cuda(encoded, torch.device("cpu"), starts)  # (the CUDA path's logic, on the CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _decode_cuda(encoded, torch.device("cpu"), starts)  # once per process
    for i, (path, _) in enumerate(ds.samples):
        assert torch.equal(images.image(i), pil_to_tensor(pil_loader(path))), path
