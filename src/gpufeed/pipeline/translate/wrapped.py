"""A transform object of the script's own that only applies the recipe it holds, seen through to that recipe.

torchvision's classification reference (``references/classification/presets.py``) wraps its recipe in a class::

    class ClassificationPresetTrain:
        def __init__(self, *, crop_size, ..., backend="pil", use_v2=False):
            ...
            self.transforms = T.Compose(transforms)

        def __call__(self, img):
            return self.transforms(img)

Such an object computes exactly what ``self.transforms`` computes, so gpufeed splits ``self.transforms``. "Only
applies" is read from the method's source (``__call__``, or ``forward`` for an ``nn.Module`` without hooks), never
guessed from names: it takes one argument and its body is a chain of the object's own attributes applied to it
(``return self.t(x)``; ``x = self.a(x)`` ... ``return x``; ``return self.b(self.a(x))``), a docstring aside. A call
that does anything else (adds noise, returns a tuple, applies its transform twice as MoCo's ``TwoCropsTransform``
does for two views) is not seen through, and :func:`why_not` says what it does instead.

Example:
    >>> import torchvision.transforms as T
    >>> class Preset:
    ...     def __init__(self):
    ...         self.transforms = T.Compose([T.RandomCrop(8), T.ToTensor()])
    ...     def __call__(self, img):
    ...         return self.transforms(img)
    >>> [type(t).__name__ for t in held(Preset())]
    ['Compose']
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any

__all__ = ["held", "view_transforms", "why_not"]


def held(op: Any) -> list[Any] | None:
    """The transforms ``op`` applies one after the other when its call does nothing else, else None."""
    read = _read(op)
    return read[0] if read is not None and read[1] is None else None


def why_not(op: Any) -> str | None:
    """For an object that holds a transform but whose call does more than apply it: what the call does, for the
    refusal; None for any other object (its class name says enough)."""
    read = _read(op)
    return read[1] if read is not None else None


def _read(op: Any) -> tuple[list[Any] | None, str | None] | None:
    """``(the held transforms, None)``, ``(None, why not)``, or None when ``op`` holds no transform at all."""
    if not _holds_transform(op):
        return None
    method, name = _method(op)
    if method is None:
        return None, name
    try:
        tree = _parsed(method)
    except (OSError, TypeError, SyntaxError) as e:
        return None, f"its {name} has no source to read ({type(e).__name__}), so what it does is not known"
    applied, why = _chain(tree)
    if applied is None:
        return None, f"its {name} does more than apply what it holds: {why}"
    out = []
    for attr in applied:
        value = _own(op).get(attr)
        if value is None or not callable(value):
            return None, f"its {name} applies self.{attr}, which is not a transform it holds"
        out.append(value)
    if len(set(map(id, out))) < len(out):
        return None, (
            f"its {name} applies self.{applied[0]} more than once to the same input: gpufeed serves one view of "
            "each sample"
        )
    return out, None


def view_transforms(op: Any) -> list[Any] | None:
    """The transform of each view when ``op``'s call returns several views of one image, each the image through a
    transform it holds (MoCo's ``TwoCropsTransform``: ``q = self.base_transform(x)``, ``k = ...``, ``return [q, k]``;
    BYOL's two recipes); None for any other object. ``gf.accelerate`` serves them as ``views=``: the same
    ``([view_1, view_2], labels)`` batches, each view with its own draws.

    Example:
        >>> import torchvision.transforms as T
        >>> class TwoCropsTransform:
        ...     def __init__(self, base_transform):
        ...         self.base_transform = base_transform
        ...     def __call__(self, x):
        ...         q = self.base_transform(x)
        ...         k = self.base_transform(x)
        ...         return [q, k]
        >>> base = T.RandomCrop(8)
        >>> view_transforms(TwoCropsTransform(base)) == [base, base]
        True
    """
    if not _holds_transform(op):
        return None
    method, _ = _method(op)
    try:
        read = _body(_parsed(method)) if method is not None else None
    except (OSError, TypeError, SyntaxError):
        return None
    if read is None:
        return None
    self, x, body = read
    if not body or not isinstance(body[-1], ast.Return) or not isinstance(body[-1].value, (ast.List, ast.Tuple)):
        return None
    named: dict[str, list[str] | None] = {}  # q = self.base_transform(x)
    for statement in body[:-1]:
        targets = _names(statement.targets) if isinstance(statement, ast.Assign) else []
        if not targets or targets == [x]:
            return None
        named[targets[0]] = _applied(statement.value, self, x)  # type: ignore[attr-defined]
    chains = [named.get(e.id) if isinstance(e, ast.Name) else _applied(e, self, x) for e in body[-1].value.elts]
    own = _own(op)
    out = [own.get(chain[0]) if chain is not None and len(chain) == 1 else None for chain in chains]
    return out if len(out) >= 2 and all(v is not None and callable(v) for v in out) else None


def _holds_transform(op: Any) -> bool:
    """Whether one of ``op``'s own attributes is a torchvision or timm transform (a recipe wrapper)."""
    if isinstance(op, type) or not hasattr(op, "__dict__") or type(op).__module__.startswith(("torchvision.", "timm.")):
        return False
    return any(type(v).__module__.startswith(("torchvision.transforms", "timm.data")) for v in _own(op).values())


def _own(op: Any) -> dict[str, Any]:
    """``op``'s own attributes: its ``__dict__``, and an ``nn.Module``'s submodules (kept in ``_modules``; v2's
    transforms and v1's random ones are modules)."""
    own = dict(vars(op))
    modules = own.get("_modules")
    return {**own, **modules} if isinstance(modules, dict) else own


def _method(op: Any) -> tuple[Any, str]:
    """The method that runs when ``op`` is called, and its name; ``(None, why)`` when that is not one method."""
    try:
        import torch

        module = isinstance(op, torch.nn.Module)
    except ImportError:  # pragma: no cover - torch is a dependency
        module = False
    if module:
        hooks = [h for h in ("_forward_hooks", "_forward_pre_hooks") if getattr(op, h, None)]
        if hooks:
            return None, f"it is an nn.Module with {' and '.join(hooks)} registered, which change what forward gives"
        return type(op).forward, "forward"
    call = type(op).__call__
    if getattr(call, "__qualname__", "").split(".")[0] == "object" or not inspect.isfunction(call):
        return None, "its __call__ is not a Python method of its own"
    return call, "__call__"


@functools.cache
def _parsed(method: Any) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(method))).body[0]
    if not isinstance(node, ast.FunctionDef):
        raise SyntaxError("not a plain function")
    return node


def _body(fn: ast.FunctionDef) -> tuple[str, str, list[ast.stmt]] | None:
    """``(self, x, statements)`` of a method that takes one argument, its docstring left out; else None."""
    args = fn.args
    if args.vararg or args.kwarg or args.kwonlyargs or len(args.posonlyargs + args.args) != 2:
        return None
    self, x = (a.arg for a in args.posonlyargs + args.args)
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return self, x, body


def _chain(fn: ast.FunctionDef) -> tuple[list[str] | None, str]:
    """The attributes of ``self`` the method's body applies to its one argument, in order; or None and why not."""
    read = _body(fn)
    if read is None:
        return None, f"it takes {ast.unparse(fn.args)!r}, not one image"
    self, x, body = read
    applied: list[str] = []
    for i, statement in enumerate(body):
        last = i == len(body) - 1
        if last and isinstance(statement, ast.Return) and statement.value is not None:
            value = statement.value
        elif not last and isinstance(statement, ast.Assign) and _names(statement.targets) == [x]:
            value = statement.value
        else:
            return None, _views(body[-1]) or f"`{_line(statement)}`"
        chain = _applied(value, self, x)
        if chain is None:
            return None, _views(body[-1]) or f"`{_line(statement)}`"
        applied += chain
    return (applied, "") if body else (None, "its body is empty")


def _views(last: ast.stmt) -> str | None:
    """What a call that returns several values per image (MoCo's ``TwoCropsTransform``: ``return [q, k]``) does."""
    if isinstance(last, ast.Return) and isinstance(last.value, (ast.List, ast.Tuple)):
        n = len(last.value.elts)
        return (
            f"it returns {n} values for each image (`{_line(last)}`): {n} views of each sample, where gpufeed serves "
            "one batched view; give the dataset the transform it holds to serve one view batched"
        )
    return None


def _applied(node: ast.expr, self: str, x: str) -> list[str] | None:
    """``self.a(self.b(x))`` -> ``["b", "a"]``; ``x`` -> ``[]``; anything else None."""
    if isinstance(node, ast.Name) and node.id == x:
        return []
    if (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == self
    ):
        inner = _applied(node.args[0], self, x)
        return None if inner is None else [*inner, node.func.attr]
    return None


def _names(targets: list[ast.expr]) -> list[str]:
    return [t.id for t in targets if isinstance(t, ast.Name)] if len(targets) == 1 else []


def _line(node: ast.stmt) -> str:
    text = ast.unparse(node).splitlines()
    return text[0] + (" ..." if len(text) > 1 else "")
