"""A loader call's source text, as the hook found it at the script's line: parsed (its continuation lines may be
indented), each argument as written on one line, and its lines as a reader sees them.

NOTE [ standard library only ]: :mod:`gpufeed.watch.unpacked`, which the hook loads under its private package
(``watch/site``), parses calls with :func:`parse_call`.

Example:
    >>> text = "DataLoader(\\n        ds,\\n        batch_size=args.bs,\\n    )"
    >>> [arg_text(text, k.value) for k in parse_call(text).keywords]
    ['args.bs']
    >>> one_line("f(a,\\n  b)")
    'f(a, b)'
"""

from __future__ import annotations

import ast
import textwrap

__all__ = ["arg_text", "one_line", "parse_call", "source_lines"]


def source_lines(source: str) -> list[str]:
    """The lines of a call's source text as a reader sees them: the continuation lines dedented together (the
    first line starts at the call, the others keep the indentation of the file they came from).

    Example:
        >>> source_lines("DataLoader(\\n            ds,\\n            batch_size=8,\\n        )")
        ['DataLoader(', '    ds,', '    batch_size=8,', ')']
    """
    first, *rest = source.strip("\n").splitlines() or [""]
    return [first.strip(), *textwrap.dedent("\n".join(rest)).splitlines()] if rest else [first.strip()]


def parse_call(source: str) -> ast.Call | None:
    """The call expression of ``source`` (the text of one call, possibly over several indented lines)."""
    try:
        tree = ast.parse(f"(\n{source.strip()}\n)", mode="eval")  # brackets: continuation lines may be indented
    except SyntaxError:
        return None
    return tree.body if isinstance(tree.body, ast.Call) else None


def arg_text(source: str, node: ast.AST) -> str:
    """The argument as written: its own source text, on one line when it spans several."""
    wrapped = f"(\n{source.strip()}\n)"
    text = ast.get_source_segment(wrapped, node)
    if text is None or "\n" not in text:
        return text if text is not None else ast.unparse(node)
    joined = one_line(text)
    try:  # a comment inside the expression would swallow the rest of the joined line
        ast.parse(joined, mode="eval")
    except SyntaxError:
        return ast.unparse(node)
    return joined


def one_line(text: str) -> str:
    """``text`` on one line: its lines stripped, joined by a space except inside an opening or before a closing."""
    out = ""
    for part in (p.strip() for p in text.splitlines()):
        if part:
            out += part if not out or out[-1] in "([{" or part[0] in ")]}" else f" {part}"
    return out
