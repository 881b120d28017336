"""Put first on a watched script's ``PYTHONPATH`` by ``gpufeed diagnose -- CMD``: Python imports it at startup.

When ``GPUFEED_WATCH_DIR`` is set it installs :mod:`gpufeed.watch.hook`; then it runs the next ``sitecustomize``
found on ``sys.path`` (the user's or the distribution's), which this file hides by coming first.

NOTE [ no gpufeed, no torch at startup ]: every Python process the command starts imports this file (torchrun's
launcher, multiprocessing's helpers, spawned workers), so it must be cheap and change nothing the script sees:
``import gpufeed`` would import torch and torchvision (seconds) before the script sets its environment. The hook's
modules (``hook``, ``state``, ``record``, ``sampler``, ``found``, ``unpacked``, ``source``, ``clock``, ``patching``,
``signals``: standard library and psutil only) are loaded as the private package ``_gpufeed_watch``, which runs no
``gpufeed/__init__.py``; the hook imports torch only once the script has.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from importlib.machinery import PathFinder

__all__: list[str] = []

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = "_gpufeed_watch"


def _install() -> None:
    if _PACKAGE not in sys.modules:
        package = types.ModuleType(_PACKAGE)
        package.__path__ = [os.path.dirname(_HERE)]  # gpufeed/watch, without gpufeed/__init__.py
        sys.modules[_PACKAGE] = package
    importlib.import_module(f"{_PACKAGE}.hook").install()


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after this directory, as Python would have without us."""
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    later = sys.path[paths.index(_HERE) + 1 :] if _HERE in paths else [p for p in sys.path if p]
    spec = PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None or os.path.dirname(os.path.abspath(spec.origin or "")) == _HERE:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # only at startup, not when a test collector imports this file
    if os.environ.get("GPUFEED_WATCH_DIR"):
        try:
            _install()
        except Exception as e:  # noqa: BLE001 - the script runs unmeasured rather than not at all
            print(f"gpufeed diagnose: the hook was not installed: {type(e).__name__}: {e}", file=sys.stderr)
    _chain()
