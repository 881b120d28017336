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

:func:`file_change` applies the change to the file's text (the call replaced, ``import gpufeed as gf`` added) and
gives the unified diff a user applies with ``patch -p1``; ``gpufeed diagnose --verify`` runs a copy so changed.

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
import difflib
import textwrap
from dataclasses import dataclass, field

from .record import LoaderRecord
from .trainer import trainer_line, trainer_of
from .unpacked import run_value, spread, through_partial

__all__ = ["Change", "code_change", "file_change", "no_change_reason", "rewrite", "source_lines"]

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
    call = _parse_call(source)
    if call is None:
        return None, f"the loader was not built by a plain call that could be parsed: {_one_line(source)!r}"
    text, unpacked = source, loader.unpacked
    through = through_partial(source, call, unpacked, cls, _text) if loader.built_by is None else None
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
    call = _parse_call(dataset)
    if (
        call is not None
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("with_transform", "with_format")
    ):
        return _text(dataset, call.func.value)
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
    called = _one_line(_text(source, call.func))
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
        return spread(source, call, positional, unpacked, defaults, _text)
    if len(call.args) > len(positional):
        return None, f"the call passes {len(call.args)} positional arguments; gpufeed maps the first {len(positional)}"
    args = {name: _text(source, node) for name, node in zip(positional, call.args, strict=False)}
    args.update({k.arg: _text(source, k.value) for k in call.keywords if k.arg is not None})
    return args, None


def file_change(text: str, line: int, change: Change, name: str = "train.py") -> tuple[str, str]:
    """``(new text, unified diff)``: ``text`` (a file's) with the call of ``change`` that starts at ``line``
    replaced and its imports added after the module's docstring and ``__future__`` imports. The diff names the
    file ``a/NAME`` and ``b/NAME`` (``patch -p1`` applies it where ``NAME`` is a relative path).

    Example:
        >>> src = 'import torch\\nloader = DataLoader(ds,\\n        batch_size=8)\\nfor b in loader: pass\\n'
        >>> new, diff = file_change(src, 2, Change("DataLoader(ds,\\n        batch_size=8)",
        ...                                        "gf.accelerate(ds, batch_size=8)"))
        >>> print(new, end="")
        import gpufeed as gf
        import torch
        loader = gf.accelerate(ds, batch_size=8)
        <BLANKLINE>
        for b in loader: pass
    """
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    found = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and n.lineno == line and ast.get_source_segment(text, n) == change.old
    ]
    if not found:
        raise ValueError(f"the call {_one_line(change.old)!r} is not at line {line} of {name}")
    node = found[0]
    end_line = node.end_lineno or node.lineno
    first, last = lines[node.lineno - 1].encode(), lines[end_line - 1].encode()  # ast offsets count UTF-8 bytes
    head, tail = first[: node.col_offset].decode(), last[node.end_col_offset or 0 :].decode()
    # the call's lines become one, then blank lines: line numbers after it stay those of the original
    blanks = ["\n"] * (end_line - node.lineno)
    new_lines = [*lines[: node.lineno - 1], head + change.new + tail, *blanks, *lines[end_line:]]
    if change.before is not None:  # on its own line before the statement that holds the call, at its indentation
        at = _statement_line(tree, node)
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        new_lines.insert(at, f"{indent}{change.before}\n")
    present = {ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    wanted = [f"{imp}\n" for imp in change.imports if imp not in present]
    at = _import_line(tree)
    new_lines[at:at] = wanted
    new = "".join(new_lines)
    diff = difflib.unified_diff(lines, new.splitlines(keepends=True), f"a/{name}", f"b/{name}")
    return new, "".join(diff)


def _statement_line(tree: ast.Module, node: ast.AST) -> int:
    """The 0-based first line of the innermost statement that holds ``node``."""
    line = getattr(node, "lineno", 1)
    holding = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max((n.lineno for n in holding), default=line) - 1


def _import_line(tree: ast.Module) -> int:
    """The 0-based line where new imports go: the first top-level import after the docstring and the
    ``__future__`` imports, else the first statement after them, else the end."""
    body = list(tree.body)
    k = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        k = 1  # the module's docstring
    while k < len(body) and getattr(body[k], "module", None) == "__future__":
        k += 1
    rest = body[k:]
    target = next((n for n in rest if isinstance(n, (ast.Import, ast.ImportFrom))), rest[0] if rest else None)
    if target is None:
        return (body[-1].end_lineno or body[-1].lineno) if body else 0
    decorators = getattr(target, "decorator_list", [])
    return min([target.lineno, *(d.lineno for d in decorators)]) - 1


def source_lines(source: str) -> list[str]:
    """The lines of a call's source text as a reader sees them: the continuation lines dedented together (the
    first line starts at the call, the others keep the indentation of the file they came from).

    Example:
        >>> source_lines("DataLoader(\\n            ds,\\n            batch_size=8,\\n        )")
        ['DataLoader(', '    ds,', '    batch_size=8,', ')']
    """
    first, *rest = source.strip("\n").splitlines() or [""]
    return [first.strip(), *textwrap.dedent("\n".join(rest)).splitlines()] if rest else [first.strip()]


def _parse_call(source: str) -> ast.Call | None:
    """The call expression of ``source`` (the text of one call, possibly over several indented lines)."""
    try:
        tree = ast.parse(f"(\n{source.strip()}\n)", mode="eval")  # brackets: continuation lines may be indented
    except SyntaxError:
        return None
    return tree.body if isinstance(tree.body, ast.Call) else None


def _text(source: str, node: ast.AST) -> str:
    """The argument as written: its own source text, on one line when it spans several."""
    wrapped = f"(\n{source.strip()}\n)"
    text = ast.get_source_segment(wrapped, node)
    if text is None or "\n" not in text:
        return text if text is not None else ast.unparse(node)
    joined = _one_line(text)
    try:  # a comment inside the expression would swallow the rest of the joined line
        ast.parse(joined, mode="eval")
    except SyntaxError:
        return ast.unparse(node)
    return joined


def _one_line(text: str) -> str:
    """``text`` on one line: its lines stripped, joined by a space except inside an opening or before a closing."""
    out = ""
    for part in (p.strip() for p in text.splitlines()):
        if part:
            out += part if not out or out[-1] in "([{" or part[0] in ")]}" else f" {part}"
    return out
