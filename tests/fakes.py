"""Small real datasets for tests: torchvision's own classes over in-memory arrays or files in tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.datasets import CIFAR10, ImageFolder
from torchvision.datasets.vision import VisionDataset

# (name, PIL mode, format, save options): the kinds of files photo folders hold
PHOTO_KINDS = [
    ("baseline.jpg", "RGB", "JPEG", {"quality": 90}),
    ("progressive.jpg", "RGB", "JPEG", {"progressive": True}),
    ("full_chroma.jpg", "RGB", "JPEG", {"subsampling": 0, "quality": 75}),
    ("gray.jpg", "L", "JPEG", {}),
    ("cmyk.jpg", "CMYK", "JPEG", {}),
    ("rgb.png", "RGB", "PNG", {}),
    ("rgba.png", "RGBA", "PNG", {}),
    ("palette.png", "P", "PNG", {}),
    ("gray.png", "L", "PNG", {}),
    ("gray16.png", "I;16", "PNG", {}),
    ("photo.webp", "RGB", "WEBP", {"quality": 80}),
    ("lossless.webp", "RGBA", "WEBP", {"lossless": True}),
]


def cifar_like(n: int = 64, transform=None, seed: int = 0, root: str = "/nonexistent") -> CIFAR10:
    """A real ``torchvision.datasets.CIFAR10`` object over random data (its __getitem__ and all).

    Built without __init__ so no files or checksums are involved; labels are ``i % 10``.
    """
    ds = CIFAR10.__new__(CIFAR10)
    VisionDataset.__init__(ds, root=root, transform=transform)
    ds.train = True
    ds.data = np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    ds.targets = [i % 10 for i in range(n)]
    ds.classes = [str(c) for c in range(10)]
    return ds


def image_folder(root: Path, sizes: list[tuple[int, int]], transform=None, seed: int = 0) -> ImageFolder:
    """An ``ImageFolder`` of RGB PNGs with the given (width, height) sizes, two classes alternating."""
    rng = np.random.default_rng(seed)
    for i, (w, h) in enumerate(sizes):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:04d}.png")
    return ImageFolder(str(root), transform=transform)


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` (hidden ones too) with its kind and, for files, a hash of its bytes.

    Two equal snapshots mean nothing under ``root`` was created, deleted, renamed or changed.
    """
    import hashlib
    import os

    tree = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                tree[rel] = f"link -> {os.readlink(path)}"
            elif path.is_dir():
                tree[rel] = "dir"
            else:
                tree[rel] = "file " + hashlib.sha256(path.read_bytes()).hexdigest()
    return tree


def user_folder(root: Path) -> Path:
    """A user's own folder: an ImageFolder tree of small PNGs, a notes file and a hidden file."""
    image_folder(root / "photos", [(12, 10), (9, 14), (16, 16), (10, 10)])
    (root / "photos" / "notes.txt").write_text("do not lose me\n")
    (root / "photos" / ".hidden").write_bytes(bytes(range(256)))
    return root / "photos"


def varied_cifar(n: int, seed: int = 0):
    """CIFAR-shaped images with structure: a gradient at a random contrast and level, plus noise (pure noise
    would hide what autocontrast, equalize or a shear do to an image's statistics)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, 32)[None, :, None, None] * np.linspace(0.2, 1, 32)[None, None, :, None]
    level = rng.uniform(20, 160, (n, 1, 1, 3))
    span = rng.uniform(10, 90, (n, 1, 1, 3))
    data = level + span * ramp + rng.normal(0, 6, (n, 32, 32, 3))
    ds = cifar_like(n, seed=seed)
    ds.data = np.clip(data, 0, 255).astype(np.uint8)
    return ds


def image_summaries(out: torch.Tensor, before: torch.Tensor) -> dict[str, torch.Tensor]:
    changed = (out - before).abs().flatten(1) > 0.5 / 255
    return {"mean": out.mean((1, 2, 3)), "std": out.std((1, 2, 3)), "changed": changed.double().mean(1)}


def hf_image_dataset(root: Path, n: int = 96, seed: int = 3) -> Path:
    """A ``datasets`` ``save_to_disk`` folder at ``root``: ``n`` images (JPEG and PNG in turn, 40 x 48) in an
    ``image`` column and a two-class ``ClassLabel`` ``label`` (``i % 2``). Needs ``datasets``."""
    import io

    import datasets

    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(out, "JPEG" if i % 2 else "PNG")
        images.append({"bytes": out.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])})
    ds = datasets.Dataset.from_dict({"image": images, "label": [i % 2 for i in range(n)]}, features=features)
    ds.save_to_disk(str(root))
    return root
