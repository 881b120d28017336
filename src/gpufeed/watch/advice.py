"""The code change a report suggests: the call that built the script's loader, rewritten as ``gf.accelerate``.

The source of the call (the whole ``Call`` node, as :mod:`gpufeed.watch.hook` found it) is parsed with :mod:`ast`
and each argument kept as the user wrote it (``batch_size=args.batch_size`` stays so). What accelerate does itself
(worker processes, pinned memory, prefetching) is dropped; a sampler, batch sampler or collate function is not
something accelerate can take over as it is, so no change is suggested for such a loader and
:func:`no_change_reason` says why.

Example:
    >>> from gpufeed.watch.record import LoaderRecord
    >>> rec = LoaderRecord(0, "DataLoader", "train.py:9", "DataLoader(train_ds, batch_size=256, shuffle=True, "
    ...                    "num_workers=4)", "CIFAR10", None, 256, 4, False, False, 2, "RandomSampler", False)
    >>> print(code_change(rec))
    - DataLoader(train_ds, batch_size=256, shuffle=True, num_workers=4)
    + gf.accelerate(train_ds, batch_size=256, shuffle=True)
"""

from __future__ import annotations

import ast
import textwrap

from .record import LoaderRecord

__all__ = ["code_change", "no_change_reason", "source_lines"]

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
# the classes whose __init__ takes DataLoader's arguments with their meaning ("module.QualName")
_INITS = (
    "torch.utils.data.dataloader.DataLoader",
    "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader",
)
_KEPT = ("batch_size", "shuffle", "drop_last")  # accelerate takes these with the same meaning
# Where DataLoader's default differs from accelerate's, the default is written out so the batches stay the same.
_DEFAULTS = {"batch_size": "1", "shuffle": "False"}
_BLOCKING = {
    "sampler": "a sampler= decides the order of samples itself; gf.accelerate draws its own order (shuffle=, seed=, "
    "and each rank's share under torch.distributed)",
    "batch_sampler": "a batch_sampler= decides the batches themselves; gf.accelerate makes fixed-size batches",
    "collate_fn": "a collate_fn= shapes each batch in Python; gf.accelerate yields (images, labels) batches on the "
    "device",
}


def code_change(loader: LoaderRecord) -> str | None:
    """The diff that replaces the call that built ``loader`` by ``gf.accelerate``, or None when there is none.

    One ``-`` line per line of the original call, one ``+`` line for the new call (with ``import gpufeed as gf``).
    None when the source is unknown or the call passes what accelerate cannot take as is:
    :func:`no_change_reason` then says why.
    """
    change, _ = _rewrite(loader.source, loader.cls, loader.init_of)
    return change


def no_change_reason(loader: LoaderRecord) -> str | None:
    """Why :func:`code_change` suggests nothing for ``loader`` (None when it suggests a change)."""
    _, reason = _rewrite(loader.source, loader.cls, loader.init_of)
    return reason


def _rewrite(source: str | None, cls: str = "DataLoader", init_of: str = _INITS[0]) -> tuple[str | None, str | None]:
    """``(diff, None)`` or ``(None, why not)`` for the source text of a ``DataLoader(...)`` call (or of the loader's
    own class, ``cls``, when its ``__init__`` is DataLoader's or StatefulDataLoader's: ``init_of``); any other call
    (``accelerator.prepare(...)``, ``trainer.fit(...)``) built the loader from one the script made elsewhere: that
    one is the one to change."""
    if not source:
        return None, "the source of the call that built the loader was not readable"
    call = _parse_call(source)
    if call is None:
        return None, f"the loader was not built by a plain call that could be parsed: {_one_line(source)!r}"
    callee = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
    if callee not in ("DataLoader", cls):
        return None, (
            f"the loader was built inside `{_one_line(_text(source, call.func))}(...)` from a DataLoader the script "
            "made elsewhere: replace that DataLoader(...) with gf.accelerate(dataset, batch_size=..., shuffle=...)"
        )
    if init_of not in _INITS:
        return None, (
            f"the loader is a {init_of}, a subclass of torch's DataLoader with its own __init__: its arguments are "
            f"its own, not DataLoader's; replace {callee}(...) with gf.accelerate(dataset, batch_size=..., "
            "shuffle=...) if what it adds (a collate, a sampler) is nothing the training needs"
        )
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None, "the call passes *args or **kwargs, whose contents are not in the source"
    if len(call.args) > len(_POSITIONAL):
        return None, f"the call passes {len(call.args)} positional arguments; DataLoader takes {len(_POSITIONAL)}"
    args = {name: _text(source, node) for name, node in zip(_POSITIONAL, call.args, strict=False)}
    args.update({k.arg: _text(source, k.value) for k in call.keywords if k.arg is not None})
    blocking = [name for name in _BLOCKING if name in args and args[name] != "None"]
    if blocking:
        return None, "; ".join(_BLOCKING[name] for name in blocking)
    if "dataset" not in args:
        return None, "the call names no dataset"
    kept = [args["dataset"]]
    for name in _KEPT:
        value = args.get(name, _DEFAULTS.get(name))
        if name == "shuffle" and value == "None":  # DataLoader reads shuffle=None as False
            value = "False"
        if value is not None:
            kept.append(f"{name}={value}")
    removed = [f"- {line}" for line in source_lines(source)]
    return "\n".join([*removed, f"+ gf.accelerate({', '.join(kept)})"]), None


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
