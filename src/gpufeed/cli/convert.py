"""``gpufeed convert SRC DST``: an image folder, WebDataset tars or a Hugging Face dataset on disk -> MDS shards
(the streaming engine's format)."""

from __future__ import annotations

import argparse
import sys

from .common import label_key, positive

HELP = (
    "convert an image folder (ImageFolder, Food101), WebDataset tars or a Hugging Face dataset (a save_to_disk "
    "folder, Parquet files) to MDS shards for streaming: each image's bytes copied as they are, resumable, SRC only "
    "read"
)


def _size(text: str) -> int:
    from ..cache.usage import parse_size
    from ..errors import ConfigError

    try:
        return parse_size(text, "--shard-size")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "src",
        metavar="SRC",
        help="an image folder (SRC/<class>/<files>), a Food101 folder (images/ and meta/), WebDataset tars (a "
        "tar, a folder of tars, or a quoted glob: 'DIR/train-*.tar'), or a Hugging Face dataset: a save_to_disk "
        "folder, a Hub repository's folder or any folder of Parquet/Arrow files (split as load_dataset splits it), "
        "a .parquet file, or a quoted glob; only read",
    )
    p.add_argument("dst", metavar="DST", help="a new or empty folder, or the DST of an interrupted run (it resumes)")
    p.add_argument(
        "--shard-size",
        type=_size,
        default="64M",
        metavar="BYTES",
        help="bytes per shard, e.g. 64M (default, as the engine's) or 256M",
    )
    p.add_argument(
        "--compression",
        default=None,
        help="the engine's shard compression, e.g. zstd (default none: JPEG does not compress)",
    )
    p.add_argument(
        "--samples-per-part",
        type=positive,
        default=None,
        metavar="N",
        help="source samples per part, the unit an interrupted run redoes (default 2000; a part never spans two tars)",
    )
    p.add_argument(
        "--split",
        default=None,
        metavar="NAME",
        help="the split to convert: of a Food101 folder train (default) or test; of a Hugging Face DatasetDict "
        "(save_to_disk) or Hub repository one of its splits (default train)",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="NAME",
        help="of a Hub repository's folder (its README.md card's configs): the config to convert (default: the one "
        "marked default, or the only one)",
    )
    p.add_argument(
        "--image-key",
        default=None,
        metavar="COLUMN",
        help="a Hugging Face dataset's image column (default: its one Image column; of Parquet written by other "
        "tools, a struct<bytes, path> or binary column named here)",
    )
    p.add_argument(
        "--label-key",
        type=label_key,
        default="auto",
        metavar="COLUMN",
        help="a Hugging Face dataset's label column (default: its ClassLabel, else an integer column named label, "
        "labels or target); none: no labels (-1)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="leave out samples that are not images (listed in DST/gpufeed.json) instead of stopping at the first",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..mds.convert import DEFAULT_SAMPLES_PER_PART, convert

    try:
        result = convert(
            args.src,
            args.dst,
            shard_size=args.shard_size,
            compression=args.compression,
            samples_per_part=args.samples_per_part or DEFAULT_SAMPLES_PER_PART,
            split=args.split,
            progress=not args.quiet,
            skip_bad=args.skip_bad,
            image_key=args.image_key,
            label_key=args.label_key,
            config=args.config,
        )
    except KeyboardInterrupt:
        print("the finished parts are kept: run the same command again to resume", file=sys.stderr)
        raise
    kinds = {
        "folder": "image folder",
        "food101": "Food101",
        "wds": "WebDataset tars",
        "hf": "Hugging Face dataset",
        "parquet": "Parquet files",
        "arrow": "Arrow files",
    }
    what = kinds.get(result.kind, result.kind)
    if result.split:
        what += f", split {result.split}"
    if result.classes is not None:
        what += f", {len(result.classes):,} classes"
    types = ", ".join(f"{kind} {n:,}" for kind, n in result.image_types.items())
    if result.finished:
        print(
            f"{result.dst} already holds the conversion of {result.source} ({what}): {result.samples:,} samples "
            f"({types}); nothing to do (delete it to convert again)"
        )
        return 0
    rate = result.samples / result.seconds if result.seconds > 0 else 0.0
    resumed = f", {result.reused_parts} of them from the interrupted run" if result.reused_parts else ""
    print(
        f"converted {result.source} ({what}) -> {result.dst}: {result.samples:,} samples ({types}) in "
        f"{result.parts:,} parts{resumed}, {result.seconds:.1f} s ({rate:,.0f} samples/s)"
    )
    if result.skipped:
        print(f"left out {len(result.skipped):,} samples that are not images (listed in {result.dst}/gpufeed.json):")
        for s in result.skipped[:5]:
            print(f"  {s['why']}")
    print(
        f"read it with: gpufeed train --data {result.dst} (or upload it and give --data s3://..., --local DIR), or "
        f"gf.stream(local={str(result.dst)!r}, transform=..., batch_size=...)"
    )
    return 0
