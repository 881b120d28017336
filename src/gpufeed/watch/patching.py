"""Patch a module as soon as it is imported, without importing it first: how :mod:`gpufeed.watch.hook` reaches
``torch.utils.data.dataloader`` (and torchdata's, and gpufeed's loaders) in a script that has not imported torch yet.

A meta-path finder asks the other finders for the module's spec as usual and wraps its loader: the module executes
as it would, then the patch runs on it, once, before any code of the script sees it, with the seconds the module's
execution took (its own imports included: what importing it cost the script).
"""

from __future__ import annotations

import importlib.abc
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PatchOnImport"]


class PatchOnImport:
    """A meta-path finder that lets torch (and torchdata) import their loader modules as usual, then patches them.

    Example:
        >>> finder = PatchOnImport({"some.module": lambda module, seconds: None})
        >>> finder.find_spec("another.module") is None
        True
    """

    def __init__(self, patches: Mapping[str, Callable[[Any, float], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.patches[name])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[Any, float], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        t0 = time.perf_counter()
        self.loader.exec_module(module)
        self.patch(module, time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
