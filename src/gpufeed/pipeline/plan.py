"""The plan stage: decisions only, no read of the dataset.

From the request and the probe it decides how the data will be read and kept:

- the route: the dataset's arrays in one vectorised step (``"arrays"``), every sample through the cached part
  (``"samples"``; a recipe that starts with RandomResizedCrop keeps images of different sizes as they are if
  the read meets them, so one read serves either), each image kept at its own size (``"samples-ragged"``), or
  a folder's files by their headers, as decoded pixels or as their bytes (``"folder"``);
- the memory budget, measured once: the device's share (half the free memory of a GPU, of the host's
  available memory on the CPU) and the pinned host tier's; a store's tier follows from its size
  (:meth:`Budget.tier`);
- what an entry of the cache is keyed by besides the source and the cached ops (the store kind);
- what the options ask that this data cannot give (``store='jpeg'`` without files to keep, ``max_side`` or
  ``on_error='skip'`` for data read sample by sample): refused here, before the read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..device import fmt_bytes, host_available
from ..errors import ConfigError
from ..read.files import has_image_files
from ..read.samples import exposes_arrays
from .probe import Probed
from .request import Request

__all__ = [
    "DEVICE_BUDGET_FRACTION",
    "HOST_BUDGET_FRACTION",
    "PIXELS_BY_SAMPLE",
    "RAGGED_NOTE",
    "ROUTES",
    "Budget",
    "StorePlan",
    "budget",
    "plan",
]

DEVICE_BUDGET_FRACTION = 0.5  # of the device memory free when accelerate() runs: the rest is the model's
HOST_BUDGET_FRACTION = 0.5  # of the host memory available, for the pinned tier


def _share(fraction: float) -> str:
    return "half" if fraction == 0.5 else f"{fraction:.0%}"


@dataclass(frozen=True)
class Budget:
    """Bytes the stored data may take on the device and in pinned host memory, with where each figure comes from."""

    device_type: str
    device: int
    device_source: str
    host: int
    host_source: str

    def tier(self, nbytes: int) -> tuple[str, str]:
        """``"device"``, ``"pinned"`` or ``"mmap"`` for a store of ``nbytes``, and the plan's sentence saying why."""
        size, limit = fmt_bytes(nbytes), f"{fmt_bytes(self.device)} ({self.device_source})"
        if nbytes <= self.device:
            return "device", f"{size} fits the {self.device_type} budget of {limit}"
        if self.device_type != "cuda":  # the CPU's budget is host memory already
            return "mmap", f"{size} exceeds the device budget of {limit} (host memory on the CPU); memory-mapped file"
        if nbytes <= self.host:
            return (
                "pinned",
                f"{size} exceeds the device budget of {limit}; fits pinned host memory ({self.host_source})",
            )
        return "mmap", (
            f"{size} exceeds the device budget of {limit} and the host budget of {fmt_bytes(self.host)} "
            f"({self.host_source}); memory-mapped file"
        )


def budget(device: torch.device, memory_budget: int | None) -> Budget:
    """The budgets as they stand now (``memory_budget``: the device's, in bytes, instead of the measured share)."""
    available, what = host_available()
    host, host_source = int(available * HOST_BUDGET_FRACTION), f"{_share(HOST_BUDGET_FRACTION)} of {what}"
    if memory_budget is not None:
        return Budget(device.type, memory_budget, "memory_budget", host, host_source)
    if device.type != "cuda":
        return Budget(device.type, host, host_source, host, host_source)
    free, total = torch.cuda.mem_get_info(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    # A cap set with torch.cuda.set_per_process_memory_fraction binds the allocator, not the device.
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = get_fraction(device) if get_fraction is not None else 1.0
    usable = min(free + reserved - allocated, int(fraction * total) - allocated)
    source = f"{_share(DEVICE_BUDGET_FRACTION)} of {device}'s free memory"
    return Budget(device.type, max(0, int(usable * DEVICE_BUDGET_FRACTION)), source, host, host_source)


ROUTES = ("arrays", "samples", "samples-ragged", "folder")
PIXELS_BY_SAMPLE = {"kind": "pixels", "read": "samples"}  # what an entry of images read at their own sizes is keyed by


@dataclass(frozen=True)
class StorePlan:
    """How the data will be read and kept (see the module's docstring)."""

    route: str  # one of ROUTES
    budget: Budget
    either: bool = False  # "samples": images of different sizes met by the read are kept as they are
    notes: tuple[str, ...] = ()  # what the plan says about the store before it is made

    def __post_init__(self) -> None:
        assert self.route in ROUTES, self.route  # an internal invariant: the plan makes no other

    @property
    def key_kind(self) -> dict[str, Any] | None:
        """What an entry of this route is keyed by besides the source and the cached ops (the folder route's
        kind, pixels or the files' bytes, follows from its headers: see :mod:`gpufeed.pipeline.materialise`)."""
        return PIXELS_BY_SAMPLE if self.route == "samples-ragged" else None


RAGGED_NOTE = (
    "images of different sizes: each is stored as it is, and RandomResizedCrop draws its box from its own size"
)


def plan(req: Request, probed: Probed) -> StorePlan:
    """Decide the route and the budget; refuse what the options ask that this data cannot give."""
    dataset, split, options = req.dataset, probed.split, req.read
    store, max_side, on_error = options.store, options.max_side, options.on_error
    takes = probed.takes_ragged
    if (store == "jpeg" or max_side is not None) and not takes:
        what = "store='jpeg'" if store == "jpeg" else f"max_side={max_side}"
        first = split.cached[0] if split.cached else (split.device[0] if split.device else None)
        starts = f"this one starts with {type(first).__name__}" if first is not None else "this one is empty"
        if req.transform is None:
            starts = f"{type(dataset).__name__} has no transform (pass transform=, or the dataset's own)"
        raise ConfigError(
            f"{what} keeps each image at its own size: it needs a recipe that starts with RandomResizedCrop; {starts}"
        )
    limits = budget(req.device, options.memory_budget)
    files = has_image_files(dataset)
    # A folder read by torchvision's loader always goes by its files' headers: three probed samples of one
    # size say nothing about the rest.
    if (
        probed.sample.ragged is not None
        or (takes and not split.cached and files)
        or store == "jpeg"
        or max_side is not None
    ):
        if not split.cached and files:
            return StorePlan("folder", limits, notes=(RAGGED_NOTE,))
        _refuse_per_sample_ragged(req, probed)
        return StorePlan("samples-ragged", limits, notes=(RAGGED_NOTE,))
    skip_needs_files(on_error, dataset, "its images are read sample by sample (a recipe that makes them one size)")
    if options.cache == "auto" and not split.cached and exposes_arrays(dataset):
        # Nothing to compute and a vectorised read: a cache could not be faster, and fingerprinting
        # the arrays would cost more than reading them.
        return StorePlan("arrays", limits)
    return StorePlan("samples", limits, either=takes)


def _refuse_per_sample_ragged(req: Request, probed: Probed) -> None:
    """Images kept at their own size but read sample by sample (through a cached part, or not a folder of files):
    there are no files to keep, to shrink as they are decoded, or to leave out."""
    dataset, cached = req.dataset, probed.split.cached
    if req.read.store == "jpeg":
        why = (
            f"its cached part ({', '.join(repr(op) for op in cached)}) changes the images"
            if cached
            else f"{type(dataset).__name__} is not a folder of image files read by torchvision's PIL loader"
        )
        raise ConfigError(
            f"store='jpeg' keeps the files' own bytes, but {why}; use store='pixels' (decoded once, kept)"
        )
    why = "it is not a folder of image files read by torchvision's PIL loader"
    skip_needs_files(req.read.on_error, dataset, "its cached part changes the images" if cached else why)
    if req.read.max_side is not None:
        raise ConfigError(
            f"max_side downscales the files of a folder read by torchvision's PIL loader as they are decoded; "
            f"{type(dataset).__name__} is read sample by sample: add a Resize before RandomResizedCrop instead"
        )


def skip_needs_files(on_error: str, dataset: Any, why: str) -> None:
    """``on_error='skip'`` leaves out a folder's files; data read sample by sample has none to leave out."""
    if on_error == "skip":
        raise ConfigError(
            f"on_error='skip' leaves out the files of a folder that cannot be read or decoded, found while a store "
            f"of each image as it is is built; {type(dataset).__name__} is not read that way ({why}): remove or fix "
            "the bad files, or use a recipe that starts with RandomResizedCrop on an ImageFolder"
        )
