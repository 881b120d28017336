"""The layout: each layer imports only from the layers below it (lazy imports inside functions included), and
no module grows past 500 lines. README's "Layout" section names the layers."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpufeed"

# Low to high. A module may import from its own package and from lower layers only; the tools may use each other.
LAYERS = [
    {"errors", "version"},
    {"device"},
    {"validate", "sampling", "workers", "threads", "inside"},
    {"options"},
    {"cache"},
    {"store"},
    {"augment"},
    {"read"},
    {"mds"},
    {"loading"},
    {"pipeline"},
    {"diagnose", "findings", "report", "tune", "bench", "train", "cli", "data", "watch", "__init__", "__main__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
TOOLS = len(LAYERS) - 1


def _part(module: str) -> str:
    """``gpufeed.read.samples`` -> ``read``; ``gpufeed`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every gpufeed module that ``source`` (the module ``module``) imports, anywhere in it, with its line."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from .. import x`: the module x if there is one, else a name of the package (its __init__)
            names = [target] if node.module else [_submodule_or_package(target, a.name) for a in node.names]
            found += [(node.lineno, name) for name in names if name.startswith("gpufeed")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpufeed")]
    return found


def _submodule_or_package(package: str, name: str) -> str:
    path = SRC.parent.joinpath(*package.split("."), name)
    return f"{package}.{name}" if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() else package


def _climbing(module: str, source: str, is_package: bool = False) -> list[str]:
    own = _part(module)
    out = []
    for line, target in _imports(module, source, is_package):
        other = _part(target)
        if other == own or other not in RANK:
            continue
        if RANK[other] > RANK[own] or (RANK[other] == RANK[own] and RANK[own] != TOOLS):
            out.append(f"line {line}: {target} ({other}, layer {RANK[other]}; {own} is layer {RANK[own]})")
    return out


def _files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_and_module_has_a_layer():
    assert {_part(_module(p)) for p in _files()} - set(RANK) == set(), "give it a layer in LAYERS and README's Layout"


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(SRC)))
def test_a_layer_imports_only_from_the_layers_below(path):
    assert _climbing(_module(path), path.read_text(), path.name == "__init__.py") == []


def test_the_check_finds_an_import_that_climbs_even_inside_a_function():
    lazy = "import torch\n\ndef f():\n    from ..pipeline.accelerate import accelerate\n    return accelerate\n"
    assert _climbing("gpufeed.cache.x", lazy) == [
        "line 4: gpufeed.pipeline.accelerate (pipeline, layer 10; cache is layer 4)"
    ]
    sideways = "from ..augment import Compose\n"  # augment and read are different layers; read -> augment is down
    assert _climbing("gpufeed.read.x", sideways) == [] and _climbing("gpufeed.store.x", sideways) != []
    assert _climbing("gpufeed.store", "from . import ragged\nfrom .. import errors\n", is_package=True) == []
    # a name of the top package (its __init__ is the tools' layer), not a module: climbing
    assert _climbing("gpufeed.loading.x", "def f():\n    from .. import __version__\n") == [
        "line 2: gpufeed (__init__, layer 11; loading is layer 9)"
    ]


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(SRC)): n for p in _files() if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
