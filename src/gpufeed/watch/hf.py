"""A loader over a Hugging Face ``datasets.Dataset``, as the hook finds it: the recipe its ``set_transform`` function
applies, the name the script has for that recipe, and what the loader's batches look like.

A typical script gives ``ds.set_transform(preprocess)`` (or ``ds = ds.with_transform(preprocess)``) a function that
runs a torchvision or timm recipe on each image, then batches the rows with a ``collate_fn`` that stacks the fields
into a dict. ``gf.accelerate(ds, transform=train_tf, ...)`` does the same work batched: it decodes the Image column
to RGB, reads the labels from the ClassLabel column, and applies ``transform=`` in place of the function. So the
code change needs the recipe *object* the function applies and the *name* it has where the loader is built:

- :func:`recipes_of` finds the objects a function reaches through its closure cells, its default arguments and the
  globals its code names (nested code included: a list comprehension is a code object of its own), following a
  helper function of the script's own, a ``functools.partial`` and a callable object's attributes one step;
  a recipe is an instance of a torchvision (v1 or v2) or timm transform class;
- :func:`name_at` finds the recipe among the locals and globals (and ``self``'s attributes) of the frame that built
  the loader: ``train_tf`` there, whatever the function itself calls it (a closure's ``tf``).

:func:`hf_found` records both, or why the recipe was not found (several, none, a callable of the script's own), with
the columns the function and the collate function name, and whether that collate function only stacks fields. The
hook fills in :func:`batch_layout` at the first batch: which dict key held the images and which the labels.

NOTE [ no gpufeed, no datasets here ]: this module is loaded by the hook under its private package (see
``watch/site/sitecustomize.py``): it imports only the standard library. The two checks it shares with
:mod:`gpufeed.read.hf` (``hf_kind``, ``transform_of``) are repeated here for that reason; a test keeps them equal.

Example:
    >>> import torchvision.transforms as T
    >>> train_tf = T.Compose([T.RandomResizedCrop(32), T.ToTensor()])
    >>> def preprocess(batch):
    ...     batch["pixel_values"] = [train_tf(img.convert("RGB")) for img in batch["image"]]
    ...     return batch
    >>> [(name, type(obj).__name__) for name, obj in recipes_of(preprocess)[0]]
    [('train_tf', 'Compose')]
"""

from __future__ import annotations

import functools
import re
import types
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "HFFound",
    "accelerate_kwargs",
    "batch_layout",
    "collate_why",
    "hf_found",
    "is_hf_dataset",
    "name_at",
    "recipes_of",
]

_RECIPE_MODULES = ("torchvision.transforms", "timm.data")  # the classes whose instances are recipes
_LABEL_NAMES = ("label", "labels", "target", "targets", "fine_label", "coarse_label")  # read.hf_columns' LABEL_NAMES
# what a collate function that only stacks the fields names (globals and attributes: torch.stack, torch.tensor)
_STACKING = frozenset(
    "torch stack tensor as_tensor cat LongTensor FloatTensor long float int len list range zip dict keys items values "
    "append contiguous memory_format contiguous_format to float32 int64 numpy np array asarray from_numpy".split()
)
# collate functions of libraries that stack a dict's fields and nothing else
_STACKING_COLLATES = ("transformers.data.data_collator.default_data_collator", "DefaultDataCollator")
_LIBRARIES = ("torch", "torchvision", "timm", "numpy", "PIL", "datasets", "builtins", "functools")
_DEPTH = 2
# callables that are not objects a function could apply to an image in place of a recipe
_NOT_OBJECTS = (
    type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial,
)  # fmt: skip  # how far a helper function of the script's own is followed


@dataclass
class HFFound:
    """What the hook found of a ``datasets.Dataset`` under a loader (stored as a dict on the loader's record).

    ``function``: the ``set_transform``/``with_transform`` function's name (None: the dataset has none);
    ``recipe``: the name where the loader is built of the recipe the function applies (None: ``why`` says why);
    ``recipe_text``: its repr on one line; ``columns``: the dataset's columns the function and the collate function
    name; ``image`` and ``label``: the columns gf.accelerate reads (``label_key="auto"``'s choice, or the one named),
    ``image_key`` and ``label_key``: whether the change must name them; ``collate``: None when the loader's collate
    function is torch's, or one that only stacks fields, else why it does more; ``batch``: the first batch's layout
    (:func:`batch_layout`), filled in by the hook.
    """

    function: str | None
    recipe: str | None
    recipe_text: str | None
    why: str | None
    columns: list[str]
    image: str | None
    label: str | None
    image_key: bool = False
    label_key: bool = False
    collate: str | None = None
    batch: dict[str, Any] | None = None


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a ``datasets.Dataset`` (judged by its classes' module, as ``gpufeed.read.hf.hf_kind``)."""
    return any(
        (cls.__module__ or "").startswith("datasets.") and cls.__name__ == "Dataset" for cls in type(obj).__mro__
    )


def _transform_of(ds: Any) -> Any:
    """The function ``set_transform`` / ``with_transform`` gave ``ds`` (``gpufeed.read.hf.transform_of``)."""
    fmt = getattr(ds, "format", None) or {}
    return (fmt.get("format_kwargs") or {}).get("transform") if fmt.get("type") == "custom" else None


def hf_found(dataset: Any, collate_fn: Any, frame: Any) -> dict[str, Any] | None:
    """What :class:`HFFound` says of ``dataset`` (as a dict), or None when it is not a ``datasets.Dataset``.
    ``frame``: the script's frame that built the loader (where the recipe's name is looked up). Never raises."""
    if not is_hf_dataset(dataset):
        return None
    try:
        return asdict(_found(dataset, collate_fn, frame))
    except Exception as e:  # noqa: BLE001 - the hook's bookkeeping never breaks the script
        why = f"the recipe could not be looked for: {type(e).__name__}: {e}"
        return asdict(HFFound(_name(_transform_of(dataset)), None, None, why, [], None, None))


def accelerate_kwargs(dataset: Any, collate_fn: Any = None) -> dict[str, Any]:
    """What the changed call passes ``gf.accelerate`` for ``dataset`` beside its batch settings: ``transform=`` the
    one recipe its ``set_transform`` function applies, ``image_key=``/``label_key=`` where the function's code
    chooses among several columns. Empty for a dataset that is not a ``datasets.Dataset``, has no such function
    or whose recipe is not found (accelerate then refuses it, as the report says). The columns are chosen as
    :func:`hf_found` chooses them for the change (the names the function and ``collate_fn`` use)."""
    if not is_hf_dataset(dataset):
        return {}
    fn = _transform_of(dataset)
    if fn is None:
        return {}
    recipes, _ = recipes_of(fn)
    if len(recipes) != 1:
        return {}
    image, label, image_key, label_key = _columns(dataset, _strings(fn) | _strings(collate_fn))
    kwargs: dict[str, Any] = {"transform": recipes[0][1]}
    kwargs.update({"image_key": image} if image_key else {})
    kwargs.update({"label_key": label} if label_key else {})
    return kwargs


def _found(dataset: Any, collate_fn: Any, frame: Any) -> HFFound:
    fn = _transform_of(dataset)
    named = _strings(fn) | _strings(collate_fn)
    columns = [c for c in dataset.column_names if c in named]
    image, label, image_key, label_key = _columns(dataset, named)
    collate = collate_why(collate_fn)
    if fn is None:
        return HFFound(None, None, None, None, columns, image, label, image_key, label_key, collate)
    recipes, others = recipes_of(fn)
    name, text, why = None, None, None
    fname = _name(fn)
    if len(recipes) == 1:
        obj = recipes[0][1]
        text = re.sub(r"\s*\n\s*", " ", repr(obj))[:2000]
        name = name_at(frame, obj)
        if name is None:
            why = (
                f"the recipe {fname} applies ({text[:120]}) has no name where the DataLoader is built: give it one "
                "there (train_tf = ...) to pass it as transform="
            )
    elif recipes:
        why = (
            f"{fname} names several recipes ({', '.join(n for n, _ in recipes)}): which one it applies to each image "
            "depends on its code"
        )
    elif others:
        shown = ", ".join(f"{n} (a {type(o).__module__}.{type(o).__qualname__})" for n, o in others)
        why = (
            f"{fname} applies {shown}, not a torchvision or timm transform: gf.accelerate splits and batches those "
            "recipes (and gpufeed.augment's ops), not a callable of the script's own"
        )
    else:
        why = (
            f"{fname} names no torchvision or timm transform through its globals, closure or default arguments (a "
            "recipe built inside it, or kept in a dict or list, is not followed)"
        )
    return HFFound(fname, name, text, why, columns, image, label, image_key, label_key, collate)


def _name(fn: Any) -> str | None:
    if fn is None:
        return None
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _columns(dataset: Any, named: set[str]) -> tuple[str | None, str | None, bool, bool]:
    """The Image column and the label column gf.accelerate reads (by ``gpufeed.read.hf.arrow_images``'s rules),
    and whether the change must name them (several candidates, the code names one)."""
    features = dataset.features
    kind = {k: type(f).__name__ for k, f in features.items()}
    images = [k for k, t in kind.items() if t == "Image"]
    image, image_key = (images[0] if len(images) == 1 else None), False
    if len(images) > 1 and len([c for c in images if c in named]) == 1:
        image, image_key = next(c for c in images if c in named), True

    def ids_or_names(k: str) -> bool:  # class ids, or class names (strings) that gf.accelerate numbers
        dtype = str(getattr(features[k], "dtype", ""))
        return kind[k] == "Value" and (dtype.startswith(("int", "uint")) or dtype in ("bool", "string", "large_string"))

    labels = [k for k, t in kind.items() if t == "ClassLabel"]
    labels = labels or [k for k in _LABEL_NAMES if k in kind and ids_or_names(k)]
    label, label_key = (labels[0] if len(labels) == 1 else None), False
    if len(labels) > 1 and len([c for c in labels if c in named]) == 1:
        label, label_key = next(c for c in labels if c in named), True
    return image, label, image_key, label_key


def _is_recipe(obj: Any) -> bool:
    return not isinstance(obj, type) and callable(obj) and type(obj).__module__.startswith(_RECIPE_MODULES)


def _library(obj: Any) -> bool:
    """Whether a function or class comes from a library (torch, numpy, PIL...) rather than the script."""
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES


def recipes_of(fn: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """``(recipes, others)``: the torchvision/timm recipes ``fn`` reaches, each with the name ``fn`` uses for it
    (one recipe held inside another, a ``Normalize`` of the ``Compose`` also named, counted once), and the
    callable objects of the script's own classes it reaches (what it may apply instead)."""
    seen: set[int] = set()
    found: list[tuple[str, Any]] = []
    for name, value in _reached(fn, _DEPTH, seen):
        if all(value is not v for _, v in found):
            found.append((name, value))
    recipes = [(n, v) for n, v in found if _is_recipe(v)]
    inner = {id(t) for _, r in recipes for t in _inside(r)}
    recipes = [(n, v) for n, v in recipes if id(v) not in inner]
    others = [
        (n, v)
        for n, v in found
        if not _is_recipe(v) and callable(v) and not isinstance(v, _NOT_OBJECTS) and not _library(type(v))
    ]
    return recipes, others


def _inside(recipe: Any) -> list[Any]:
    """The transforms held inside a recipe (a Compose's, a RandomApply's), at any depth."""
    out: list[Any] = []
    stack = list(getattr(recipe, "transforms", None) or [])
    while stack:
        t = stack.pop()
        out.append(t)
        stack += list(getattr(t, "transforms", None) or []) if isinstance(getattr(t, "transforms", None), list) else []
    return out


def _reached(fn: Any, depth: int, seen: set[int]) -> list[tuple[str, Any]]:
    """The objects ``fn`` reaches directly, with the names it has for them; a helper function of the script's own
    among them is followed ``depth`` more steps."""
    if id(fn) in seen or depth < 0:
        return []
    seen.add(id(fn))
    out: list[tuple[str, Any]] = []
    if isinstance(fn, functools.partial):
        out += [("partial argument", v) for v in (*fn.args, *fn.keywords.values())]
        out += _reached(fn.func, depth, seen)
        return out
    if isinstance(fn, types.MethodType):
        out += [(f"self.{k}", v) for k, v in vars(fn.__self__).items()] if hasattr(fn.__self__, "__dict__") else []
        return out + _reached(fn.__func__, depth, seen)
    if not isinstance(fn, types.FunctionType):
        if _is_recipe(fn) or fn is None or _library(type(fn)):
            return []
        out += [(f"self.{k}", v) for k, v in vars(fn).items()] if hasattr(fn, "__dict__") else []
        call = type(fn).__call__ if callable(fn) else None
        return out + (_reached(call, depth, seen) if isinstance(call, types.FunctionType) else [])
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:  # an empty cell: a name assigned after the function was made
            continue
    positional = code.co_varnames[: code.co_argcount]
    defaults = fn.__defaults__ or ()
    out += list(zip(positional[len(positional) - len(defaults) :], defaults, strict=False))
    out += list((fn.__kwdefaults__ or {}).items())
    glob = fn.__globals__
    out += [(name, glob[name]) for name in _names(code) if name in glob]
    for _, value in list(out):
        if isinstance(value, (types.FunctionType, functools.partial)) and not _library(value) and depth > 0:
            out += _reached(value, depth - 1, seen)
    return out


def _codes(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code objects nested in it (comprehensions, lambdas, inner functions)."""
    out, stack = [], [code]
    while stack:
        c = stack.pop()
        out.append(c)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return out


def _names(code: types.CodeType) -> list[str]:
    """The global and attribute names ``code`` and its nested code use, in order, once each."""
    return list(dict.fromkeys(n for c in _codes(code) for n in c.co_names))


def _code_of(fn: Any) -> types.CodeType | None:
    for _ in range(3):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        elif isinstance(fn, types.FunctionType):
            return fn.__code__
        elif callable(fn) and isinstance(type(fn).__call__, types.FunctionType):
            fn = type(fn).__call__
        else:
            return None
    return None


def _strings(fn: Any) -> set[str]:
    """The string constants of ``fn``'s code (and its nested code): the keys it reads and writes."""
    code = _code_of(fn)
    return {k for c in _codes(code) for k in c.co_consts if isinstance(k, str)} if code is not None else set()


def name_at(frame: Any, obj: Any) -> str | None:
    """The name ``obj`` has in ``frame``: a local, a global, or an attribute of the frame's ``self``; None if none.

    Example:
        >>> import sys
        >>> recipe = object()
        >>> name_at(sys._getframe(), recipe)
        'recipe'
    """
    if frame is None:
        return None
    for scope in (frame.f_locals, frame.f_globals):
        # names a script can write: not dunders, not a tool's hidden locals (pytest's "@py_assert1")
        names = [k for k, v in scope.items() if v is obj and k.isidentifier() and not k.startswith("__")]
        if names:
            return names[0]
    owner = frame.f_locals.get("self")
    attrs = [k for k, v in (vars(owner).items() if hasattr(owner, "__dict__") else ()) if v is obj]
    return f"self.{attrs[0]}" if attrs else None


def collate_why(fn: Any) -> str | None:
    """None when ``fn`` is torch's default collate or only stacks the fields of the rows (its code names nothing
    but torch's stacking and Python's containers), else what it does more.

    Example:
        >>> import torch
        >>> def collate(rows):
        ...     return {"pixel_values": torch.stack([r["pixel_values"] for r in rows]),
        ...             "labels": torch.tensor([r["label"] for r in rows])}
        >>> collate_why(collate) is None, collate_why(lambda rows: pad(rows))
        (True, 'collate_fn=<lambda> does more than stack the fields: it uses pad')
    """
    if fn is None:
        return None
    name = _name(fn) or "?"
    module = getattr(fn, "__module__", "") or ""
    if (name == "default_collate" and module.startswith("torch.utils.data")) or (
        f"{module}.{name}" in _STACKING_COLLATES or type(fn).__name__ in _STACKING_COLLATES
    ):
        return None
    code = _code_of(fn)
    if code is None or not isinstance(fn, types.FunctionType):
        return f"collate_fn is a {type(fn).__qualname__}, which shapes each batch in Python"
    more = [n for n in _names(code) if n not in _STACKING]
    if more:
        return f"collate_fn={name} does more than stack the fields: it uses {', '.join(more)}"
    return None


def batch_layout(data: Any, tensor: type) -> dict[str, Any]:
    """What a batch is: ``{"kind": "dict", "keys", "images", "labels"}`` (the key of the one 4-d tensor and of the
    one 1-d integer tensor, None where not one), or ``{"kind": "tuple", "length"}``, ``{"kind": "tensor"}``.

    Example:
        >>> import torch
        >>> batch_layout({"pixel_values": torch.zeros(2, 3, 4, 4), "labels": torch.tensor([0, 1])}, torch.Tensor)
        {'kind': 'dict', 'keys': ['pixel_values', 'labels'], 'images': 'pixel_values', 'labels': 'labels'}
    """
    if isinstance(data, dict):
        ts: dict[str, Any] = {str(k): v for k, v in data.items() if isinstance(v, tensor)}
        images = [k for k, v in ts.items() if v.dim() == 4]
        labels = [
            k for k, v in ts.items() if v.dim() == 1 and not v.is_floating_point() and str(v.dtype) != "torch.bool"
        ]
        return {
            "kind": "dict",
            "keys": [str(k) for k in data],
            "images": images[0] if len(images) == 1 else None,
            "labels": labels[0] if len(labels) == 1 else None,
        }
    if isinstance(data, (tuple, list)):
        return {"kind": "tuple", "length": len(data)}
    return {"kind": "tensor" if isinstance(data, tensor) else type(data).__name__}
