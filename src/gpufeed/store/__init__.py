"""Storage types: the images a loader serves, behind one interface (:class:`~gpufeed.store.base.Store`).

- :class:`~gpufeed.store.dense.Dense`: one ``(N, C, H, W)`` tensor;
- :class:`~gpufeed.store.ragged.Ragged`: images of different sizes, decoded, in one buffer;
- :class:`~gpufeed.store.encoded.Encoded`: their files' own bytes, decoded per chunk.

:func:`as_store` is the one place that tells them apart by type; :func:`from_arrays` makes a cache entry's
arrays back into its store, and :mod:`gpufeed.store.entry` opens an entry as the public ``Cache``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..validate import as_tensor
from .base import Store
from .dense import Dense
from .encoded import Encoded
from .ragged import Ragged

__all__ = ["KINDS", "Dense", "Encoded", "Ragged", "Store", "as_store", "from_arrays"]


def as_store(images: Any) -> Store:
    """``images`` as a store: a tensor, numpy array or nested list as :class:`Dense`, a store as it is.

    Example:
        >>> import numpy as np
        >>> as_store(np.zeros((2, 1, 3, 3), dtype=np.uint8)).kind
        'dense'
    """
    if isinstance(images, Store):
        return images
    return Dense(as_tensor(images, "images"))


KINDS: dict[str, type[Store]] = {kind.kind: kind for kind in (Dense, Ragged, Encoded)}  # an entry's kind -> its store


def from_arrays(kind: str, arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> Store:
    """The store of a cache entry of ``kind`` (its manifest's ``"store"``) from its ``arrays`` and manifest ``meta``
    (the inverse of :meth:`Store.arrays`). ValueError for a kind gpufeed does not write, or arrays that do not fit.

    Example:
        >>> r = Ragged.stack([torch.zeros(3, 2, 4, dtype=torch.uint8)])
        >>> arrays, meta = r.arrays()
        >>> torch.equal(from_arrays(meta["store"], {**arrays, "labels": torch.zeros(1)}, meta).image(0), r.image(0))
        True
    """
    if kind not in KINDS:
        raise ValueError(f"store kind {kind!r} is not one gpufeed writes ({', '.join(KINDS)})")
    return KINDS[kind].from_arrays(arrays, meta)
