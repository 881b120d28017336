"""Store: the interface every kind of stored images gives the loaders, the state fingerprint, the plan and the cache.

A loader serves chunks of a dataset's images without knowing how they are kept: one ``(N, C, H, W)`` tensor
(:class:`~gpufeed.store.dense.Dense`), images of different sizes as decoded pixels
(:class:`~gpufeed.store.ragged.Ragged`) or as their files' own bytes (:class:`~gpufeed.store.encoded.Encoded`).
Each kind answers the same few questions (how many, how big, where), selects and packs its images, moves to the
loader's storage tier, and hands a chunk over as the transform receives it. A new source (streamed shards) is one
more subclass; nothing that serves batches changes.

The entry kinds of the cache (``"dense"``, ``"pixels"``, ``"jpeg"``) are the stores' :attr:`Store.kind`:
:meth:`Store.arrays` gives what an entry holds, :func:`gpufeed.store.from_arrays` makes the store back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

__all__ = ["STORAGE_TIERS", "Store", "need"]

# Where a loader keeps its store: copied to the device, in page-locked host memory, or as it is (a mapped file).
STORAGE_TIERS = ("device", "pinned", "mmap")


class Store(ABC):
    """``N`` stored images, served by index.

    Subclasses set :attr:`kind` and :attr:`ragged` and implement the abstract members.

    Example:
        >>> import torch
        >>> from gpufeed.store import as_store
        >>> s = as_store(torch.zeros(5, 3, 4, 4, dtype=torch.uint8))
        >>> s.kind, len(s), s.stored_shape, tuple(s.batch(torch.tensor([0, 2]), torch.device("cpu")).shape)
        ('dense', 5, (5, 3, 4, 4), (2, 3, 4, 4))
    """

    kind: ClassVar[str]  # "dense" | "pixels" | "jpeg": what a cache entry of this store records as its kind
    # Batches hold images of different sizes: the transform's first op must take them (RandomResizedCrop), and a
    # chunk is selected on the host, by the store's metadata.
    ragged: ClassVar[bool]
    # Served from host memory whatever the tier (encoded bytes: the decoders read them there, nvJPEG included); its
    # labels go to the device, as a device tier's would.
    host_bytes: ClassVar[bool] = False

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The images' dtype as the transform receives them (an encoded store's: what it decodes to)."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the stored bytes are."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held, metadata included."""

    @property
    @abstractmethod
    def sample_bytes(self) -> float:
        """Bytes of one sample as the transform receives it (decoded): what sizes a loader's chunks."""

    @property
    @abstractmethod
    def stored_shape(self) -> tuple[int, ...]:
        """``(N, C, H, W)``, or ``(N, C)`` for images of different sizes."""

    @property
    def images(self) -> Any:
        """What a user sees as the images (``loader.images``, ``cache.images``): the store itself, or a dense
        store's tensor."""
        return self

    @abstractmethod
    def select(self, idx: torch.Tensor) -> Store:
        """The images at ``idx``; a ragged store gives views of its buffer (nothing copied)."""

    @abstractmethod
    def compact(self) -> Store:
        """These images in a buffer of their own (after :meth:`select`, to free the rest)."""

    @abstractmethod
    def placed(self, storage: str, device: torch.device) -> Store:
        """This store in a loader's tier (:data:`STORAGE_TIERS`) for batches made on ``device``: ``"device"``
        copies it there (nothing when already there), ``"pinned"`` page-locks it on the host when ``device`` is a
        GPU, ``"mmap"`` keeps it as it is. Encoded bytes stay on the host whatever the tier (the decoders read
        them there), pinned for a GPU."""

    @abstractmethod
    def batch(self, idx: torch.Tensor, device: torch.device) -> Any:
        """The images at ``idx`` as the transform receives them, on ``device``: a ``(n, C, H, W)`` tensor, or a
        :class:`~gpufeed.store.ragged.Ragged` batch (an encoded store's decoded). ``idx`` may be on ``device``
        for a dense store already there (one epoch's order is sent once); a ragged store reads it on the host."""

    def pinned_batch(self, idx: torch.Tensor) -> torch.Tensor:
        """The images at ``idx`` gathered on the host straight into pinned memory, for the loader to copy ahead
        on a side stream (a dense store on the host serving a GPU). A ragged store has none: it packs and copies
        its chunks itself (:meth:`batch`)."""
        raise NotImplementedError(f"a {self.kind} store makes its chunks with batch(), not pinned_batch()")

    @abstractmethod
    def fingerprint(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """What a loader state's fingerprint hashes of this store (NOTE [ What a state belongs to ] in
        :mod:`gpufeed.loading.identity`): the pixels of the images at ``idx`` (a ragged store's after every
        image's size, cheap metadata). A folder's pixel store and its JPEG store give the same."""

    def describe(self) -> str:
        """The plan's line for this store's layout; ``""`` where there is nothing to say (dense)."""
        return ""

    @abstractmethod
    def arrays(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The arrays a cache entry of this store holds, and what its manifest records besides (``"store"``: the
        kind, and what reading it back needs); :meth:`from_arrays` is the inverse."""

    @classmethod
    @abstractmethod
    def from_arrays(cls, arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> Store:
        """The store a cache entry of this kind holds (its arrays, ``labels`` among them, and its manifest's meta);
        ValueError or KeyError (via :func:`need`) when they do not fit together."""

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`~gpufeed.errors.DataError` if these images cannot be served (none, a dtype a batch cannot
        have, an image with an axis of 0, ...)."""


def need(arrays: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """``arrays[name]``, or a KeyError that says the entry lists no such array."""
    if name not in arrays:
        raise KeyError(f"its manifest lists no '{name}' array")
    return arrays[name]
