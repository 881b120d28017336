"""The probe stage: the transform split, a few samples read through its cached part, the batched ops built once
and run on them -- all before the dataset is read.

What the batched path cannot do is found here, so that it takes the fallback (or fails) without a read of the
dataset: an op gpufeed cannot batch or cache (from the split), images of different sizes the recipe cannot keep
as they are, randomness outside the transform (reads that differ), a value the batched ops refuse (a dry run on
the probed samples). What torchvision itself refuses for the images' channel count (an LA or RGBA image's alpha,
:mod:`gpufeed.augment.channels`) is an error here, fallback or not: the per-sample pipeline would raise too. Its
result, :class:`Probed`, carries the batched ops the loader will run: built once here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..augment.fusion import eager
from ..augment.transforms import takes_ragged
from ..errors import ConfigError, DataError, UnsupportedTransformError
from ..read.files import has_image_files
from ..read.fingerprint import standard_getitem, standard_loader
from ..read.samples import RaggedError, as_pair, ragged_message, to_chw, with_transform
from ..read.wrappers import hidden_transforms
from ..sampling import derive_seed, global_seed
from ..store.ragged import Ragged
from ..validate import Guarded, SampleFailure, UnbatchableError, check_dataset, check_label, check_not_meta
from .sample_checks import check_samples, refuse_channels
from .translate import RANDOM_SUPPORTED, Split, build_batched, flatten, kind, split_transform
from .translate.inputs import form
from .translate.modes import check_modes, mode_fix
from .translate.refusals import is_refusal

__all__ = ["Probe", "Probed", "probe", "probe_samples"]


@dataclass(frozen=True)
class Probed:
    """What the probe stage found: the split of the (first view's) transform, what the probed samples say, and the
    batched ops per view, built once for the stored images' dtype and size."""

    split: Split
    sample: Probe
    batched: tuple[Any, ...]  # per view: a gpufeed Compose, or None when nothing runs batched
    notes: tuple[str, ...]  # what building the ops noted (PIL kernels, ...)
    # per sample of the read (index, its PIL mode or None): raises for a mode the batched ops were not built for
    check_mode: Callable[[int, str | None], None] | None = None

    @property
    def takes_ragged(self) -> bool:
        """Every view starts with an op that takes images of different sizes (RandomResizedCrop)."""
        return all(takes_ragged(ops) for ops in self.batched)


def probe(dataset: Any, transforms: Sequence[Any], cache_lambda: bool = False, on_error: str = "error") -> Probed:
    """Split each view's transform (one view unless ``views=`` gave pipelines), read a few samples through the
    cached part, build the batched ops and run them on those samples. Raises UnsupportedTransformError or
    UnbatchableError for what the batched path cannot run (the fallback's cases), ConfigError for views whose
    stored parts differ, DataError for samples no loader could use."""
    split = split_transform(transforms[0], cache_lambda)
    others = [split_transform(t, cache_lambda) for t in transforms[1:]]
    for other in others:  # one stored part for every view
        if [repr(op) for op in other.cached] != [repr(op) for op in split.cached]:
            raise ConfigError(
                f"views: the pipelines' deterministic parts differ ({list(split.cached)} and "
                f"{list(other.cached)}); the images are stored once, so every view must start the same"
            )
    # A folder's bad files are all found while its store is built (and named in one error, or left out): the probe
    # reads past them rather than failing on the first.
    views = [s.device for s in [split, *others]]
    on_error = "skip" if has_image_files(dataset) else on_error
    sample = probe_samples(dataset, split.cached_transform(), on_error, views)
    check_mode = check_samples(views, sample, type(dataset).__name__)
    for s in [split, *others]:
        refuse_channels(s.device, sample, type(dataset).__name__)
    notes: list[str] = []
    batched = tuple(
        build_batched(s.device, sample.dtype, sample.size, sample.pil, notes, sample.channels, sample.mode)
        for s in [split, *others]
    )
    if others and any(ops is None for ops in batched):
        raise ConfigError("views: every view's pipeline needs a random op after its deterministic part")
    refusing = next((ops for ops in batched if not takes_ragged(ops)), None)  # a view that needs one size
    if sample.ragged is not None and not (sample.sizes_only and refusing is None):
        _refuse_ragged(sample, refusing if refusing is not None else batched[0])
    for ops in batched:
        _dry_run(ops, sample.samples)
    return Probed(split, sample, batched, tuple(notes), check_mode)


def _refuse_ragged(sample: Probe, batched: Any) -> None:
    """Images of different sizes the recipe cannot keep as they are: say why (and what order would)."""
    assert sample.ragged is not None
    crop = next((op for op in getattr(batched, "transforms", []) if op.one_size_output), None)
    if sample.sizes_only and crop is not None:  # the recipe could keep them as they are, with its ops reordered
        before = [op.describe() for op in batched.transforms[: batched.transforms.index(crop)] if not op.ragged_input]
        raise RaggedError(
            f"{sample.ragged.split(';')[0]}; images of different sizes are kept as they are only when "
            f"RandomResizedCrop comes before any op that needs one size ({', '.join(before)}): put it first, or "
            "pass fallback='prefetch'",
            sizes_only=True,
        )
    raise RaggedError(sample.ragged, sizes_only=sample.sizes_only)


def _dry_run(batched: Any, samples: torch.Tensor | Ragged | None) -> None:
    """Run the batched ops on the probed samples: what they refuse (an erase value a uint8 image cannot
    hold, a fill out of range) is found before the dataset is read, and can take the fallback -- as can anything
    else they raise on these samples (a gpufeed bug, not the user's pipeline: torchvision's own refusals are
    found from the pipeline first), so that ``fallback="prefetch"`` still runs the user's pipeline."""
    if batched is None or samples is None:
        return
    try:
        with eager():  # refusals only: compiling (for the CPU, where the loader may be on a GPU) is the loader's
            batched(samples, generator=torch.Generator().manual_seed(0))
    except (ConfigError, DataError) as e:
        if is_refusal(e):
            raise
        raise UnsupportedTransformError(f"the batched ops cannot run this pipeline: {e}") from e
    except Exception as e:
        raise UnsupportedTransformError(
            f"the batched ops raised {type(e).__name__} ({e}) on the probed samples: pass fallback='prefetch' to run "
            "your pipeline per sample instead (and please report this to gpufeed)"
        ) from e


@dataclass(frozen=True)
class Probe:
    """What a few samples say before the whole dataset is read."""

    dtype: torch.dtype  # of an image after the cached part
    size: tuple[int, int]  # (height, width) after the cached part
    pil: bool  # the cached part hands PIL images on (so the user's pipeline continues on PIL kernels)
    ragged: str | None  # why the images cannot be stacked into one tensor (differing sizes), or None
    samples: torch.Tensor | Ragged | None = None  # the probed images after the cached part
    sizes_only: bool = False  # ragged, but only in height and width (one channel count and dtype): a Ragged store
    channels: int | None = None  # of an image after the cached part (sample 0's)
    modes: tuple[tuple[int, str | None], ...] = ()  # (index, PIL mode or None) of each probed sample, the first first
    form: str = "tensor"  # what the first probed sample is after the cached part: "PIL", "ndarray", "tensor", ...

    @property
    def mode(self) -> str | None:
        """The PIL mode of the first probed sample after the cached part (None: not a PIL image)."""
        return self.modes[0][1] if self.modes else None


_SPREAD = 24  # samples of a dataset whose reads gpufeed cannot prove deterministic, read twice each


def _spread(n: int, count: int, skip: int) -> list[int]:
    """Up to ``count`` indices spread evenly over ``range(n)`` (every class of a sorted folder, every part of a
    concatenation), without ``skip``."""
    return sorted({round(k * (n - 1) / max(1, count - 1)) for k in range(min(count, n))} - {skip})


def _image_and_label(read: Callable[[int], tuple[Any, torch.Tensor, Any]], i: int) -> tuple[torch.Tensor, Any]:
    return read(i)[1:]


def _known_reads(dataset: Any) -> bool:
    """Whether ``dataset[i]`` runs only torchvision's or torch's own code once its transform is replaced (its
    ``__getitem__`` and file loader), so reading a sample again gives the same sample."""
    return standard_getitem(dataset) and standard_loader(dataset)


def _varies(
    read: Callable[[], tuple[torch.Tensor, Any]], image: torch.Tensor, label: Any, reads: int = 8, first_seed: int = 0
) -> bool:
    """Whether reading a sample again, under ``reads`` different global seeds, gives anything else
    (a coin-flip augmentation is missed with probability 2**-reads; the seeds make the answer repeatable)."""
    for seed in range(first_seed, first_seed + reads):
        with global_seed(seed):
            again, label_again = read()
        if not (_same(image, again) and _same(torch.as_tensor(label), torch.as_tensor(label_again))):
            return True
    return False


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (a NaN in the data is the checks' business, not a sign of randomness)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _deterministic(transform: Any) -> bool:
    """Whether every op of ``transform`` is one gpufeed knows to give the same output for the same input."""
    try:
        ops = flatten(transform)
    except Exception:  # a container gpufeed cannot read: nothing is proved
        return False
    return all(kind(op) not in (None, "Lambda", *RANDOM_SUPPORTED) for op in ops)


def probe_samples(
    dataset: Any, cached: Callable[[Any], Any] | None, on_error: str = "error", views: Sequence[Sequence[Any]] = ()
) -> Probe:
    """Read samples 0, n/2 and n-1 through ``cached``: their dtype and size, PIL or not (and the mode), sizes that
    differ. ``views``: the device part of each view's pipeline, whose refusals on a PIL mode gpufeed cannot store
    (16-bit, 1-bit) come before that mode's refusal.

    Randomness the transform split cannot see is never frozen. A transform inside a wrapper gpufeed does not
    know (not torch's ``Subset`` or ``ConcatDataset``, which :func:`gpufeed.read.wrappers.unwrap` sees through)
    runs on every read and cannot be stripped: unless each of its ops is known to be deterministic it is
    refused (UnbatchableError, the fallback's case). And sample 0 is read again under eight different
    random states: a ``__getitem__`` that draws random numbers of its own is refused the same way.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> p = probe_samples(TensorDataset(torch.zeros(4, 3, 5, 6, dtype=torch.uint8), torch.arange(4)), None)
        >>> p.dtype, p.size, p.pil, p.ragged
        (torch.uint8, (5, 6), False, None)
    """
    from PIL import Image

    check_dataset(dataset)
    n, source = len(dataset), type(dataset).__name__
    if n == 0:
        raise DataError(f"the dataset ({source}) is empty (len 0); nothing to load")
    for where, inner in hidden_transforms(dataset):
        if not _deterministic(inner):
            described = " ".join(repr(inner).split())
            raise UnbatchableError(
                f"{where} has the transform {described}, which runs inside {source}[i] where gpufeed cannot replace "
                "it: reading each sample once would freeze its random ops. Pass the inner dataset (torch's Subset "
                "and ConcatDataset are seen through) with its transform, or pass fallback='prefetch' to run the "
                "dataset as a DataLoader does"
            )
    raw = Guarded(with_transform(dataset, None), source)

    def read(i: int) -> tuple[Any, torch.Tensor, Any]:
        item = raw[i]
        if isinstance(item, SampleFailure):
            raise item.exception()
        image, label = as_pair(item)
        check_not_meta(image, f"{source}[{i}]'s image")
        check_not_meta(label, f"{source}[{i}]'s label")
        check_label(label, source, i)
        try:
            out = cached(image) if cached is not None else image
        except Exception as e:  # the user's cached ops on the user's image: name the sample
            raise DataError(f"{source}[{i}]: the cached ops raised {type(e).__name__}: {e}") from e
        return out, to_chw(out), label

    first_at = 0
    while True:  # on_error="skip": a file that cannot be read is left out by the store's build, so probe others
        try:
            with global_seed(derive_seed(first_at, 1)):  # the caller's global generators are neither used nor moved
                first_out, first, label = read(first_at)
            break
        except DataError:
            if on_error != "skip" or first_at + 1 >= n:
                raise
            first_at += 1
    # Every dataset, torchvision's too: its transform is stripped, but what else it (or what it wraps) runs is
    # not known to be deterministic until reads under other random states agree.
    if _varies(lambda: read(first_at)[1:], first, label):
        raise UnbatchableError(
            f"{source}[0] differs between two reads: its __getitem__ draws random numbers outside its transform, "
            "and gpufeed, which reads each sample once, would freeze that randomness. Move the random ops into "
            "the transform, or pass fallback='prefetch' to run the dataset as a DataLoader does"
        )
    if not _known_reads(dataset):  # randomness may show only for some samples (one class, one part of a concat)
        for i in _spread(n, _SPREAD, skip=first_at):
            try:
                with global_seed(derive_seed(i, 1)):
                    image, again_label = read(i)[1:]
            except DataError:
                if on_error == "skip":
                    continue
                raise
            again = functools.partial(_image_and_label, read, i)
            if _varies(again, image, again_label, reads=2, first_seed=derive_seed(i, 2)):
                raise UnbatchableError(
                    f"{source}[{i}] differs between two reads: its __getitem__ (code gpufeed cannot read) draws random "
                    "numbers outside the transform it replaces, and gpufeed, which reads each sample once, would "
                    "freeze that randomness. Move the random ops into the dataset's transform, or pass "
                    "fallback='prefetch' to run the dataset as a DataLoader does"
                )
    if first.dim() != 3:
        raise UnbatchableError(
            f"{source}[{first_at}] gives an image of shape {tuple(first.shape)}; gpufeed stores images, (C, H, W) or "
            "(H, W) (served as (N, C, H, W) batches): for other data (features, sequences), use a DataLoader, or "
            "pass fallback='prefetch'"
        )
    if first.dtype != torch.uint8 and not first.dtype.is_floating_point:
        if isinstance(first_out, Image.Image):  # what the pipeline's ops (``views``) refuse on them comes first
            for ops in views:
                check_modes(ops, first_out.mode, f"{source}[{first_at}]")
        pil_mode = first_out.mode if isinstance(first_out, Image.Image) else None
        kind = f"{pil_mode} PIL images, " if pil_mode else ""
        fix = (
            mode_fix(pil_mode)
            if pil_mode
            else "convert them to uint8 or float in __getitem__, or in the transform's first op (a T.Lambda, with "
            "cache_lambda=True: the ops after it are not cached, so a ToDtype there comes too late)"
        )
        raise UnbatchableError(
            f"{source}[{first_at}] gives {kind}images of dtype {first.dtype}; gpufeed stores uint8 or float images: "
            f"{fix}; or pass fallback='prefetch' to run your pipeline as it is"
        )
    stored, ragged, sizes_only = [first], None, True
    modes = [(first_at, _mode(first_out))]
    for i in sorted({n // 2, n - 1} - {first_at}):
        try:
            out, image, _ = read(i)
            modes.append((i, _mode(out)))
        except DataError:
            if on_error != "skip":
                raise
            continue
        if image.shape != first.shape or image.dtype != first.dtype:
            ragged = ragged or ragged_message(
                source, i, tuple(image.shape), image.dtype, tuple(first.shape), first.dtype
            )
            sizes_only = sizes_only and image.shape[0] == first.shape[0] and image.dtype == first.dtype
        stored.append(image)
    pil = isinstance(first_out, Image.Image)
    size = (first.shape[1], first.shape[2])
    channels = int(first.shape[0])
    if ragged is None:
        stack: Any = torch.stack(stored)
        return Probe(first.dtype, size, pil, None, stack, channels=channels, modes=tuple(modes), form=form(first_out))
    stack = Ragged.stack(stored) if sizes_only else None
    return Probe(first.dtype, size, pil, ragged, stack, sizes_only, channels, tuple(modes), form(first_out))


def _mode(image: Any) -> str | None:
    """A PIL image's mode ("RGB", "P", ...), None for anything else."""
    from PIL import Image

    return image.mode if isinstance(image, Image.Image) else None
