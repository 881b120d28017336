"""The engine: MosaicML Streaming (``import streaming``), imported lazily and version-checked once.

``import streaming`` takes seconds (it pulls ``transformers``), so nothing in gpufeed imports it at module level:
every use goes through :func:`streaming`, which imports it on first call, checks the release, and names the fix
when it is missing. The other functions here wrap the planner's names (a change there is guarded by the
conformance tests in ``tests/stream/test_plan.py``); the writer's (``MDSWriter``, its upload queue: convert.py),
the downloader (shards.py) and the shared-memory names (shm.py) are reached through :func:`streaming` where they
are used, each covered by its module's tests.

Supported releases: ``streaming-community`` >= 0.14.2 (the maintained fork: same ``import streaming``, same MDS
format, same order) or ``mosaicml-streaming`` >= 0.13 (upstream's last release: it pins ``numpy<2.2`` and deletes
local-only shards under a cache limit; gpufeed never gives it a cache limit for local-only data).
"""

from __future__ import annotations

import functools
import re
from importlib import metadata
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["FIX", "MINIMUM", "EngineMissingError", "get_partitions", "get_shuffle", "release", "streaming"]

FIX = "pip install 'gpufeed[streaming]'"
# distribution -> the oldest release gpufeed's planner and reader were checked against
MINIMUM = {"streaming-community": (0, 14, 2), "mosaicml-streaming": (0, 13, 0)}


class EngineMissingError(ConfigError, ImportError):
    """MosaicML Streaming is not installed, or is a release gpufeed does not support; the message names the fix.
    An ``ImportError`` too, so ``except ImportError`` around an optional feature still catches it."""


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"0.14.2"`` -> ``(0, 14, 2)``; ``"0.13.0rc1"`` -> ``(0, 13, 0)`` (a pre-release counts as its release)."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def release() -> tuple[str, str]:
    """``(distribution, version)`` of the installed engine, e.g. ``("streaming-community", "0.14.2")``; the
    distribution is ``"streaming"`` when neither known one is registered (a source checkout)."""
    for name in MINIMUM:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "streaming", str(getattr(streaming(), "__version__", "0"))


@functools.cache
def streaming() -> ModuleType:
    """The ``streaming`` module, imported on first use, its release checked.

    Raises:
        EngineMissingError: ``streaming`` is not installed, or is older than :data:`MINIMUM`.
    """
    try:
        import streaming as module
    except ImportError as e:
        raise EngineMissingError(
            f"gpufeed.stream needs MosaicML Streaming (import streaming failed: {e}); install it with {FIX} "
            "(streaming-community, the maintained fork of mosaicml-streaming)"
        ) from e
    for name, oldest in MINIMUM.items():
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if _version_tuple(found) < oldest:
            wanted = ".".join(map(str, oldest))
            raise EngineMissingError(
                f"{name}=={found} is older than gpufeed supports ({name}>={wanted}); upgrade with {FIX} "
                "(uninstall mosaicml-streaming first: both install the same `streaming` package)"
            )
        break
    return module


def get_partitions(
    num_samples: int,
    num_canonical_nodes: int,
    num_nodes: int,
    ranks_per_node: int,
    batch_size: int,
    drop_first: int,
    initial_physical_nodes: int | None,
) -> np.ndarray:
    """The engine's ``relaxed`` partition of ``num_samples`` over the layout, one worker per rank:
    ``(nodes, ranks_per_node, 1, batches, batch_size)`` of positions in the epoch's stream, ``-1`` = padding."""
    streaming()
    from streaming.base.partition import get_partitions as engine_partitions

    return engine_partitions(
        "relaxed",
        num_samples,
        num_canonical_nodes,
        num_nodes,
        ranks_per_node,
        1,
        batch_size,
        drop_first,
        initial_physical_nodes,
    )


def get_shuffle(
    algo: str, shard_sizes: np.ndarray, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> np.ndarray:
    """The engine's shuffle of an epoch: ``out[position] = sample id`` (shard-aware, per canonical node)."""
    streaming()
    from streaming.base.shuffle import get_shuffle as engine_shuffle

    return engine_shuffle(algo, shard_sizes, num_canonical_nodes, seed, epoch, block_size)


def dataset(**kwargs: Any) -> Any:
    """A ``streaming.StreamingDataset(**kwargs)``: its downloads, cache accounting and eviction, never its
    ``__iter__`` (gpufeed plans the order itself: see ``plan.py``)."""
    return streaming().StreamingDataset(**kwargs)


def bytes_to_int(value: int | str) -> int:
    """``"64mb"`` -> 67108864, the engine's reading of a size (an int passes through)."""
    streaming()
    from streaming.base.util import bytes_to_int as engine_bytes

    return int(engine_bytes(value))
