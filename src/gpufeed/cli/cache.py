"""``gpufeed cache build|info|verify|clear``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .common import add_data_arguments, load_data, positive

HELP = "build, inspect, verify or clear persistent caches of a dataset's deterministic transform"
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def add_arguments(p: argparse.ArgumentParser) -> None:
    root_help = "cache root (default: $GPUFEED_CACHE_DIR or $XDG_CACHE_HOME/gpufeed)"
    p.add_argument("--cache-dir", type=lambda t: Path(t).expanduser(), default=None, help=root_help)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser(
        "build", help="cache the training set's deterministic transform (an image folder: its decoded images or files)"
    )
    add_data_arguments(b)
    b.add_argument("--resize", type=positive, default=None, help="add a deterministic Resize(N) + CenterCrop(32) first")
    b.add_argument("--path", type=Path, default=None, help="the entry's directory (default: under the cache root)")
    b.add_argument(
        "--store",
        choices=["auto", "pixels", "jpeg"],
        default="auto",
        help="image folders: decoded pixels or the files' bytes (auto: pixels; as accelerate(store=...))",
    )
    b.add_argument("--max-side", type=positive, default=None, help="image folders: downscale once (accelerate's)")
    b.add_argument(
        "--device",
        default=None,
        help="image folders: the device training will use (store='auto' decides against its memory; default: cuda "
        "if available)",
    )
    for name, text in [
        ("info", "list entries: size, the data each holds (folder or dataset), store kind, last use"),
        ("verify", "check every byte of entries against their hashes (--data DIR: and against the folder's files)"),
        ("clear", "delete entries and leftovers of interrupted builds"),
    ]:
        q = sub.add_parser(name, help=text)
        q.add_argument("paths", nargs="*", type=Path, help="entries (default: all under the cache root)")
    sub.choices["verify"].add_argument(
        "--data",
        type=lambda t: Path(t).expanduser(),
        default=None,
        metavar="DIR",
        help="also re-read the image folder DIR and compare its files with what its entries were built from "
        "(names the files replaced, changed, removed or added since)",
    )
    for q in sub.choices.values():  # also after the action; SUPPRESS keeps a value given before it
        q.add_argument("--cache-dir", type=lambda t: Path(t).expanduser(), default=argparse.SUPPRESS, help=root_help)


def _root(args: argparse.Namespace) -> Path:
    """The cache root; one that exists but cannot be looked into (a loop of symbolic links, no right to enter it)
    is an error, not a root without entries."""
    from ..cache import default_cache_dir
    from ..errors import ConfigError

    root: Path = args.cache_dir or default_cache_dir()
    try:
        os.stat(root)
    except FileNotFoundError:  # nothing cached there yet
        pass
    except OSError as e:
        given = "--cache-dir" if args.cache_dir else "the cache root ($GPUFEED_CACHE_DIR or $XDG_CACHE_HOME/gpufeed)"
        raise ConfigError(
            f"{given} {root} cannot be looked at ({e.strerror or e}): a symbolic link on its way points back at "
            "itself, or a directory on it may not be entered by this user; give a cache root you can read"
        ) from None
    return root


def _entries(args: argparse.Namespace) -> list[Path]:
    from ..cache import list_entries

    return list(args.paths) or list_entries(_root(args))


def run(args: argparse.Namespace) -> int:
    return {"build": _build, "info": _info, "verify": _verify, "clear": _clear}[args.action](args)


def _build(args: argparse.Namespace) -> int:
    import torchvision.transforms as T

    from ..data.images import is_folder
    from ..data.mds import is_stream
    from ..pipeline.build import build_cache

    if is_stream(args.data):
        from ..errors import ConfigError

        raise ConfigError(
            f"--data {args.data} is an MDS dataset: gpufeed keeps no cache of it (gpufeed.stream decodes each batch; "
            "the engine caches a remote's shards in --local); build caches of CIFAR-10 or image folders"
        )
    if is_folder(args.data):
        return _build_folder(args)
    if args.store != "auto" or args.max_side is not None or args.device is not None:
        from ..errors import ConfigError

        raise ConfigError("--store, --max-side and --device apply to image folders (--data DIR)")

    prefix = [T.Resize(args.resize), T.CenterCrop(32)] if args.resize else []
    transform = T.Compose(
        [*prefix, T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    ds = load_data(args, train=True, transform=transform)
    cache = build_cache(ds, args.path, root=args.cache_dir)
    print(
        f"built {cache.path}: {len(cache.labels)} samples {tuple(cache.images.shape[1:])} {cache.images.dtype}, "
        f"{cache.nbytes / 2**20:.1f} MiB, verified"
    )
    return 0


def _build_folder(args: argparse.Namespace) -> int:
    """The entry ``accelerate`` opens for the folder's training recipe: built here once, a hit afterwards."""
    from ..errors import ConfigError
    from ..pipeline.accelerate import accelerate

    if args.path is not None or args.resize is not None:
        raise ConfigError(
            "--path and --resize are CIFAR-10's; an image folder's entry goes under the cache root (--cache-dir), "
            "named by its files and recipe, so that accelerate finds it"
        )
    import warnings

    from ..errors import CacheNotWrittenWarning

    ds = load_data(args, train=True)
    with warnings.catch_warnings(record=True) as caught:  # accelerate keeps the data in memory, with a warning
        warnings.simplefilter("always")
        loader = accelerate(  # as train would call it, so that its store and key are train's
            ds,
            batch_size=1,
            device=args.device,
            cache=args.cache_dir or True,
            store=args.store,
            max_side=args.max_side,
            progress=True,
        )
    unwritten = [w.message.error for w in caught if isinstance(w.message, CacheNotWrittenWarning)]
    for w in caught:  # the others, as they were
        if not isinstance(w.message, CacheNotWrittenWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    plan = loader.plan
    assert plan is not None  # accelerate() constructs every loader with its plan
    if plan.cache_path is None and unwritten:  # building the entry was the command's whole point: its error, alone
        raise unwritten[0]
    if plan.cache_path is None:
        raise ConfigError(f"nothing was written to the cache ({'; '.join(plan.notes) or 'see the plan'})")
    done = "found (already built)" if plan.ingest.startswith("cache hit") else "built"
    print(f"{done} {plan.cache_path}: {len(ds):,} images, {plan.layout or plan.stored_dtype}, verified")
    return 0


def _info(args: argparse.Namespace) -> int:
    from datetime import datetime

    from ..cache.format import Manifest
    from ..cache.usage import LIMIT_ENV, cache_limit, describe, entry_bytes, last_use
    from ..errors import CacheError

    entries, invalid, total = _entries(args), 0, 0
    if not entries:
        print(f"no cache entries under {_root(args)}")
    kinds = {
        "pixels": "decoded pixels, each image its own size",
        "jpeg": "the image files' bytes",
        "dense": "images of one size",
    }
    for path in entries:
        size = entry_bytes(path)
        total += size
        try:
            m = Manifest.read(path)
        except CacheError as e:
            print(f"{path}\n  INVALID: {e}")
            invalid += 1
            continue
        used = datetime.fromtimestamp(last_use(path)).isoformat(sep=" ", timespec="seconds")
        kind = m.meta.get("store", "dense")
        print(f"{path}\n  source: {describe(path)}")
        print(f"  {size / 2**20:.1f} MiB  last use {used}  created {m.meta.get('created', '?')}  key {m.key[:20]}")
        images = m.arrays.get("images")
        if kind in ("pixels", "jpeg"):
            print(f"  store: {kinds[kind]}, {m.arrays['labels'].shape[0]:,} images")
        elif images is not None:
            ingest = m.meta.get("ingest", "?")
            print(f"  store: {kinds['dense']}, {images.dtype} {tuple(images.shape)}  ingest: {ingest}")
        if m.meta.get("skipped"):
            print(f"  skipped: {len(m.meta['skipped']):,} files that cannot be used (on_error='skip')")
        print(f"  cached: {', '.join(m.meta.get('cached', [])) or 'nothing (stored as read)'}")
    limit = cache_limit()
    if entries:
        bound = f", {LIMIT_ENV}={limit / 2**30:.2f} GiB" if limit is not None else f" (no {LIMIT_ENV})"
        print(f"{len(entries)} entries, {total / 2**30:.2f} GiB{bound}")
    from ..augment.compiler import cache_usage

    inductor, kernel_bytes = cache_usage()  # not gpufeed's: torch's, named so that a person knows what else is stored
    mib = kernel_bytes / 2**20
    print(f"compiled kernels (torch Inductor's cache, TORCHINDUCTOR_CACHE_DIR): {inductor}, {mib:.1f} MiB")
    return 1 if invalid else 0


def _verify(args: argparse.Namespace) -> int:
    from ..errors import CacheError
    from ..store.entry import verify_cache

    if args.data is not None:
        return _verify_data(args)
    bad = 0
    for path in _entries(args):
        try:
            c = verify_cache(path)
            print(f"OK   {path} ({c.nbytes / 2**20:.1f} MiB)")
        except CacheError as e:
            bad += 1
            print(f"BAD  {path}: {e}", file=sys.stderr)
    return 1 if bad else 0


def _verify_data(args: argparse.Namespace) -> int:
    """The entries of the folder ``--data`` (and its splits), each checked and compared with its files."""
    from ..cache.content import compare_folder, entry_folder
    from ..cache.format import Manifest
    from ..errors import CacheError, ConfigError
    from ..store.entry import verify_cache

    try:
        data = args.data.resolve()
        folder = data.is_dir()
    except (OSError, RuntimeError) as e:  # a loop of symbolic links (Python < 3.13: RuntimeError), no right to look
        raise ConfigError(
            f"--data {args.data}: cannot be resolved ({e}); give the image folder the entries were built from"
        ) from None
    if not folder:
        raise ConfigError(f"--data {args.data}: not a directory; give the image folder the entries were built from")
    checked, bad = 0, 0
    for path in _entries(args):
        try:
            folder = entry_folder(path)
        except CacheError:
            folder = None
        if folder is None or not folder.is_relative_to(data):
            continue
        if "names" not in Manifest.read(path).arrays:
            print(
                f"SKIP {path}: it records no hashes of its files (built before gpufeed recorded them, or not a "
                f"folder's files); clear it (gpufeed cache clear {path}) and build it again to compare it",
                file=sys.stderr,
            )
            continue
        checked += 1
        try:
            verify_cache(path)
            result = compare_folder(path)
        except CacheError as e:
            bad += 1
            print(f"BAD  {path}: {e}", file=sys.stderr)
            continue
        if result.ok:
            print(f"OK   {path}: its {result.files:,} files in {folder} are the ones it was built from")
            continue
        bad += 1
        lines = "\n".join(f"  {why}" for why in result.changed)
        print(
            f"DIFFERS {path}: {len(result.changed):,} files of {folder} are not what it was built from:\n{lines}\n"
            f"  remove the entry (gpufeed cache clear {path}); the next run builds it from the files as they are",
            file=sys.stderr,
        )
    if not checked:
        print(f"no cache entry under {_root(args)} holds hashes of files of {data} to compare", file=sys.stderr)
        return 1
    return 1 if bad else 0


def _clear(args: argparse.Namespace) -> int:
    from ..cache import remove_entry
    from ..cache.manage import is_leftover
    from ..errors import CacheError

    root = _root(args)
    targets = list(args.paths) or (_entries(args) + sorted(p for p in root.glob(".*") if is_leftover(p)))
    failed = 0
    for path in targets:
        try:
            remove_entry(path)
            print(f"removed {path}")
        except CacheError as e:
            failed += 1
            print(f"kept {path}: {e}", file=sys.stderr)
    return 1 if failed else 0
