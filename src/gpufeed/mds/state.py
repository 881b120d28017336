"""gpufeed's stream state: where a run is in its epochs, JSON-able, with the engine's own five keys nested inside.

A state records global samples consumed, not batches: ``sample_in_epoch`` is the number of the epoch's stream
positions all ranks together have served (a multiple of the global batch size), so it resumes at any world size:
the plan from that position (``plan.plan_epoch``) holds exactly the global batches the uninterrupted run had left.

Layout (``"format": "gpufeed.stream/1"``)::

    {"format": "gpufeed.stream/1",
     "global_batch_size": 256, "seed": 0,                       # the augmentation seed
     "dataset": {"fingerprint": "<sha1 of the index>", "samples": 1281167},
     "order": {"shuffle": true, "shuffle_algo": "py1e", "shuffle_block_size": 262144},
     "engine": {"epoch": 3, "sample_in_epoch": 51200, "num_canonical_nodes": 8,
                "shuffle_seed": 9176, "initial_physical_nodes": 2},   # exactly StreamingDataset.state_dict()'s keys
     "engine_release": "streaming-community 0.14.2"}

``state["engine"]`` is what ``StreamingDataset.load_state_dict`` takes, and :func:`load_stream_state` takes a
``StreamingDataLoader``'s state (those five keys alone) as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError, StateError
from .plan import StreamSettings, stream_length

__all__ = ["ENGINE_KEYS", "FORMAT", "Resume", "load_stream_state", "stream_state"]

FORMAT = "gpufeed.stream/1"
ENGINE_KEYS = ("epoch", "sample_in_epoch", "num_canonical_nodes", "shuffle_seed", "initial_physical_nodes")


def stream_state(
    settings: StreamSettings,
    *,
    epoch: int,
    sample_in_epoch: int,
    initial_physical_nodes: int,
    fingerprint: str,
    num_samples: int,
    seed: int,
    engine_release: str = "",
) -> dict[str, Any]:
    """The state of a run at ``epoch`` after ``sample_in_epoch`` global samples (``plan.sample_in_epoch_after(k)``).

    ``initial_physical_nodes``: the node count of the run's first epoch (``Resume.initial_physical_nodes`` once
    resumed, else this run's); ``fingerprint`` and ``num_samples``: the index's (``Index.fingerprint``);
    ``seed``: the augmentation seed.
    """
    if sample_in_epoch % settings.global_batch_size:
        raise StateError(
            f"sample_in_epoch={sample_in_epoch} is not a multiple of global_batch_size={settings.global_batch_size}"
        )
    return {
        "format": FORMAT,
        "global_batch_size": settings.global_batch_size,
        "seed": seed,
        "dataset": {"fingerprint": fingerprint, "samples": num_samples},
        "order": {
            "shuffle": settings.shuffle,
            "shuffle_algo": settings.shuffle_algo,
            "shuffle_block_size": settings.block_size,
        },
        "engine": {
            "epoch": epoch,
            "sample_in_epoch": sample_in_epoch,
            "num_canonical_nodes": settings.num_canonical_nodes,
            "shuffle_seed": settings.shuffle_seed,
            "initial_physical_nodes": initial_physical_nodes,
        },
        "engine_release": engine_release,
    }


@dataclass(frozen=True)
class Resume:
    """Where to continue: plan ``epoch`` from ``sample_in_epoch`` with ``settings`` and ``initial_physical_nodes``.

    ``settings`` are the caller's with the state's order settings in place (the saved run's order continues, as
    the engine does with its ``num_canonical_nodes`` and ``shuffle_seed``); ``adopted`` names each one that changed,
    ``name -> (caller's, state's)``, so a loader can say so.
    """

    epoch: int
    sample_in_epoch: int
    initial_physical_nodes: int | None
    settings: StreamSettings
    adopted: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def _int(obj: Mapping[str, Any], key: str, minimum: int, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StateError(f"state{where}[{key!r}]={value!r} must be an int >= {minimum}; it is not a stream state")
    return value


def load_stream_state(
    state: Mapping[str, Any], settings: StreamSettings, *, fingerprint: str, num_samples: int, seed: int
) -> Resume:
    """Where ``state`` (from :func:`stream_state`, or a ``StreamingDataLoader``'s five keys) resumes this data.

    Raises:
        StateError: the state is not a stream state, or was saved with another global batch size, dataset or seed
            (the message says which and both values), or its position is not a global batch boundary of this data.

    Example:
        >>> s = StreamSettings(global_batch_size=8, num_canonical_nodes=2)
        >>> saved = stream_state(s, epoch=1, sample_in_epoch=16, initial_physical_nodes=1, fingerprint="ab",
        ...                      num_samples=40, seed=0)
        >>> r = load_stream_state(saved, s, fingerprint="ab", num_samples=40, seed=0)
        >>> r.epoch, r.sample_in_epoch, r.initial_physical_nodes
        (1, 16, 1)
    """
    if not isinstance(state, Mapping):
        raise StateError(f"state is a {type(state).__name__}, not the dict a stream loader's state_dict() returned")
    ours = state.get("format") == FORMAT
    if not ours and "format" in state:
        raise StateError(f"state format={state.get('format')!r} is not {FORMAT!r}; it is not a stream state")
    inner = state.get("engine") if ours else state
    if not isinstance(inner, Mapping) or not set(ENGINE_KEYS) - {"initial_physical_nodes"} <= set(inner):
        raise StateError(
            f"state has keys {sorted(state)}: a stream state has 'format': {FORMAT!r} (gpufeed's), or the engine's "
            f"keys {list(ENGINE_KEYS)} (a StreamingDataLoader's state_dict())"
        )
    where = "['engine']" if ours else ""
    epoch = _int(inner, "epoch", 0, where)
    position = _int(inner, "sample_in_epoch", 0, where)
    adopted: dict[str, tuple[Any, Any]] = {}
    new: dict[str, Any] = {
        "num_canonical_nodes": _int(inner, "num_canonical_nodes", 1, where),
        "shuffle_seed": _int(inner, "shuffle_seed", 0, where),
    }
    if ours:
        differs = [
            f"{name}={state.get(name)!r} (this run: {mine!r})"
            for name, mine in (("global_batch_size", settings.global_batch_size), ("seed", seed))
            if state.get(name) != mine
        ]
        dataset = state.get("dataset") or {}
        if dataset.get("fingerprint") != fingerprint or dataset.get("samples") != num_samples:
            differs.append(
                f"dataset {dataset.get('samples')} samples, index {str(dataset.get('fingerprint'))[:12]} (this run: "
                f"{num_samples} samples, index {fingerprint[:12]})"
            )
        if differs:
            raise StateError(
                f"state was saved with {'; '.join(differs)}: resuming it here would not continue the saved run; "
                "resume with the same data, global batch size and seed, or start a new run without the state"
            )
        order = state.get("order") or {}
        new.update({k: order[k] for k in ("shuffle", "shuffle_algo", "shuffle_block_size") if k in order})
    for name, value in new.items():
        mine = settings.block_size if name == "shuffle_block_size" else getattr(settings, name)
        if value != mine:
            adopted[name] = (mine, value)
    try:
        effective = replace(settings, **new)
    except ConfigError as e:  # a value StreamSettings refuses (an unknown shuffle_algo, a block of 0)
        raise StateError(f"state['order'] or state{where}: {e}; it is not a stream state gpufeed wrote") from None
    if position % effective.global_batch_size:
        raise StateError(
            f"state{where}['sample_in_epoch']={position} is not a multiple of global_batch_size="
            f"{effective.global_batch_size}: it was saved with another global batch size, which gpufeed cannot "
            "continue; resume with the batch size it was saved with"
        )
    if position > stream_length(num_samples, effective.num_canonical_nodes):
        raise StateError(f"state{where}['sample_in_epoch']={position} is past this dataset's {num_samples} samples")
    initial = inner.get("initial_physical_nodes")
    if initial is not None:
        initial = _int(inner, "initial_physical_nodes", 1, where)
    return Resume(epoch, position, initial, effective, adopted)
