"""The code change a report suggests: the call that built the script's loader, rewritten as ``gf.accelerate``.

The source of the call (the whole ``Call`` node, as :mod:`gpufeed.watch.hook` found it at the script's own line) is
parsed with :mod:`ast` and each argument kept as the user wrote it (``batch_size=args.batch_size`` stays so). What
accelerate does itself (worker processes, pinned memory, prefetching) is dropped. What the run passed decides the
rest, not the text: ``sampler=train_sampler`` that was None in the run (DataLoader then shuffles as ``shuffle=``
says), or a ``DistributedSampler`` (accelerate shares the data out to the ranks itself) becomes the ``shuffle=`` the
run had; a batch sampler, sampler or collate function of the script's own (a weighted order, a custom collate) is
not something accelerate can take over, and :func:`no_change_reason` names it. A loader a library built is
rewritten at the library call the script made where that is common (timm's ``create_loader``), or the reason says
what to change instead (a Hugging Face ``Trainer``).

:func:`gpufeed.watch.diff.file_change` applies the change to the file's text and gives the unified diff a user
applies with ``patch -p1``; ``gpufeed diagnose --verify`` runs a copy so changed.

Example:
    >>> from gpufeed.watch.record import LoaderRecord
    >>> rec = LoaderRecord(0, "DataLoader", "train.py:9", "DataLoader(train_ds, batch_size=256, sampler=sampler, "
    ...                    "num_workers=4)", "CIFAR10", None, 256, 4, False, False, 2, "RandomSampler", False,
    ...                    shuffle=True)
    >>> print(code_change(rec))
    - DataLoader(train_ds, batch_size=256, sampler=sampler, num_workers=4)
    + gf.accelerate(train_ds, batch_size=256, shuffle=True)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .record import LoaderRecord
from .source import arg_text, one_line, parse_call, source_lines
from .trainer import trainer_line, trainer_of
from .unpacked import run_value, spread, through_partial

__all__ = ["Change", "code_change", "no_change_reason", "rewrite"]

# DataLoader's positional parameters, in order (torch.utils.data.DataLoader.__init__)
_POSITIONAL = (
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
)
# timm.data.create_loader's first positional parameters (the rest are passed by name in practice)
_TIMM_POSITIONAL = ("dataset", "input_size", "batch_size", "is_training", "no_aug", "re_prob", "re_mode", "re_count")
# create_loader's arguments that shape the recipe, passed on to timm.data.create_transform under the same names
_TIMM_RECIPE = (
    "input_size", "is_training", "no_aug", "train_crop_mode", "scale", "ratio", "hflip", "vflip", "color_jitter",
    "color_jitter_prob", "grayscale_prob", "gaussian_blur_prob", "auto_augment", "interpolation", "mean", "std",
    "re_prob", "re_mode", "re_count", "crop_pct", "crop_mode", "crop_border_pixels", "tf_preprocessing",
)  # fmt: skip
# the classes whose __init__ takes DataLoader's arguments with their meaning ("module.QualName")
_INITS = (
    "torch.utils.data.dataloader.DataLoader",
    "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader",
)
_KEPT = ("batch_size", "shuffle", "drop_last")  # accelerate takes these with the same meaning
# Where DataLoader's default differs from accelerate's, the default is written out so the batches stay the same.
_DEFAULTS = {"batch_size": "1", "shuffle": "False"}
_IMPORT = "import gpufeed as gf"


@dataclass
class Change:
    """A rewrite of the call at ``line`` of ``file``: ``old`` (its source) becomes ``new``; ``imports`` go at the
    top of the file; ``notes`` say what else the change means (a sampler made unnecessary, where to build it);
    ``before``: a statement put on its own line before the one that holds the call (a Trainer's loader, changed
    where ``trainer.train()`` asks for it: :mod:`gpufeed.watch.trainer`)."""

    old: str
    new: str
    imports: list[str] = field(default_factory=lambda: [_IMPORT])
    notes: list[str] = field(default_factory=list)
    before: str | None = None

    @property
    def preview(self) -> str:
        """One ``-`` line per line of the original call, one ``+`` line for the new call (an added statement: its
        ``+`` line, then the call as it stays)."""
        if self.before is not None and self.old == self.new:
            return "\n".join([f"+ {self.before}", *(f"  {line}" for line in source_lines(self.old))])
        return "\n".join([*(f"- {line}" for line in source_lines(self.old)), f"+ {self.new}"])


def code_change(loader: LoaderRecord) -> str | None:
    """The diff that replaces the call that built ``loader`` by ``gf.accelerate``, or None when there is none
    (:func:`no_change_reason` then says why)."""
    change, _ = rewrite(loader)
    return change.preview if change is not None else None


def no_change_reason(loader: LoaderRecord) -> str | None:
    """Why :func:`code_change` suggests nothing for ``loader`` (None when it suggests a change)."""
    return rewrite(loader)[1]


def _rewrite(source: str | None, cls: str = "DataLoader", init_of: str = _INITS[0]) -> tuple[str | None, str | None]:
    """The rewrite of a call known only by its text (no run's facts): ``(preview, None)`` or ``(None, why)``."""
    change, why = rewrite(LoaderRecord(0, cls, None, source, "", None, None, 0, False, False, None, "", False,
                                       init_of=init_of))  # fmt: skip
    return (change.preview if change else None), why


def rewrite(loader: LoaderRecord) -> tuple[Change | None, str | None]:
    """``(change, None)`` or ``(None, why not)`` for the loader's call: a ``DataLoader(...)`` (or the loader's own
    class, ``cls``, when its ``__init__`` is DataLoader's or StatefulDataLoader's), or a library call that built
    it (``built_by``)."""
    source, cls, init_of = loader.source, loader.cls, loader.init_of
    if not source:
        return None, "the source of the call that built the loader was not readable"
    call = parse_call(source)
    if call is None:
        return None, f"the loader was not built by a plain call that could be parsed: {one_line(source)!r}"
    text, unpacked = source, loader.unpacked
    through = through_partial(source, call, unpacked, cls, arg_text) if loader.built_by is None else None
    if through is not None:  # make_loader(ds), make_loader = functools.partial(DataLoader, ...): DataLoader's call
        text, call, unpacked = through
    callee = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
    if callee == "create_loader" or (loader.built_by or "").startswith("timm."):
        return _timm(source, call, loader)
    if callee not in ("DataLoader", cls) and (loader.built_by or "").startswith("transformers."):
        trainer, why = trainer_of(call, loader)  # a Trainer over a datasets.Dataset: a line before its train()
        if trainer is not None:
            return _trainer(source, loader, trainer)
        if why is not None:
            return None, why
    if callee not in ("DataLoader", cls):
        return None, _library_reason(source, call, loader.built_by or "")
    if init_of not in _INITS:
        return None, (
            f"the loader is a {init_of}, a subclass of torch's DataLoader with its own __init__: its arguments are "
            f"its own, not DataLoader's; replace {callee}(...) with gf.accelerate(dataset, batch_size=..., "
            "shuffle=...) if what it adds (a collate, a sampler) is nothing the training needs"
        )
    args, why = _arguments(text, call, _POSITIONAL, unpacked, _DEFAULTS)
    if args is None:
        return None, why
    notes: list[str] = []
    extra: list[str] = []
    blocking = _hugging_face(args, loader, notes, extra) if loader.hf is not None else []
    blocking += _runtime(args, loader, notes)
    if blocking:
        return None, "; ".join(blocking)
    if "dataset" not in args:
        return None, "the call names no dataset"
    kept = [args["dataset"]]
    for name in _KEPT:
        value = args.get(name, _DEFAULTS.get(name))
        if name == "shuffle" and value == "None":  # DataLoader reads shuffle=None as False
            value = "False"
        if value is not None:
            kept.append(f"{name}={value}")
    return Change(source, f"gf.accelerate({', '.join(kept + extra)})", notes=notes), None


def _trainer(source: str, loader: LoaderRecord, trainer: str) -> tuple[Change | None, str | None]:
    """A Trainer's loader over a ``datasets.Dataset``: a line before ``trainer.train()`` gives its
    ``get_train_dataloader`` gf.accelerate's batches (:mod:`gpufeed.watch.trainer`), with the dataset's recipe and
    dict keys found as for a DataLoader over it; the call itself stays."""
    notes: list[str] = []
    extra: list[str] = []
    blocking = _hugging_face({"dataset": f"{trainer}.train_dataset"}, loader, notes, extra)
    if blocking:
        return None, "; ".join(blocking)
    before, note = trainer_line(trainer, extra)
    return Change(source, source, notes=[*notes, note], before=before), None


def _hugging_face(args: dict[str, str], loader: LoaderRecord, notes: list[str], extra: list[str]) -> list[str]:
    """A loader over a ``datasets.Dataset`` (``loader.hf``, what :mod:`gpufeed.watch.hf` found): the recipe its
    ``set_transform`` function applies becomes ``transform=``, the columns are named where they are not found by
    their features, a collate function that only stacks fields goes (``batch_keys=`` keeps the batches the dicts
    the loop reads). ``args`` is changed in place; what blocks the change is returned, one reason each."""
    hf = loader.hf or {}
    fn, recipe, batch = hf.get("function"), hf.get("recipe"), hf.get("batch") or {}
    blocking = []
    if fn is not None and recipe is None:
        blocking.append(f"the dataset's set_transform function {fn} cannot be replaced by a recipe: {hf.get('why')}")
    if hf.get("image") is None:
        blocking.append(
            "the dataset has no single Image column for gf.accelerate to read (cast the column of encoded images "
            "with ds.cast_column(name, datasets.Image()), or name it with image_key=)"
        )
    if batch.get("labels") is not None and hf.get("label") is None:
        blocking.append(
            "the batches carry labels but the dataset has no single ClassLabel or integer label column: name it "
            "with label_key="
        )
    if hf.get("collate") is not None:
        blocking.append(str(hf["collate"]) + "; gf.accelerate yields the images and labels alone")
    # judged here (torch's, or one that only stacks the fields: batch_keys= gives the same dicts), not by _runtime
    args.pop("collate_fn", None)
    kind = batch.get("kind")
    if kind == "dict" and (batch.get("images") is None or len(batch.get("keys") or []) > 2):
        blocking.append(
            f"the batches are dicts of {batch.get('keys')}; gf.accelerate yields images and labels alone "
            "(batch_keys= names them)"
        )
    elif kind == "tuple" and (batch.get("length") != 2 or hf.get("label") is None):
        blocking.append(
            f"the batches are tuples of {batch.get('length')}"
            + ("" if hf.get("label") is not None else " and the dataset has no ClassLabel or integer label column")
            + "; gf.accelerate yields (images, labels), or the images alone"
        )
    elif kind is None:
        blocking.append(
            "the script took no batch from the loader, so what its loop reads of a batch (a dict's keys, a tuple) "
            "is not known; run it for a few steps (--steps N)"
        )
    elif kind not in ("dict", "tuple", "tensor"):
        blocking.append(f"the batches are {kind} objects; gf.accelerate yields tensors")
    if blocking:
        return blocking
    if "dataset" in args:
        args["dataset"] = _without_format(args["dataset"])
    if recipe is not None:
        extra.append(f"transform={recipe}")
    as_dict = kind == "dict"
    keys = [batch["images"], *([batch["labels"]] if batch.get("labels") is not None else [])] if as_dict else []
    extra += [f"image_key={hf['image']!r}"] if hf.get("image_key") else []
    alone = (as_dict and len(keys) == 1) or kind == "tensor"
    if alone and hf.get("label") is not None:
        extra.append("label_key=None")  # the loop's batches carry no labels
    elif hf.get("label_key"):
        extra.append(f"label_key={hf['label']!r}")
    extra += [f"batch_keys={tuple(keys)!r}"] if as_dict else []
    if recipe is not None:
        notes.append(
            f"gf.accelerate decodes the column {hf['image']!r} to RGB"
            + (f", reads the labels from {hf['label']!r}" if hf.get("label") else "")
            + f" and runs {recipe} batched in place of the dataset's {fn}"
            + (f" (the batches stay dicts with the keys {', '.join(map(repr, keys))})" if as_dict else "")
        )  # fmt: skip
    return []


def _without_format(dataset: str) -> str:
    """``ds.with_transform(fn)`` (or ``.with_format(...)``) as ``ds``: ``transform=`` replaces the function."""
    call = parse_call(dataset)
    if (
        call is not None
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("with_transform", "with_format")
    ):
        return arg_text(dataset, call.func.value)
    return dataset


def _runtime(args: dict[str, str], loader: LoaderRecord, notes: list[str]) -> list[str]:
    """Settle ``sampler=``, ``batch_sampler=`` and ``collate_fn=`` by what the run passed (``args`` is changed in
    place); what accelerate cannot take over is returned, one reason each."""
    blocking = []
    known = loader.batch_sampler != "?"  # a record made by the hook (run facts), not one from the text alone
    if args.get("sampler", "None") != "None":
        if loader.shuffle is None:
            blocking.append(
                "a sampler= decides the order of samples itself"
                + (f" (a {loader.sampler} in this run)" if known else "")
                + "; gf.accelerate draws its own order (shuffle=, seed=, and each rank's share under torch.distributed)"
            )
        else:
            del args["sampler"]
            args["shuffle"] = str(loader.shuffle)
            if loader.sampler == "DistributedSampler":
                notes.append(
                    "the DistributedSampler is not needed: gf.accelerate shares the data out to the ranks itself "
                    "under torch.distributed; call loader.set_epoch(epoch) where the script calls the sampler's"
                )
            else:
                notes.append(f"sampler= was {loader.sampler} in this run: shuffle={loader.shuffle} says the same order")
    if args.get("batch_sampler", "None") != "None":
        if loader.batch_sampler is not None:
            blocking.append(
                "batch_sampler="
                + (f" is a {loader.batch_sampler}, which" if known else "")
                + " decides the batches themselves; gf.accelerate makes fixed-size batches"
            )
        else:
            del args["batch_sampler"]
            args["batch_size"] = str(loader.batch_size)
    if args.get("collate_fn", "None") != "None":
        if loader.collate_fn is not None:
            blocking.append(
                "collate_fn="
                + (f" is {loader.collate_fn}, which" if loader.collate_fn != "?" else "")
                + " shapes each batch in Python; gf.accelerate yields "
                "(images, labels) batches on the device (mixing: gf.accelerate(..., mix=gpufeed.augment.MixUp(...)))"
            )
        else:
            del args["collate_fn"]
    return blocking


def _timm(source: str, call: ast.Call, loader: LoaderRecord) -> tuple[Change | None, str | None]:
    """timm's ``create_loader(dataset, input_size, batch_size, is_training=..., <recipe>...)``: the recipe goes to
    ``timm.data.create_transform`` with the same arguments (without timm's prefetcher: ToTensor and Normalize are
    in the recipe, which gf.accelerate runs batched on the device, as the prefetcher did)."""
    args, why = _arguments(source, call, _TIMM_POSITIONAL, loader.unpacked)
    if args is None:
        return None, why
    splits = run_value(loader.unpacked, "num_aug_splits") or args.get("num_aug_splits", "0")  # a dict's: its value
    if "Mixup" in (loader.collate_fn or "") or splits not in ("0", "1", "None"):
        return None, (
            "timm's create_loader mixes batches (a Mixup collate_fn) or splits them for AugMix here: gf.accelerate "
            "mixes with mix=gpufeed.augment.MixUp(...)/CutMix(...) and does not split; change create_loader(...) to "
            "gf.accelerate(dataset, batch_size=..., shuffle=True, transform=timm.data.create_transform(...), mix=...)"
        )
    if "dataset" not in args or "batch_size" not in args:
        return None, "the create_loader(...) call names no dataset or batch size"
    if loader.batch_sampler not in (None, "?"):  # the run's facts, whatever the text (input_size_choices=args.x)
        return None, (
            f"timm's create_loader made the batches with a {loader.batch_sampler} here (input_size_choices / "
            "batch_size_choices: batches of scheduled sizes); gf.accelerate makes batches of one size"
        )
    if loader.shuffle is None and loader.sampler not in ("", "?"):
        return None, (
            f"timm's create_loader ordered the samples with a {loader.sampler} here (num_aug_repeats); "
            "gf.accelerate draws its own order (shuffle=, seed=, each rank's share)"
        )
    training = args.get("is_training", "False")
    recipe = [args["input_size"]] if "input_size" in args else []
    recipe += [f"{name}={args[name]}" for name in _TIMM_RECIPE[1:] if name in args]
    kept = [
        args["dataset"],
        f"batch_size={args['batch_size']}",
        f"shuffle={training}",
        f"drop_last={training}",
        f"transform=timm.data.create_transform({', '.join(recipe)})",
    ]
    prefetcher = (run_value(loader.unpacked, "use_prefetcher") or args.get("use_prefetcher", "True")) != "False"
    how = "and normalised on the device in its PrefetchLoader" if prefetcher else "(its ToTensor and Normalize too)"
    notes = [
        f"timm's create_loader set the dataset's transform {how}; gf.accelerate takes the same recipe from "
        "timm.data.create_transform and runs it batched"
    ]
    return Change(source, f"gf.accelerate({', '.join(kept)})", [_IMPORT, "import timm.data"], notes), None


def _library_reason(source: str, call: ast.Call, built_by: str) -> str:
    """Why a loader built inside a library call gets no rewrite of that call, and what to change instead."""
    called = one_line(arg_text(source, call.func))
    if built_by.startswith("transformers."):
        return (
            f"a Hugging Face Trainer built the DataLoader inside `{called}(...)` ({built_by}): gf.accelerate cannot "
            "serve it as it is, since a Trainer feeds the model dicts made by its data collator; override "
            "get_train_dataloader() in a Trainer subclass to return batches gpufeed makes, or tune the Trainer's "
            "dataloader_num_workers / dataloader_pin_memory arguments"
        )
    return (
        f"the loader was built inside `{called}(...)` from a DataLoader the script made elsewhere: replace that "
        "DataLoader(...) with gf.accelerate(dataset, batch_size=..., shuffle=...)"
    )


def _arguments(
    source: str,
    call: ast.Call,
    positional: tuple[str, ...],
    unpacked: list[dict[str, object]] | None = None,
    defaults: dict[str, str] | None = None,
) -> tuple[dict[str, str] | None, str | None]:
    """The call's arguments by name, each as written (what ``*args``/``**kwargs`` held in the run, by the script's
    names for them: :func:`gpufeed.watch.unpacked.spread`); or None and why they cannot be known."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return spread(source, call, positional, unpacked, defaults, arg_text)
    if len(call.args) > len(positional):
        return None, f"the call passes {len(call.args)} positional arguments; gpufeed maps the first {len(positional)}"
    args = {name: arg_text(source, node) for name, node in zip(positional, call.args, strict=False)}
    args.update({k.arg: arg_text(source, k.value) for k in call.keywords if k.arg is not None})
    return args, None
