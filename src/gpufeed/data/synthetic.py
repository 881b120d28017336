"""A learnable synthetic CIFAR-10, written in the real ``cifar-10-batches-py`` format.

Every command and benchmark runs on it with no download. Each class is a smooth random colour
pattern; an image is its class pattern plus a weaker mirrored pattern of another class,
translated (up to 4 px), maybe mirrored, with random contrast and brightness and strong pixel
noise -- so a small CNN learns it well above chance, and crop/flip augmentation is
label-preserving as on real CIFAR-10.

The files are read by torchvision's own ``CIFAR10`` class. torchvision verifies each file's MD5
against the real dataset's, which synthetic files cannot match, so :class:`SyntheticCIFAR10`
checks them against the MD5s recorded when they were generated instead (the check still runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.datasets import CIFAR10

from ..augment import Compose, RandomCrop, RandomHorizontalFlip
from ..cache.fingerprint import default_cache_dir
from ..cache.lock import build_lock

__all__ = ["SyntheticCIFAR10", "cifar10", "write_synthetic_cifar10"]

GENERATOR_VERSION = 1
SIDECAR = "gpufeed-synthetic.json"
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
_BASE = "cifar-10-batches-py"


def _prototypes(seed: int) -> torch.Tensor:
    """One smooth 3x32x32 pattern per class: 4x4 random colours upsampled, in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 3, 4, 4, generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(32, 32), mode="bicubic", align_corners=False)
    return smooth / smooth.abs().amax(dim=(1, 2, 3), keepdim=True)


def _images(labels: torch.Tensor, protos: torch.Tensor, g: torch.Generator) -> np.ndarray:
    out = np.empty((len(labels), 3, 32, 32), dtype=np.uint8)
    jitter = Compose([RandomCrop(32, padding=4, padding_mode="reflect"), RandomHorizontalFlip()])
    for start in range(0, len(labels), 5000):
        y = labels[start : start + 5000]
        n = len(y)
        # A weaker pattern of a random other class is mixed in, so the task is not linearly trivial.
        other = (y + torch.randint(1, 10, (n,), generator=g)) % 10
        x = jitter(protos[y] + 0.5 * protos[other].flip(-1), generator=g)
        contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
        brightness = 0.25 * torch.randn(n, 1, 1, 1, generator=g)
        x = contrast * x + brightness + 0.8 * torch.randn(x.shape, generator=g)
        out[start : start + n] = (x * 60 + 128).round().clamp(0, 255).to(torch.uint8).numpy()
    return out


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_synthetic_cifar10(
    root: str | Path | None = None, seed: int = 0, train: int = 50_000, test: int = 10_000
) -> Path:
    """Generate (once) the synthetic dataset under ``root`` and return ``root``.

    ``root`` defaults to ``<gpufeed cache dir>/data/synthetic-cifar10-<seed>-<train>-<test>``; the
    files appear atomically (built in a temporary directory, then renamed), with a sidecar of MD5s.
    """
    if train % 5 or train < 5 or test < 1:
        raise ValueError(f"{train=} must be a positive multiple of 5 (five batches) and {test=} >= 1")
    root = Path(root) if root is not None else default_cache_dir() / "data" / f"synthetic-cifar10-{seed}-{train}-{test}"
    if (root / _BASE / SIDECAR).is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with build_lock(root / _BASE):  # several ranks may ask at once: one generates, the others wait
        if not (root / _BASE / SIDECAR).is_file():
            _generate(root, seed, train, test)
    return root


def _generate(root: Path, seed: int, train: int, test: int) -> None:
    tmp = root / f".{_BASE}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        protos = _prototypes(seed)
        g = torch.Generator().manual_seed(seed + 1)
        files: dict[str, tuple[np.ndarray, list[int]]] = {}
        train_labels = torch.randint(0, 10, (train,), generator=g)
        train_images = _images(train_labels, protos, g)
        per = train // 5
        for b in range(5):
            sl = slice(b * per, (b + 1) * per)
            files[f"data_batch_{b + 1}"] = (train_images[sl], train_labels[sl].tolist())
        test_labels = torch.randint(0, 10, (test,), generator=g)
        files["test_batch"] = (_images(test_labels, protos, g), test_labels.tolist())
        for name, (images, labels) in files.items():
            entry = {
                "batch_label": f"synthetic {name}",
                "labels": labels,
                "data": images.reshape(len(labels), -1),
                "filenames": [f"synthetic_{i:05d}.png" for i in range(len(labels))],
            }
            with open(tmp / name, "wb") as f:
                pickle.dump(entry, f, protocol=4)
        with open(tmp / "batches.meta", "wb") as f:
            pickle.dump({"label_names": CLASSES, "num_cases_per_batch": per, "num_vis": 3072}, f, protocol=4)
        sums = {p.name: _md5(p) for p in sorted(tmp.iterdir())}
        info = {"generator": GENERATOR_VERSION, "seed": seed, "train": train, "test": test, "md5": sums}
        (tmp / SIDECAR).write_text(json.dumps(info, indent=2))
        if (root / _BASE).exists():  # an incomplete earlier attempt (no sidecar)
            shutil.rmtree(root / _BASE)
        os.replace(tmp, root / _BASE)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class SyntheticCIFAR10(CIFAR10):
    """torchvision's ``CIFAR10`` over the synthetic files, checked against their recorded MD5s.

    Example:
        >>> import tempfile
        >>> ds = SyntheticCIFAR10(tempfile.mkdtemp(), train=False, sizes=(50, 10))
        >>> len(ds), ds.data.shape
        (10, (10, 32, 32, 3))
    """

    def __init__(
        self,
        root: str | Path | None = None,
        train: bool = True,
        transform: Any = None,
        target_transform: Any = None,
        download: bool = True,
        seed: int = 0,
        sizes: tuple[int, int] = (50_000, 10_000),
    ) -> None:
        if download:
            root = write_synthetic_cifar10(root, seed, *sizes)
        elif root is None:
            root = default_cache_dir() / "data" / f"synthetic-cifar10-{seed}-{sizes[0]}-{sizes[1]}"
        sidecar = Path(root) / _BASE / SIDECAR
        if not sidecar.is_file():
            raise RuntimeError(f"{sidecar} not found: generate the synthetic data with download=True")
        md5 = json.loads(sidecar.read_text())["md5"]
        # Instance attributes shadow the class's real-CIFAR checksums; torchvision's check still runs.
        self.train_list = [[f"data_batch_{b}", md5[f"data_batch_{b}"]] for b in range(1, 6)]
        self.test_list = [["test_batch", md5["test_batch"]]]
        self.meta = {"filename": "batches.meta", "key": "label_names", "md5": md5["batches.meta"]}
        super().__init__(str(root), train=train, transform=transform, target_transform=target_transform)

    def download(self) -> None:  # the parent's download() fetches the real dataset
        raise RuntimeError("SyntheticCIFAR10 is generated, not downloaded: pass download=True to the constructor")


def cifar10(
    data: str = "synthetic",
    root: str | Path | None = None,
    train: bool = True,
    transform: Any = None,
    download: bool = False,
    seed: int = 0,
    sizes: tuple[int, int] = (50_000, 10_000),
) -> CIFAR10:
    """The CIFAR-10 every gpufeed command uses: ``"synthetic"`` (generated) or ``"cifar10"`` (torchvision's)."""
    if data == "synthetic":
        return SyntheticCIFAR10(root, train=train, transform=transform, seed=seed, sizes=sizes)
    if data == "cifar10":
        if root is None:
            raise ValueError("data='cifar10' needs a data directory (--data-dir)")
        return CIFAR10(str(root), train=train, transform=transform, download=download)
    raise ValueError(f"data={data!r} must be 'synthetic' or 'cifar10'")
