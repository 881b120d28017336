"""``--data`` of a Hugging Face dataset on disk: a ``save_to_disk`` folder (a Dataset, or a DatasetDict's splits), a
Hub repository's folder (its ``README.md`` card and files, or its ``data/`` folder: split as ``load_dataset`` splits
it, :mod:`gpufeed.mds.hub`; ``--config``) or Parquet files, served as an image folder is: the folder recipes at
``--image-size``, the same models and stores.

A DatasetDict's or a repository's ``train`` split is trained on and its evaluation split (the first of
``validation``, ``valid``, ``val``, ``dev``, ``test``) scored; a single dataset is the training split,
``--val-data`` names the evaluation one (a saved dataset or Parquet files too). The columns are found as
``gf.accelerate`` finds them (:func:`gpufeed.read.hf.find_columns`; ``--image-key``, ``--label-key``). Nothing is
written beside the data (NOTE [ Nothing written beside the data ] in :mod:`gpufeed.mds.hf`).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, DataError

__all__ = ["hf_splits", "hf_subset", "located"]


def located(data: str | None, config: str | None = None) -> Any:
    """The Hugging Face dataset on disk ``--data`` names (a save_to_disk folder, a Hub repository's folder, Parquet
    files: an :class:`~gpufeed.mds.hf.OnDisk`), None for anything else; ``config`` the repository card's config
    (``--config``). A folder's answer lists up to 20,000 of its entries (:mod:`gpufeed.mds.hub`): a command asks
    once and hands the answer on."""
    from ..data.images import KEYWORDS
    from ..data.mds import is_stream
    from ..mds.hf import locate

    if data is None or data in KEYWORDS or is_stream(data):
        return None
    return locate(data, config)


def hf_splits(
    data: str,
    val_data: str | None,
    image_size: int,
    image_key: str | None,
    label_key: str | None,
    config: str | None = None,
    where: Any = None,
) -> tuple[Any, Any | None, str]:
    """``(train, evaluation or None, description)``: :class:`~gpufeed.read.hf.ArrowImages` with the folder
    recipes at ``image_size`` (``.transform``), the evaluation set's classes those of training; ``where`` what
    :func:`located` found for ``data`` (found here when None).

    Raises:
        ConfigError: no training split, no label column, a ``--val-data`` that does not fit.
        DataError: the evaluation set's classes differ from training's, or its labels exceed them.
    """
    from ..data.images import folder_eval, folder_train
    from ..mds.hf import EVAL_SPLITS, locate

    where = where if where is not None else locate(data, config)
    if where is None:
        raise ConfigError(f"--data {data}: not a Hugging Face dataset on disk (a save_to_disk folder, a Hub "
                          "repository's folder, Parquet files)")  # fmt: skip
    val_split = None
    if where.splits:
        if "train" not in where.splits:
            fix = (
                "give the files to train on as --data (a quoted glob of them)"
                if where.layout is not None
                else f"save the split to train on as its own dataset (ds[{where.splits[0]!r}].save_to_disk(DIR)) and "
                "give --data DIR"
            )
            raise ConfigError(f"--data {data}: {where.what}, none named train: {fix}")
        val_split = next((s for s in EVAL_SPLITS if s in where.splits), None)
    train = _images(where, "train" if where.splits else None, image_key, label_key, "--data")
    train.transform = folder_train(image_size)
    test, named = None, None
    if val_data is not None:
        if val_split is not None:
            raise ConfigError(
                f"--val-data: {where.what} has its own {val_split} split, scored as the validation set; drop --val-data"
            )
        other = locate(val_data)
        if other is None:
            raise ConfigError(
                f"--val-data {val_data}: with a Hugging Face --data, the validation set is a Hugging Face dataset too "
                "(a save_to_disk folder, or .parquet files)"
            )
        if other.root == where.root and other.files == where.files:
            raise ConfigError(f"--val-data {val_data} is the training data: accuracy on it says nothing; give another")
        split = next((s for s in EVAL_SPLITS if s in other.splits), None) if other.splits else None
        if other.layout is not None and other.splits == ("train",):  # a folder of files named for no split
            split = "train"
        if other.splits and split is None:
            raise ConfigError(f"--val-data {val_data}: {other.what}, none of them {'/'.join(EVAL_SPLITS)}")
        test, named = _images(other, split, image_key, label_key, "--val-data", train.classes), other.what
    elif val_split is not None:
        test, named = _images(where, val_split, image_key, label_key, "--data", train.classes), f"its {val_split} split"
    if test is not None:
        test.transform = folder_eval(image_size)
        _same_classes(train, test, named or "")
    plain = where.kind == "parquet" and where.layout is None
    shown = f"{'Parquet files' if plain else 'Hugging Face dataset'} {where.shown}"
    if where.splits:
        by = f"{where.kind.capitalize()} files split by {where.layout.how}: " if where.layout is not None else ""
        shown += f" ({by}train split"
        return train, test, shown + (f"; validation: {named})" if named else "; no validation split: accuracy "
                                     "not measured)")  # fmt: skip
    return train, test, shown + (f", validation {named}" if named else " (no --val-data: accuracy not measured)")


def _images(
    where: Any, split: str | None, image_key: str | None, label_key: str | None, option: str, names: Any = None
) -> Any:
    """The split as ArrowImages, its columns found (a message naming the options), labels required: class ids
    (a ClassLabel, integers) or class names (strings, numbered by ``names``, training's, when given)."""
    from ..mds.hf import columns, open_dataset
    from ..read.hf import arrow_images
    from ..read.hf_columns import label_kind

    ds = open_dataset(where, split, image_key)
    what = f"{option} {where.shown}" + (f" ({split} split)" if split else "")
    image, label, classes = columns(ds.features, image_key, label_key, what, explicit_floats=False)
    if label is None:
        raise ConfigError(
            f"{what}: no label column (a ClassLabel, or a column of class ids or names called label, labels or "
            f"target): training and scoring need one; name it with --label-key (its columns: "
            f"{', '.join(ds.column_names)})"
        )
    strings = label_kind(ds.features[label]) == "string"
    images = arrow_images(ds, image, label, classes=names if strings else None)
    if images.classes is None:  # integer labels: the classes are their indices
        images.classes = [str(k) for k in range(max(images.targets, default=-1) + 1)]
    return images


def _same_classes(train: Any, test: Any, named: str) -> None:
    """The validation set's labels mean training's classes: the same ClassLabel names, or integer labels within
    training's classes (which the validation set then shares)."""
    from datasets import ClassLabel

    named_both = all(isinstance(s.hf.features[s.label_key], ClassLabel) for s in (train, test))
    if named_both and test.classes != train.classes:
        only_train = sorted(set(train.classes) - set(test.classes))[:5]
        only_val = sorted(set(test.classes) - set(train.classes))[:5]
        raise DataError(
            f"the class names of training and validation ({named}) differ (only in training: {only_train}, only in "
            f"validation: {only_val}, or their order); a label would mean different classes in each: give both the "
            "same ClassLabel"
        )
    top = max(test.targets, default=-1)
    if top >= len(train.classes):
        raise DataError(
            f"the validation set ({named}) has label {top}, but training has {len(train.classes)} classes: give a "
            "validation set of the same classes"
        )
    test.classes = train.classes


def hf_subset(images: Any, n: int | None) -> Any:
    """``n`` rows spread evenly over ``images`` (as :func:`gpufeed.data.images.folder_subset` spreads a folder's:
    a dataset sorted by class keeps every class), as ArrowImages over ``select`` of them, kept in memory (a
    selection of a memory-mapped dataset would otherwise write its indices file beside the data)."""
    from ..read.hf import arrow_images

    if n is None or n >= len(images):
        return images
    if n < 1:
        raise ConfigError(f"a subset of {n=} samples is empty; use a size >= 1")
    keep = [i * len(images) // n for i in range(n)]
    # class names as strings keep the numbering they had (a validation split's is training's)
    part = arrow_images(images.hf.select(keep, keep_in_memory=True), images.image_key, images.label_key,
                        classes=images.classes)  # fmt: skip
    part.transform, part.classes = images.transform, images.classes
    return part
