"""What a loader call's ``*args`` and ``**kwargs`` held when the script ran it, and the call's arguments by name.

Scripts often build their loader from a dict: PyTorch's MNIST example ``DataLoader(dataset1, **train_kwargs)``
(``train_kwargs = {'batch_size': ...}``, updated with ``cuda_kwargs`` on a GPU), timm's ``train.py``
``create_loader(dataset_train, input_size=..., **common_loader_kwargs, **train_loader_kwargs)``. The source text
does not say what those hold; the script's frame at the call does. :func:`unpacked_at` (run by the hook, when the
loader is built) reads each unpacked expression there, without running any of the script's code: a name, an
attribute kept in an object's ``__dict__`` (``args.loader_kwargs``, ``self.kw``) or a class's plain attribute, an
item of a dict, list or tuple by a constant key (``cfg['loader']``); a property, a call or an object's own
``__getattr__`` is not run. A ``dict``'s keys are read as such; a mapping of another type (OmegaConf's
``DictConfig``), or an expression not read, is known from the arguments the loader's ``__init__`` received when the
script called it directly with one such ``**``.

:func:`spread` then gives the call's arguments by name, each as text that keeps the script's names:
``train_kwargs['batch_size']``, ``loader_args[1]``; a value that the run did not pass and whose default
``gf.accelerate`` does not share reads as ``train_kwargs.get('shuffle', False)``, so that the changed line does on
another machine what the script's does (the MNIST example's ``cuda_kwargs`` add ``shuffle=True`` on a GPU only);
a key whose value was ``None`` in the run reads as ``None`` (``sampler=None``: the callee's own choice).

A loader class bound with ``functools.partial`` (``make_loader = partial(DataLoader, shuffle=True, **vars(a))``,
then ``make_loader(ds)``) is read the same way: its entry (``star`` ``"partial"``) holds what the partial adds, and
:func:`through_partial` writes the call as the class's own, ``DataLoader(*make_loader.args, ds,
**make_loader.keywords)``, so that the change reads ``make_loader.keywords['batch_size']``.

NOTE [ standard library only ]: the hook loads this module under its private package (``watch/site``), and with it
:mod:`gpufeed.watch.source`.

Example:
    >>> import ast, sys
    >>> train_kwargs = {"batch_size": 64, "num_workers": 1}
    >>> source = "DataLoader(dataset1, **train_kwargs)"
    >>> found = unpacked_at(sys._getframe(), source)
    >>> found
    [{'star': '**', 'expr': 'train_kwargs', 'keys': ['batch_size', 'num_workers'], 'values': {'batch_size': '64', \
'num_workers': '1'}}]
    >>> call = ast.parse(source, mode="eval").body
    >>> spread(source, call, ("dataset", "batch_size", "shuffle"), found, {"shuffle": "False"})
    ({'dataset': 'dataset1', 'batch_size': "train_kwargs['batch_size']", 'num_workers': "train_kwargs['num_workers']", \
'shuffle': "train_kwargs.get('shuffle', False)"}, None)
"""

from __future__ import annotations

import ast
import builtins
import functools
from collections.abc import Callable
from types import FrameType
from typing import Any

from .source import parse_call

__all__ = ["PARTIAL", "run_value", "spread", "through_partial", "unpacked_at"]

_SIMPLE = (bool, int, float, str, type(None))
PARTIAL = "partial"  # the entry of a callee that is a functools.partial: what it adds to the call


class _NotRead(Exception):
    """An unpacked expression whose value is not read without running the script's code."""


def unpacked_at(
    frame: FrameType | None, source: str | None, received: tuple[tuple[Any, ...], dict[str, Any]] | None = None
) -> list[dict[str, Any]] | None:
    """One entry per ``*expr`` / ``**expr`` of the call ``source`` (in order), read in ``frame``: ``star``, ``expr``
    (its text), and ``keys`` with ``values`` (a mapping's; each value's repr when it is a plain constant, else
    ``<TypeName>``) or ``length`` (a sequence's), or ``why`` it is not known. ``received``: the positional and
    keyword arguments the loader's ``__init__`` got, when the script called the loader's class itself. None when
    the call unpacks nothing (or its text does not parse)."""
    call = parse_call(source) if source else None
    if call is None or frame is None or source is None:
        return None
    wrapped = f"(\n{source.strip()}\n)"  # as _call parsed it: the nodes' offsets are in this text
    stars = [("*", a.value) for a in call.args if isinstance(a, ast.Starred)]
    stars += [("**", k.value) for k in call.keywords if k.arg is None]
    out = _partial(call.func, frame, wrapped)
    if not stars and not out:
        return None
    for star, node in sorted(stars, key=lambda s: (s[1].lineno, s[1].col_offset)):
        entry: dict[str, Any] = {"star": star, "expr": ast.get_source_segment(wrapped, node) or ast.unparse(node)}
        try:
            _read_entry(entry, _value(node, frame))
        except _NotRead as e:
            entry["why"] = str(e)
        out.append(entry)
    if received is not None:
        _from_received(out, call, received)
    return out


def _partial(func: ast.expr, frame: FrameType, wrapped: str) -> list[dict[str, Any]]:
    """The entry of a callee that is a ``functools.partial`` (read as the other expressions, no code run): its
    ``func`` (``module.QualName``), how many positional arguments it adds first and its keywords; else none."""
    if not isinstance(func, (ast.Name, ast.Attribute)):
        return []
    try:
        value = _value(func, frame)
    except _NotRead:
        return []
    if not isinstance(value, functools.partial):
        return []
    target = value.func
    entry: dict[str, Any] = {"star": PARTIAL, "expr": ast.get_source_segment(wrapped, func) or ast.unparse(func)}
    entry["func"] = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    entry["length"] = len(value.args)
    keys = [k for k in value.keywords if isinstance(k, str)]
    entry["keys"], entry["values"] = keys, {k: _shown(value.keywords[k]) for k in keys}
    return [entry]


def _read_entry(entry: dict[str, Any], value: Any) -> None:
    if entry["star"] == "**":
        if not isinstance(value, dict):
            raise _NotRead(f"a {type(value).__name__}, not a dict")
        keys = [k for k in dict.keys(value) if isinstance(k, str)]  # dict's own keys(): no override runs
        entry["keys"], entry["values"] = keys, {k: _shown(dict.__getitem__(value, k)) for k in keys}
    elif isinstance(value, (list, tuple)):
        entry["length"] = len(value)
    else:
        raise _NotRead(f"a {type(value).__name__}, not a list or tuple")


def _from_received(out: list[dict[str, Any]], call: ast.Call, received: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
    """The one entry of each kind not read, from what the class's ``__init__`` received (the others subtracted)."""
    args, kwargs = received
    for star in ("*", "**"):
        missing = [e for e in out if e["star"] == star and "why" in e]
        if len(missing) != 1:
            continue
        entry = missing[0]
        if star == "**":
            named = {k.arg for k in call.keywords if k.arg is not None}
            named |= {k for e in out if e["star"] in ("**", PARTIAL) and "keys" in e for k in e["keys"]}
            keys = [k for k in kwargs if k not in named]
            entry["keys"], entry["values"] = keys, {k: _shown(kwargs[k]) for k in keys}
        else:
            plain = sum(1 for a in call.args if not isinstance(a, ast.Starred))
            held = sum(e.get("length", 0) for e in out if e["star"] in ("*", PARTIAL))
            entry["length"] = len(args) - plain - held
        entry["read"] = "from the arguments the loader received"
        del entry["why"]


def _shown(value: Any) -> str:
    """A plain constant's repr (a tuple of them too); any other value as ``<TypeName>`` (no ``__repr__`` runs)."""
    if isinstance(value, _SIMPLE) or (isinstance(value, tuple) and all(isinstance(v, _SIMPLE) for v in value)):
        return repr(value)[:200]
    return f"<{type(value).__name__}>"


def _value(node: ast.expr, frame: FrameType) -> Any:
    """``node``'s value in ``frame``, read without running the script's code (else :class:`_NotRead`)."""
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals, vars(builtins)):
            if node.id in scope:
                return scope[node.id]
        raise _NotRead(f"{node.id} is not defined there")
    if isinstance(node, ast.Attribute):
        return _attribute(_value(node.value, frame), node.attr)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        obj, key = _value(node.value, frame), node.slice.value
        if type(obj) in (dict, list, tuple):  # exactly these: a subclass's __getitem__ is the script's code
            try:
                return obj[key]
            except (KeyError, IndexError, TypeError) as e:
                raise _NotRead(f"{type(e).__name__}: {e}") from None
        raise _NotRead(f"an item of a {type(obj).__name__}")
    raise _NotRead(f"{type(node).__name__.lower()} expressions are not evaluated (they may run code)")


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name`` from the instance's ``__dict__`` or a class's plain attribute; never a property or
    ``__getattr__``."""
    try:
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        own = None
    if isinstance(own, dict) and name in own:
        return own[name]
    for klass in type(obj).__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            if hasattr(type(value), "__get__"):
                raise _NotRead(f"{type(obj).__name__}.{name} is a {type(value).__name__} (not run)")
            return value
    raise _NotRead(f"{type(obj).__name__}.{name} is not a stored attribute")


def spread(
    source: str,
    call: ast.Call,
    positional: tuple[str, ...],
    unpacked: list[dict[str, Any]] | None,
    defaults: dict[str, str] | None = None,
    text: Callable[[str, ast.AST], str] | None = None,
) -> tuple[dict[str, str] | None, str | None]:
    """``(arguments by name, None)`` for a call that unpacks ``*``/``**`` (see the module's docstring), or
    ``(None, why)``. ``positional``: the callee's positional parameters in order; ``defaults``: the names whose
    default ``gf.accelerate`` does not share, with the callee's default as text; ``text``: how an argument's
    source is written (one line)."""
    shown = text or (lambda src, node: ast.unparse(node))
    entries = [e for e in unpacked or [] if e["star"] != PARTIAL]  # through_partial has written them out
    stars = [a for a in call.args if isinstance(a, ast.Starred)] + [k for k in call.keywords if k.arg is None]
    if len(entries) != len(stars):
        return None, (
            "the call passes *args or **kwargs, and what they held when it ran was not recorded (run the script "
            "under gpufeed diagnose again)"
        )
    for entry in entries:
        if "why" in entry:
            return None, f"the call passes {entry['star']}{entry['expr']}, whose contents were not read: {entry['why']}"
    # the entries are in the call's order, and so are the starred arguments of each kind (call.args, call.keywords)
    singles = iter([e for e in entries if e["star"] == "*"])
    doubles = iter([e for e in entries if e["star"] == "**"])
    args: dict[str, str] = {}
    at = 0
    for node in call.args:
        if isinstance(node, ast.Starred):
            expr, length = _operand(shown(source, node.value)), next(singles)["length"]
            args.update({positional[at + j]: f"{expr}[{j}]" for j in range(length) if at + j < len(positional)})
            at += length
        else:
            if at < len(positional):
                args[positional[at]] = shown(source, node)
            at += 1
    if at > len(positional):
        return None, f"the call passes {at} positional arguments; gpufeed maps the first {len(positional)}"
    mappings = []
    for keyword in call.keywords:
        if keyword.arg is not None:
            args[keyword.arg] = shown(source, keyword.value)
            continue
        expr = _operand(shown(source, keyword.value))
        mappings.append(expr)
        entry = next(doubles)
        for key in entry["keys"]:  # a key given twice is a TypeError at the call: never here
            # None as the run passed it (sampler=None, collate_fn=None: the callee's own choice, read as such)
            args[key] = "None" if entry["values"].get(key) == "None" else f"{expr}[{key!r}]"
    if len(mappings) == 1:  # absent in this run: the callee's default, unless the dict holds it where it runs next
        for name, default in (defaults or {}).items():
            args.setdefault(name, f"{mappings[0]}.get({name!r}, {default})")
    return args, None


def through_partial(
    source: str, call: ast.Call, unpacked: list[dict[str, Any]] | None, cls: str, text: Callable[[str, ast.AST], str]
) -> tuple[str, ast.Call, list[dict[str, Any]]] | None:
    """``(text, call, entries)``: a call of a ``functools.partial`` of the class ``cls`` (its entry in
    ``unpacked``) written as the class's own call, ``cls(*p.args, <the call's positional arguments>,
    **p.keywords, <its keywords>)`` (the call's keywords after the partial's: they win, as at run time), with the
    entries :func:`spread` reads for ``p.args`` and ``p.keywords``; None for any other call. ``text``: how an
    argument's source is written.

    Example:
        >>> entry = {"star": "partial", "expr": "make", "func": "torch.utils.data.dataloader.DataLoader",
        ...          "length": 0, "keys": ["batch_size"], "values": {"batch_size": "8"}}
        >>> call = ast.parse("make(ds, shuffle=True)", mode="eval").body
        >>> through_partial("make(ds, shuffle=True)", call, [entry], "DataLoader", lambda s, n: ast.unparse(n))[0]
        'DataLoader(*make.args, ds, **make.keywords, shuffle=True)'
    """
    entry = next((e for e in unpacked or [] if e["star"] == PARTIAL), None)
    if entry is None or entry["func"].rsplit(".", 1)[-1] != cls:
        return None
    expr = _operand(entry["expr"])
    positional = [text(source, a) if not isinstance(a, ast.Starred) else f"*{text(source, a.value)}" for a in call.args]
    keywords = [f"{k.arg}={text(source, k.value)}" if k.arg else f"**{text(source, k.value)}" for k in call.keywords]
    written = f"{cls}({', '.join([f'*{expr}.args', *positional, f'**{expr}.keywords', *keywords])})"
    held = [
        {"star": "*", "expr": f"{expr}.args", "length": entry["length"]},
        {"star": "**", "expr": f"{expr}.keywords", "keys": entry["keys"], "values": entry["values"]},
    ]
    own = [e for e in unpacked or [] if e["star"] != PARTIAL]
    parsed = parse_call(written)
    assert parsed is not None, written  # made of the call's own parsed parts
    return written, parsed, held + own


def _operand(expr: str) -> str:
    """``expr`` as the operand of ``[...]`` or ``.get``: bracketed unless it is a name, attribute or item."""
    try:
        node = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return f"({expr})"
    return expr if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"({expr})"


def run_value(unpacked: list[dict[str, Any]] | None, name: str) -> str | None:
    """The repr of what an unpacked mapping passed as ``name`` in the run (``'False'``), None if none did."""
    for entry in unpacked or []:
        if name in (entry.get("values") or {}):
            value: str = entry["values"][name]
            return value
    return None
