"""A Hugging Face Hub repository on disk, split as ``load_dataset`` splits it: which Parquet or Arrow files are
``train``, which ``test``.

A repository downloaded from the Hub (``huggingface-cli download REPO --repo-type dataset --local-dir DIR``, or a
``snapshot_download`` folder in the Hugging Face cache) holds its data files beside a ``README.md`` card. Its
splits are found as ``datasets.load_dataset(DIR)`` finds them, by ``datasets``' own functions:

1. the card's YAML ``configs:`` (a standalone ``.huggingface.yaml``'s over it, as ``load_dataset`` reads them):
   the config asked, else the default one (``default: true``, or named ``default``, or the only one), its
   ``data_files`` (``- split: train`` / ``path: data/train-*``; or one pattern: all ``train``) or its ``data_dir``;
   several configs and no default is refused, naming them and how to pick one;
2. else the file names: ``data/{split}-00000-of-00002.parquet``, then a split's name in a folder's name
   (``train/``, ``data/test/``) or a file's (``train.parquet``, ``my_valid-1.parquet``; ``valid``/``dev``/``val``
   are ``validation``, ``eval``/``testing`` are ``test``), else every file is ``train``.

Its ``data/`` folder alone reads the same way (its ``train-*``/``test-*`` files are two splits, not one). Each
split's format is the extension the most of its files have among those ``datasets`` reads (Parquet on a tie; a lock
or checksum file beside them is passed over), its files of that format kept, as ``load_dataset`` keeps them; splits
of different formats are refused, as ``load_dataset`` refuses them.

NOTE [ A repository of images is an image folder ]: a repository whose card's configs name image files
(``train/**`` over ``train/<class>/*.jpg``: ``datasets``' imagefolder) is not one of Parquet or Arrow files:
:func:`hub_layout` returns None, and ``--data`` reads it as an image folder, by its folders, as before cards were
read (its ``metadata.csv`` is not read: load it with ``datasets.load_dataset`` for that).

NOTE [ The card's paths stay inside the repository ]: every pattern a card names is a path inside the repository
(absolute paths, ``~``, URLs and ``..`` that leaves it are refused naming the card, the config and the entry), and
every file a card's pattern matches resolves inside it once symlinks are followed (files found by their names alone
are the user's own folder, whose links are the user's, as an image folder's are). A Hugging Face cache snapshot's
files are symlinks into the cache's ``blobs/`` folder beside ``snapshots/``: that cache folder is the repository's
root there.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError

__all__ = ["CARD", "FORMATS", "STANDALONE", "Layout", "datasets_module", "hub_layout"]

CARD = "README.md"
STANDALONE = ".huggingface.yaml"  # configs beside the card, read over it (datasets' REPOYAML_FILENAME)
FORMATS = {".parquet": "parquet", ".arrow": "arrow"}  # what gpufeed reads of the Hub's formats
_LOOKED_AT = 20_000  # directory entries a folder is searched for data files before it is taken for something else
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", re.S)


@dataclass(frozen=True)
class Layout:
    """A repository's splits: ``splits`` ``(name, files)`` in ``load_dataset``'s order (train, validation, test,
    then others), the files in its order; ``fmt`` ``"parquet"`` or ``"arrow"``; ``config`` the card's config read
    (None: no card config), ``card`` the card that said so; ``features`` the card's for it (a ``datasets.Features``
    that ``load_dataset`` casts the files to: a ClassLabel's names), None where it gives none."""

    root: Path
    fmt: str
    splits: tuple[tuple[str, tuple[Path, ...]], ...]
    config: str | None = None
    card: Path | None = None
    features: Any = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)

    def files(self, split: str) -> tuple[Path, ...]:
        return dict(self.splits)[split]

    @property
    def how(self) -> str:
        """How the splits were found, for messages and the data line."""
        if self.card is not None:
            return f"{self.card.name}'s config {self.config!r}"
        return "the file names"


@dataclass(frozen=True)
class _Card:
    path: Path
    configs: dict[str, dict[str, Any]]  # name -> its parameters (data_files, data_dir, default, features)
    infos: dict[str, Any]  # config name -> its DatasetInfo (the card's dataset_info)

    def features(self, config: str | None) -> Any:
        """What the card says the config's columns are: its ``features`` parameter, else its ``dataset_info``'s."""
        own = self.configs.get(config or "default", {}).get("features")
        info = self.infos.get(config or "default")
        return own if own is not None else getattr(info, "features", None)


def _yaml_text(path: Path) -> str | None:
    """A card's or a standalone YAML's text; None where there is none."""
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot be read ({e}); fix or remove it") from None


def _card(root: Path) -> _Card | None:
    """The card's ``configs`` and ``dataset_info``, read by ``datasets``' own readers, with those of a standalone
    ``.huggingface.yaml`` over them (as ``load_dataset`` merges the two); None without either field (checked on the
    texts first: nothing is imported for an image folder). Its ``path`` is the file that holds the configs."""
    card, standalone = root / CARD, root / STANDALONE
    text, extra = _yaml_text(card), _yaml_text(standalone)
    front = _FRONT_MATTER.match(text) if text is not None else None
    parts = [(card, front.group(1) if front is not None else ""), (standalone, extra or "")]
    if not any(re.search(r"^(configs|dataset_info)\s*:", yaml_text, re.M) for _, yaml_text in parts):
        return None
    datasets_module()
    import yaml
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    merged: dict[str, Any] = {}
    holder = card
    try:
        for path, yaml_text in parts:
            fields = yaml.safe_load(yaml_text) or {}
            merged.update(fields)
            holder = path if "configs" in fields else holder
        data = DatasetCardData(**merged)
        configs = MetadataConfigs.from_dataset_card_data(data)
        infos = DatasetInfosDict.from_dataset_card_data(data)
    except Exception as e:  # YAML's and datasets' errors for a malformed card vary
        raise DataError(
            f"{path}: its configs cannot be read ({type(e).__name__}: {e}); fix its YAML, or give the folder of the "
            "data files itself"
        ) from None
    return _Card(holder, dict(configs), dict(infos))


def _holds_data_files(root: Path) -> bool:
    """Whether a Parquet or Arrow file lies in ``root`` or below (hidden and ``__`` folders skipped, as
    ``datasets`` skips them), breadth first, the first ``_LOOKED_AT`` entries: an image folder of a million files
    is not walked to its end."""
    queue, seen = deque([root]), 0
    while queue and seen < _LOOKED_AT:
        try:
            entries = sorted(os.scandir(queue.popleft()), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.name.startswith((".", "__")):
                continue
            if os.path.splitext(entry.name)[1] in FORMATS and entry.is_file():
                return True
            if entry.is_dir():
                queue.append(Path(entry.path))
    return False


def hub_layout(folder: Path, config: str | None = None) -> Layout | None:
    """The splits of ``folder`` (a Hub repository, or any folder of Parquet/Arrow files) as ``load_dataset`` finds
    them (the module's rules); None when it holds no card ``configs`` and no Parquet or Arrow file, or its files
    are images (NOTE [ A repository of images is an image folder ]). ``config``: the card's config to read (default:
    its default one; ignored where None is returned: the caller refuses it then).

    Raises:
        ConfigError: ``config`` not among the card's, several configs and none default, a card path that leaves
            the repository, a config whose files are of a format gpufeed does not read, splits of different
            formats, a split name ``datasets`` refuses, a Hugging Face cache's repository folder (its snapshot is the
            repository), or no files.
    """
    root = folder.resolve()
    if root.name.startswith("datasets--") and (root / "snapshots").is_dir() and (root / "blobs").is_dir():
        _refuse_cache_folder(root)
    card = _card(root)
    configs = card.configs if card is not None else {}
    if not configs and not _holds_data_files(root):
        return None
    datasets_module()
    from datasets.data_files import get_data_patterns, sanitize_patterns

    name, base = None, root
    if card is not None and configs:
        name = _chosen(card.path, configs, config, root)
        params = configs[name]
        if params.get("data_dir"):
            base = _inside(root, str(params["data_dir"]), card.path, name, "data_dir")
        if params.get("data_files") is not None:
            try:
                patterns = sanitize_patterns(params["data_files"])
            except ValueError as e:
                raise DataError(
                    f"{card.path}: config {name!r}'s data_files cannot be read ({e}); fix the card"
                ) from None
            for split, listed in patterns.items():
                for pattern in listed:
                    _inside(base, str(pattern), card.path, name, f"data_files of split {split!r}")
            return _resolve(root, base, patterns, name, card)
    where = f"{card.path}'s config {name!r} (data_dir {base})" if name is not None and card else str(base)
    try:
        patterns = get_data_patterns(base.as_posix())
    except FileNotFoundError:  # datasets' EmptyDatasetError: no data file at all
        raise ConfigError(f"{where}: no data files (Parquet or Arrow) to read") from None
    except ValueError as e:  # a split name read from a file name that datasets refuses (data/test-clean-00000-...)
        raise ConfigError(
            f"{where}: its file names give split names that datasets refuses too ({e}); a split's name is letters, "
            "digits and _: rename the files (test_clean-00000-of-00001.parquet), or add a README.md card whose "
            "configs name the splits (- split: test_clean, path: data/test-clean-*), as load_dataset reads them"
        ) from None
    return _resolve(root, base, patterns, name, card)


def datasets_module() -> Any:
    """The ``datasets`` package, or a ConfigError saying how to install it."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "reading a Hugging Face dataset (a Hub repository, a save_to_disk folder or Parquet files) needs the "
            "datasets package: pip install 'gpufeed[hf]'"
        ) from None
    return datasets


def _chosen(card: Path, configs: dict[str, dict[str, Any]], config: str | None, root: Path) -> str:
    """The config to read: ``config``, else the card's default, as ``datasets`` picks it."""
    if config is not None:
        if config not in configs:
            raise ConfigError(f"config={config!r}: {card} has the configs {list(configs)}; pass one of them")
        return config
    defaults = [n for n, p in configs.items() if len(configs) == 1 or n == "default" or p.get("default")]
    if len(defaults) == 1:
        return defaults[0]
    folders = [n for n in configs if (root / n).is_dir()]
    by_path = f"; or give a config's folder, e.g. {root / folders[0]}" if folders else ""
    which = f"several marked default ({defaults})" if defaults else "none marked default"
    raise ConfigError(
        f"{card} has the configs {list(configs)}, {which}: pick one with --config NAME (config= in Python){by_path}"
    )


def _inside(base: Path, pattern: str, card: Path, config: str, entry: str) -> Path:
    """``pattern`` (a card's path or glob) joined to ``base``, refused unless it stays inside the repository
    (NOTE [ The card's paths stay inside the repository ])."""
    said = f"{card}: config {config!r}'s {entry} {pattern!r}"
    if "://" in pattern or pattern.startswith("~") or posixpath.isabs(pattern) or os.path.isabs(pattern):
        raise ConfigError(
            f"{said} is not a path inside the repository {card.parent}: gpufeed reads only the repository's own "
            "files; fix the card, or download those files into it"
        )
    relative = posixpath.normpath(posixpath.join(base.relative_to(card.parent).as_posix(), pattern))
    if relative == ".." or relative.startswith("../"):
        raise ConfigError(
            f"{said} leaves the repository {card.parent} (it names {relative}): gpufeed reads only the repository's "
            "own files; fix the card"
        )
    return card.parent / relative


def _refuse_cache_folder(root: Path) -> None:
    """A Hugging Face cache's ``datasets--OWNER--NAME`` folder holds every revision downloaded under ``snapshots/``:
    read as one folder (as ``load_dataset`` reads it) they would be one dataset, each row once per revision."""
    try:
        main = (root / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    snapshots = sorted(p.name for p in (root / "snapshots").iterdir() if p.is_dir())
    rev = main if main in snapshots else (snapshots[-1] if snapshots else "REV")
    raise ConfigError(
        f"{root}: a Hugging Face cache's folder of a repository, holding its revisions {snapshots} (read as one, each "
        f"row would come once per revision): give its snapshot: {root / 'snapshots' / rev}"
        + (" (refs/main)" if rev == main else "")
    )


def _home(root: Path) -> Path:
    """Where a repository's files may resolve to: the repository, or a Hugging Face cache's repository folder
    (``datasets--OWNER--NAME``, holding ``snapshots/REV/`` and the ``blobs/`` its files link to)."""
    for parent in (root, *root.parents):
        if parent.parent.name == "snapshots" and parent.parent.parent.name.startswith("datasets--"):
            return parent.parent.parent
    return root


def _resolve(
    root: Path, base: Path, patterns: dict[str, list[str]], config: str | None, read: _Card | None
) -> Layout | None:
    """The files of each split's patterns, by ``datasets``' resolver (the extensions it reads: a lock or checksum
    file beside the data is passed over), checked to lie inside the repository and kept to the one format
    ``load_dataset`` would read; None for image files (an imagefolder repository: read by its folders)."""
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules import _ALL_ALLOWED_EXTENSIONS

    card = read.path if read is not None and config is not None else None
    where = f"{card}'s config {config!r}" if card is not None else str(root)
    try:
        resolved = DataFilesDict.from_patterns(
            patterns, base_path=base.as_posix(), allowed_extensions=_ALL_ALLOWED_EXTENSIONS
        )
    except FileNotFoundError as e:  # a path (no wildcard) that names no file
        raise ConfigError(f"{where}: {e}; fix the card or the files") from None
    home = _home(root)
    splits: dict[str, list[Path]] = {}
    for split, files in resolved.items():
        for f in files:
            path = Path(f)
            # a card's paths are data from the repository's author: a link there must not lead out of it; files
            # found by their names are the user's own folder, where a link to another disk is the user's choice
            # (as in an image folder: gpufeed.inside's links=False)
            if card is not None and not path.resolve().is_relative_to(home):
                raise ConfigError(
                    f"{where}, split {split!r}: {path} resolves to {path.resolve()}, outside the repository {home}: "
                    "gpufeed reads only the repository's own files; replace the link by the file"
                )
            splits.setdefault(str(split), []).append(path)  # datasets' default patterns key by NamedSplit
    formats = {split: _format(files, _ALL_ALLOWED_EXTENSIONS) for split, files in splits.items()}
    if not formats:
        raise ConfigError(f"{where}: no data files (Parquet or Arrow) to read")
    if len(set(formats.values())) > 1:  # load_dataset infers each split's format and refuses a difference
        listed = ", ".join(f"{split}: {ext}" for split, ext in formats.items())
        raise ConfigError(
            f"{where}: its splits are files of different formats ({listed}), which load_dataset refuses too: give "
            "the files of one format (convert the others, or a folder or card config that names one format's)"
        )
    ext = next(iter(formats.values()))
    if ext in _image_extensions():
        return None  # NOTE [ A repository of images is an image folder ]
    if ext not in FORMATS:
        count = sum(p.name.lower().endswith(ext) for files in splits.values() for p in files)
        raise ConfigError(
            f"{where}: its data files are {ext} files ({count:,}); gpufeed reads a repository of Parquet or Arrow "
            "files: load it with datasets.load_dataset and pass the Dataset to gf.accelerate (or "
            "ds.save_to_disk(DIR) and give DIR)"
        )
    kept = tuple((split, tuple(p for p in files if p.name.lower().endswith(ext))) for split, files in splits.items())
    empty = [split for split, files in kept if not files]
    if empty:  # its files only carry the extension inside their names (x.parquet.md5): datasets fails on them
        raise ConfigError(f"{where}: the split(s) {empty} hold no {ext} file (only names with {ext} inside); fix them")
    return Layout(root, FORMATS[ext], kept, config, card, read.features(config) if read is not None else None)


def _format(files: list[Path], known: list[str]) -> str:
    """A split's format as ``datasets`` infers it: the most common extension datasets reads among its files' suffixes
    (``x.parquet.lock`` counts as Parquet), an imagefolder's metadata files not counted, Parquet on a tie, then Arrow
    (``infer_module_for_data_files_list``)."""
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    metadata = set(ImageFolder.METADATA_FILENAMES)
    counts = Counter(
        suffix
        for p in files
        if p.name not in metadata
        for suffix in ("." + part.lower() for part in p.name.split(".")[1:])
        if suffix in known
    )
    if not counts:  # only metadata files
        return os.path.splitext(files[0].name)[1].lower()
    return max(counts, key=lambda e: (counts[e], e == ".parquet", e == ".arrow", e))


def _image_extensions() -> set[str]:
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return {e.lower() for e in ImageFolder.EXTENSIONS}
