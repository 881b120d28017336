"""The names the command line offers before anything is imported: the loaders ``gpufeed train --loader`` compares
(:mod:`.loaders` builds them). Kept apart so that building the parser imports no torchvision."""

from __future__ import annotations

__all__ = ["LOADER_KINDS"]

LOADER_KINDS = ("torch", "pretransform", "gpu-per-sample", "gpufeed", "fixed")
