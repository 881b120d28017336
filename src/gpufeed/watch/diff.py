"""The change of a report applied to the script's text: the call replaced where it stands, ``import gpufeed as gf``
(and the change's other imports) added once after the docstring and ``__future__`` imports, a statement the change
puts before the call's (a Trainer's line) at its indentation; and the unified diff a user applies with ``patch -p1``.
Line numbers after the call stay those of the original (the call's other lines become blank), so the report's lines
still point into the changed file.
"""

from __future__ import annotations

import ast
import difflib
from typing import TYPE_CHECKING

from .source import one_line

if TYPE_CHECKING:
    from .advice import Change

__all__ = ["file_change"]


def file_change(text: str, line: int, change: Change, name: str = "train.py") -> tuple[str, str]:
    """``(new text, unified diff)``: ``text`` (a file's) with the call of ``change`` that starts at ``line``
    replaced and its imports added after the module's docstring and ``__future__`` imports. The diff names the
    file ``a/NAME`` and ``b/NAME`` (``patch -p1`` applies it where ``NAME`` is a relative path).

    Example:
        >>> from gpufeed.watch.advice import Change
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
        raise ValueError(f"the call {one_line(change.old)!r} is not at line {line} of {name}")
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
