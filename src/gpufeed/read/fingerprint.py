"""Cache keys: the source's identity, the cached transform's parameters and the format version.

Change any of them and the key changes, so an old entry is never matched to new data or a new
transform. What cannot be identified (an unknown dataset class, a Lambda, any object whose repr
is its memory address) gives no key, and the caller does not persist it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cache.format import VERSION, hashes

__all__ = ["cache_key", "dataset_identity", "digest", "standard_getitem", "standard_loader", "transform_identity"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def digest(*parts: Any) -> str:
    """A short hex digest of ``parts``: tensors by dtype, shape and bytes, anything else by its ``repr``."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, torch.Tensor):
            t = part.detach().cpu().contiguous()
            h.update(f"{t.dtype} {tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()


_ROWS_BYTES = 16 << 20  # hashed per slice of rows: a strided array is copied a slice at a time, never whole


def _content(array: Any) -> list[str]:
    """dtype, shape and a hash per 16 MiB slice of rows; memory beyond the array stays a few slices."""
    a = array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    a = a.reshape(1) if a.ndim == 0 else a
    rows = max(1, _ROWS_BYTES // max(1, a[0].nbytes)) if len(a) else 1
    # CIFAR's .data is a transposed view: ascontiguousarray copies one slice, not the dataset.
    slices = ((lambda i=i: np.ascontiguousarray(a[i : i + rows])) for i in range(0, len(a), rows))
    return [str(a.dtype), str(a.shape), *hashes(slices)]


def standard_getitem(dataset: Any) -> bool:
    """Whether ``dataset[i]`` runs torchvision's or torch's own code (a subclass may add attributes, not
    override ``__getitem__``), so its arrays or file list say what it yields. Code a user wrote cannot
    be fingerprinted: a change to it would leave a cache or an array read serving the old samples.
    """
    getitem = getattr(type(dataset), "__getitem__", None)
    # gpufeed's own sources (gpufeed.read.hf) read with code it knows; its views (read/wrappers) run the inner
    # dataset's code, so they are not among them
    return (getattr(getitem, "__module__", None) or "").startswith(
        ("torchvision.", "torch.utils.data", "gpufeed.read.hf")
    )


def standard_loader(dataset: Any) -> bool:
    """Whether a ``DatasetFolder``'s file loader (if it has one) is torchvision's own."""
    loader = getattr(dataset, "loader", None)  # DatasetFolder: how a file becomes an image
    return loader is None or (getattr(loader, "__module__", None) or "").startswith("torchvision.")


def dataset_identity(dataset: Any) -> dict[str, Any] | None:
    """What identifies the samples of ``dataset``; ``None`` when gpufeed cannot tell.

    Only datasets that read samples with torchvision's or torch's own code qualify
    (:func:`standard_getitem`, and a torchvision file loader). Array datasets are identified by a
    hash of their content; file datasets (``ImageFolder`` and friends, anything with ``.samples``)
    by each file's path, size, mtime, inode change time and inode number. The last two are what
    ``os.utime`` (``rsync -t``, backup restores) cannot set back: a file replaced by one of the same
    size with its mtime restored still changes the key. (A file rewritten in place keeps its inode but
    gets a new ctime; a copy or a rename onto it gets a new inode.)
    """
    if not (standard_getitem(dataset) and standard_loader(dataset)):
        return None
    own = getattr(dataset, "source_identity", None)  # a source of gpufeed's own (a Hugging Face dataset's column)
    if callable(own):
        return own()
    ident: dict[str, Any] = {"class": f"{type(dataset).__module__}.{type(dataset).__qualname__}", "len": len(dataset)}
    for attr in ("train", "split", "classes"):
        if isinstance(getattr(dataset, attr, None), (bool, str, list)):
            ident[attr] = getattr(dataset, attr)
    if hasattr(dataset, "tensors"):  # TensorDataset
        ident["content"] = [_content(t) for t in dataset.tensors]
        return ident
    data = getattr(dataset, "data", None)
    labels = getattr(dataset, "targets", getattr(dataset, "labels", None))
    if isinstance(data, (np.ndarray, torch.Tensor)) and labels is not None:
        ident["content"] = [_content(data), _content(labels)]
    elif isinstance(getattr(dataset, "samples", None), list):
        files = []
        for path, target in dataset.samples:
            try:
                st = os.stat(path)
            except OSError as e:  # a folder it may not enter: the build names the file (or skips it, on_error=)
                files.append([str(path), f"unreadable: {e.strerror or e}", target])
                continue
            files.append([str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, target])
        ident["files"] = hashlib.blake2b(json.dumps(files).encode(), digest_size=16).hexdigest()
    else:
        return None
    if getattr(dataset, "target_transform", None) is not None:
        tt = transform_identity([dataset.target_transform])
        if tt is None:
            return None
        ident["target_transform"] = tt
    return ident


def transform_identity(ops: Sequence[Any]) -> list[str] | None:
    """The reprs of the cached ops (they carry every parameter), or ``None`` if one is opaque."""
    reprs = [repr(op) for op in ops]
    if any(type(op).__name__ == "Lambda" or _ADDRESS.search(r) for op, r in zip(ops, reprs, strict=True)):
        return None
    return reprs


def cache_key(dataset: Any, cached_ops: Sequence[Any], store: dict[str, Any] | None = None) -> str | None:
    """A hex key for (source, cached transform, format, library versions), or ``None`` if not identifiable.

    ``store``: what kind of store the entry holds when it is not one dense array (images of different
    sizes: ``{"kind": "pixels" | "jpeg", ...}``), so each kind has its own entry."""
    source, transform = dataset_identity(dataset), transform_identity(cached_ops)
    if source is None or transform is None:
        return None
    import PIL
    import torchvision

    # Resize and friends may change output between releases: the versions are part of the key.
    versions = {"format": VERSION, "torchvision": torchvision.__version__, "pillow": PIL.__version__}
    fields: dict[str, Any] = {"source": source, "transform": transform, "versions": versions}
    if store is not None:
        fields["store"] = store
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.blake2b(blob.encode(), digest_size=20).hexdigest()
