"""gpufeed's modules import one way: no cycle among them, counting every import a module's text makes (at the top,
inside functions, under ``TYPE_CHECKING``), read statically from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import gpufeed

SRC = Path(gpufeed.__file__).resolve().parent


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The gpufeed modules ``path`` imports (a name imported from a package counts as its module when it is one)."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                target = f"{base}.{a.name}"
                out.add(target if target in modules else base)
    return {m for m in out if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    files = [p for p in SRC.rglob("*.py") if "site" not in p.relative_to(SRC).parts]
    modules = {_module(p) for p in files}
    return {_module(p): _imports(p, modules) for p in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_gpufeed_imports_one_that_imports_it_back() -> None:
    graph = _graph()
    assert {"gpufeed.watch.analyse", "gpufeed.watch.summary", "gpufeed.mds.urls"} <= set(graph)
    assert "gpufeed.watch.summary" in graph["gpufeed.watch.text"]  # the reader sees relative imports
    assert _cycles(graph) == []
