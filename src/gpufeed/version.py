"""gpufeed's version (kept equal to pyproject.toml's by tests/test_api.py); a state records the one that saved it."""

__all__ = ["__version__"]

__version__ = "0.1.0"
