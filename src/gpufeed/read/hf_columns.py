"""Which columns of a Hugging Face dataset gpufeed reads, and what its labels are.

The image column is the one ``Image`` feature (``Image(decode=False)`` too: the bytes are the same, gpufeed decodes
them as ``Image()`` would). The label column (``label_key="auto"``) is the ``ClassLabel``, else the one column named
``label``/``labels``/``target``/... that holds class ids or class names. What each kind of label column becomes:

==================  ==================================================================================================
``ClassLabel``      its indices; ``classes`` its names
integers, bools     the integers (int64)
strings             class indices by the names' sorted order, as ``ImageFolder`` sorts class folders and
                    ``ds.class_encode_column(name)`` numbers them: ``classes`` the sorted names of the whole Arrow
                    table (a ``select``/``filter``/``train_test_split`` view numbers as its dataset does, so both
                    halves of a split agree), stated in ``loader.plan`` and part of the cache key
floats              refused under ``"auto"``: a float column may be class ids stored as floats or a regression
                    target, and either guess goes wrong without a word. Named by ``label_key=``, it is served as
                    float32 targets, as ``ds.with_format("torch")`` gives them (the plan says so)
none                batches are the images alone, and the plan says so, naming the columns not read
==================  ==================================================================================================

A null label, a ClassLabel's -1 (its missing value) or a NaN is refused naming the row: gpufeed never guesses one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError

__all__ = ["AUTO", "LABEL_NAMES", "Labels", "find_columns", "label_kind", "read_labels"]

AUTO: Any = "auto"  # label_key: the ClassLabel, else the one column named label/labels/target/... of ids or names
LABEL_NAMES = ("label", "labels", "target", "targets", "fine_label", "coarse_label")
_PREVIEW = 6  # class names shown in the plan's line


def label_kind(feature: Any) -> str:
    """``"class"`` (a ClassLabel), ``"integer"`` (ints, bools), ``"string"``, ``"float"`` or ``"other"`` (a list, a
    dict, an image...): what gpufeed makes of a column used as the labels."""
    from datasets import ClassLabel, Value

    if isinstance(feature, ClassLabel):
        return "class"
    if not isinstance(feature, Value):
        return "other"
    if feature.dtype.startswith(("int", "uint")) or feature.dtype == "bool":
        return "integer"
    if feature.dtype in ("string", "large_string"):
        return "string"
    if feature.dtype.startswith("float"):
        return "float"
    return "other"


def _shown(feature: Any) -> str:
    """A feature as a message names it: ``Value('float32')``, ``ClassLabel(3 names)``, ``List(Value('int64'))``."""
    from datasets import ClassLabel, Value

    if isinstance(feature, Value):
        return f"Value({feature.dtype!r})"
    if isinstance(feature, ClassLabel):
        return f"ClassLabel({feature.num_classes} names)"
    return type(feature).__name__


def _float_refused(key: str, feature: Any, how: str) -> ConfigError:
    return ConfigError(
        f"{how} {key!r} holds {_shown(feature)} values: class ids stored as floats, or a regression target? gpufeed "
        f"will not guess. Class ids: cast them, ds = ds.cast_column({key!r}, datasets.Value('int64')) (or a "
        f"ClassLabel); a regression target: pass label_key={key!r} and it is served as float32 targets; no labels: "
        "label_key=None"
    )


def find_columns(
    features: Any, image_key: str | None = None, label_key: str | None = AUTO, explicit_floats: bool = True
) -> tuple[str, str | None, list[str] | None]:
    """``(image_key, label_key, classes)`` of a dataset's ``features`` (a ``datasets.Features``), by the rules the
    module states; ``classes`` the ``ClassLabel``'s names (None for any other label column: a string column's are
    read from its values by :func:`read_labels`). ``gpufeed convert`` and ``--data`` read a Hugging Face dataset on
    disk by the same rules, so every entry point names the same columns. ``explicit_floats``: a float column named
    by ``label_key`` is accepted (False where only class indices can be kept: MDS shards, the CLI's classifier).

    Raises:
        ConfigError: no (or several) Image columns and no ``image_key``; a key that is not a column, or a column
            of the wrong kind; several label columns; a float column under ``"auto"``. The message lists the
            columns and the argument to pass.
    """
    from datasets import ClassLabel, Image

    described = ", ".join(f"{k} ({type(f).__name__})" for k, f in features.items())
    images = [k for k, f in features.items() if isinstance(f, Image)]
    if image_key is None:
        if len(images) != 1:
            which = f"{len(images)} Image columns ({images})" if images else "no Image column"
            raise ConfigError(
                f"the dataset has {which}; its columns: {described}. Pass image_key= (a column of encoded images: "
                "cast one with ds.cast_column(name, datasets.Image()))"
            )
        image_key = images[0]
    elif image_key not in features:
        raise ConfigError(f"image_key={image_key!r} is not a column of the dataset; its columns: {described}")
    elif not isinstance(features[image_key], Image):
        raise ConfigError(
            f"image_key={image_key!r} is a {features[image_key]!r} column, not an Image: cast it with "
            f"ds.cast_column({image_key!r}, datasets.Image()) if it holds encoded images or their paths"
        )
    if label_key is AUTO:
        label_key = _auto_label(features)
    elif label_key is not None:
        if label_key not in features:
            raise ConfigError(f"label_key={label_key!r} is not a column of the dataset; its columns: {described}")
        kind = label_kind(features[label_key])
        if kind == "other" or (kind == "float" and not explicit_floats):
            what = "float values" if kind == "float" else f"a {features[label_key]!r} column"
            raise ConfigError(
                f"label_key={label_key!r} is {what}; gpufeed reads one class per image (a ClassLabel, integers, or "
                "class names as strings): pass another label_key, or None for images alone"
            )
    labels = features[label_key] if label_key is not None else None
    classes = list(labels.names) if isinstance(labels, ClassLabel) else None
    return image_key, label_key, classes


def _auto_label(features: Any) -> str | None:
    """``label_key="auto"``: the ClassLabel, else the one column named as labels are; several are refused, and a
    named column gpufeed would have to guess the meaning of (floats, lists) too, naming it."""
    from datasets import ClassLabel

    classes = [k for k, f in features.items() if isinstance(f, ClassLabel)]
    if len(classes) > 1:
        raise ConfigError(f"the dataset has several label columns ({classes}); pass label_key= (None: no labels)")
    if classes:
        return classes[0]
    named = [k for k in LABEL_NAMES if k in features]
    if len(named) > 1:
        listed = ", ".join(f"{k} ({_shown(features[k])})" for k in named)
        raise ConfigError(f"the dataset has several label columns ({listed}); pass label_key= (None: no labels)")
    if not named:
        return None
    key, kind = named[0], label_kind(features[named[0]])
    if kind == "float":
        raise _float_refused(key, features[key], "the label column")
    if kind == "other":
        raise ConfigError(
            f"the label column {key!r} is {_shown(features[key])}, not one class per image (a ClassLabel, integers or "
            "class names): pass label_key=None for images alone, or label_key= another column"
        )
    return key


@dataclass(frozen=True)
class Labels:
    """A dataset's labels as gpufeed serves them: ``values`` one per row (int64 class indices, or float32
    targets), ``classes`` their names where known, and the plan's ``note`` on how they were read."""

    values: np.ndarray
    classes: list[str] | None
    note: str

    @property
    def is_float(self) -> bool:
        return self.values.dtype.kind == "f"


def read_labels(
    ds: Any, label_key: str | None, rows: np.ndarray, classes: list[str] | None, what: str, image_key: str
) -> Labels:
    """The labels of ``ds``'s rows ``rows`` (positions in its Arrow table) from ``label_key`` (see the module's
    table); ``classes`` a string column's names given by another split (the CLI numbers a validation split by
    training's), else found here.

    Raises:
        DataError: a row without a label (null, a ClassLabel's -1, NaN), or a class name ``classes`` lacks; the
            message names the row, the value and the fix.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if label_key is None:
        others = [f"{k} ({_shown(f)})" for k, f in ds.features.items() if k != image_key]
        unread = f"; the columns not read: {', '.join(others)}" if others else ""
        note = (
            f"labels: none (no ClassLabel, nor a column named {'/'.join(LABEL_NAMES[:3])}/...): batches are the "
            f"images alone{unread}; pass label_key=COLUMN to read one"
        )
        return Labels(np.zeros(len(rows), dtype=np.int64), classes, note)
    column = ds.data.table.column(label_key)
    feature = ds.features[label_key]
    kind = label_kind(feature)
    taken = column.take(pa.array(rows)) if len(rows) != len(column) or not _identity(rows) else column
    if taken.null_count:
        _refuse_missing(what, rows, np.asarray(taken.is_null(), dtype=bool), label_key, "None")
    if kind == "string":
        names = (
            classes if classes is not None else sorted(str(v) for v in pc.unique(column).to_pylist() if v is not None)
        )
        index = pc.index_in(taken, value_set=pa.array(names, type=taken.type))
        if index.null_count:
            bad = np.asarray(index.is_null(), dtype=bool)
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{what} row {int(rows[i])} has label {taken[i].as_py()!r} in {label_key!r}, a class the training "
                f"split lacks ({_preview(names)}): give splits of the same classes, or cast both columns to one "
                "ClassLabel"
            )
        values = index.to_numpy(zero_copy_only=False).astype(np.int64)
        note = (
            f"labels: {label_key!r} holds class names: class indices by their sorted order, as ImageFolder sorts "
            f"class folders and ds.class_encode_column({label_key!r}) numbers them: {_preview(names)}"
        )
        return Labels(values, names, note)
    if kind == "float":
        values = taken.to_numpy(zero_copy_only=False).astype(np.float64)
        _refuse_missing(what, rows, np.isnan(values), label_key, "NaN")
        note = (
            f"labels: {label_key!r} holds {_shown(feature)} values: served as float32 targets (a regression target), "
            "as ds.with_format('torch') gives them; class ids: cast the column to int64 or a ClassLabel"
        )
        return Labels(values.astype(np.float32), None, note)
    values = taken.to_numpy(zero_copy_only=False).astype(np.int64)
    missing = values < 0
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise DataError(
            f"{what} row {int(rows[i])} has label {int(values[i])} in {label_key!r} (a ClassLabel's missing value is "
            f"-1): drop unlabelled rows (ds.filter(lambda r: r[{label_key!r}] >= 0)) or pass label_key=None"
        )
    shown = f"ClassLabel: {_preview(classes)}" if classes is not None else "integers, served as class indices"
    return Labels(values, classes, f"labels: {label_key!r} ({shown})")


def _identity(rows: np.ndarray) -> bool:
    return bool(len(rows) == 0 or (rows[0] == 0 and np.all(np.diff(rows) == 1)))


def _refuse_missing(what: str, rows: np.ndarray, missing: np.ndarray, key: str, shown: str) -> None:
    if not missing.any():
        return
    at = np.flatnonzero(missing)
    more = f" (and {len(at) - 1:,} more)" if len(at) > 1 else ""
    raise DataError(
        f"{what} row {int(rows[int(at[0])])} has no label ({shown} in {key!r}){more}: drop unlabelled rows "
        f"(ds.filter(lambda r: r[{key!r}] is not None)) or pass label_key=None"
    )


def _preview(names: list[str] | None) -> str:
    """``cat=0, dog=1, owl=2 (3 classes)``, the first few of many."""
    if not names:
        return "0 classes"
    shown = ", ".join(f"{n}={i}" for i, n in enumerate(names[:_PREVIEW]))
    return shown + (", ..." if len(names) > _PREVIEW else "") + f" ({len(names):,} class{'es' * (len(names) != 1)})"
