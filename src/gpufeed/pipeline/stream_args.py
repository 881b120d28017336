"""``gf.stream``'s arguments, every one checked before a shard, an index or a credential is looked for: a typo is a
ConfigError naming it, not a StorageError after a network round trip (an outside trial found 8 of 26 bad arguments
refused only after the remote had been asked, and raw errors for ``layout='2 nodes'``, a ``local`` that is a file
or a symlink loop, and ``S3_ENDPOINT_URL='not a url'``).

Example:
    >>> check_loader_arguments(seed=0, dtype=None, channels_last=False, drop_last=True, shuffle=True, num_classes=10,
    ...                        ahead=2, prefetch_shards=4, layout=None, image_key="image", label_key="label",
    ...                        mix=None, views=1)
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import torch

from ..augment.mix import as_mix
from ..errors import ConfigError
from ..mds.plan import Layout
from ..validate import as_flag, as_int, as_seed, as_views

__all__ = ["ENDPOINT_ENV", "MAX_AHEAD", "MAX_PREFETCH_SHARDS", "check_endpoint", "check_loader_arguments", "check_hash"]

ENDPOINT_ENV = "S3_ENDPOINT_URL"  # the engine's S3 client reads it (another S3-compatible store)
# batches decoded ahead are held in memory (a batch of 256 photos decoded is hundreds of MB); shards fetched ahead
# fill local (64 MiB each by default): more than these is a typo, not a setting
MAX_AHEAD = 64
MAX_PREFETCH_SHARDS = 1024


def _count(value: Any, name: str, most: int, why: str) -> int:
    count = as_int(value, name, 1)
    if count > most:
        raise ConfigError(f"{name}={count:,} is more than gpufeed allows ({most}): {why}; pass a smaller count")
    return count


def check_loader_arguments(
    *,
    seed: Any,
    dtype: Any,
    channels_last: Any,
    drop_last: Any,
    shuffle: Any,
    num_classes: Any,
    ahead: Any,
    prefetch_shards: Any,
    layout: Any,
    image_key: Any,
    label_key: Any,
    mix: Any,
    views: Any,
) -> None:
    """A ConfigError naming the first argument of these that :class:`~gpufeed.loading.stream.StreamLoader` would
    refuse once the shards are open (the same rules, checked first)."""
    as_seed(seed)  # NOTE [ Seeds, epochs and batch sizes ] in gpufeed.validate
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(f"dtype={dtype!r} must be a torch.dtype (e.g. torch.float32), torch.uint8 or None")
    if dtype is not None and dtype != torch.uint8 and not dtype.is_floating_point:
        raise ConfigError(f"dtype={dtype} must be None, torch.uint8 or a floating dtype (images are 0..1 or 0..255)")
    for name, flag in (("channels_last", channels_last), ("drop_last", drop_last), ("shuffle", shuffle)):
        as_flag(flag, name)
    if num_classes is not None:
        as_int(num_classes, "num_classes", 1)
    _count(ahead, "ahead", MAX_AHEAD, "each batch read ahead is kept decoded in memory")
    _count(prefetch_shards, "prefetch_shards", MAX_PREFETCH_SHARDS, "each shard fetched ahead takes room in local")
    if layout is not None and not isinstance(layout, Layout):
        raise ConfigError(
            f"layout={layout!r} must be a gpufeed.mds.plan.Layout (Layout.of_rank(rank, world_size, ranks_per_node)) "
            "or None (from the process group and torchrun's LOCAL_WORLD_SIZE)"
        )
    if not isinstance(image_key, str):
        raise ConfigError(f"image_key={image_key!r} must be the name of the image column (a str)")
    if label_key is not None and not isinstance(label_key, str):
        raise ConfigError(f"label_key={label_key!r} must be the name of the label column (a str), or None")
    mixed = as_mix(mix, num_classes) is not None
    if as_views(views) > 1 and mixed:
        raise ConfigError("mix= mixes one batch of images with its labels; with views > 1 mix each view yourself")
    if mixed and label_key is None:
        raise ConfigError("mix= mixes images with their labels, but label_key=None reads none: give the label column")


def check_endpoint(remote: Any, env: dict[str, str] | None = None) -> None:
    """A ConfigError naming ``S3_ENDPOINT_URL`` when ``remote`` is on S3 and the variable is set to something the
    engine's client cannot use as an endpoint (botocore's raw ``ValueError: Invalid endpoint``).

    Example:
        >>> check_endpoint("s3://bucket/data", {"S3_ENDPOINT_URL": "http://127.0.0.1:9000"})
    """
    value = (os.environ if env is None else env).get(ENDPOINT_ENV, "")
    if not (isinstance(remote, str) and remote.startswith("s3://")) or not value:
        return
    parsed = urllib.parse.urlparse(value)
    try:
        port_ok = parsed.port is None or 0 < parsed.port < 65536
    except ValueError:  # a port that is not a number
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise ConfigError(
            f"{ENDPOINT_ENV}={value!r} (in the environment) is not an endpoint URL: set it to your S3-compatible "
            "store's http://host:port (or https://...), or unset it to reach AWS S3"
        )


def check_hash(validate_hash: Any) -> None:
    """A ConfigError unless ``validate_hash`` is None or a hash the engine computes (``sha1``, ``xxh64``, ...).
    Whether the index records that hash of its shards is known once it is fetched (:mod:`gpufeed.mds.shards`)."""
    if validate_hash is None:
        return
    from ..mds.engine import streaming

    streaming()
    from streaming.base.hashing import get_hashes

    names = sorted(get_hashes())
    if not isinstance(validate_hash, str) or validate_hash not in names:
        raise ConfigError(
            f"validate_hash={validate_hash!r} is not a hash the engine computes: pass None (gpufeed convert's "
            f"datasets carry a digest per sample, checked as it is read) or one of {', '.join(names)}"
        )
