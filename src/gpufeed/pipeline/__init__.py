"""``accelerate`` and ``build_cache`` as stages, data flowing one way: request -> probe -> plan -> materialise ->
assemble (ARCHITECTURE.md); ``translate/`` turns torchvision ops into gpufeed ops."""

__all__: list[str] = []  # the public names are gpufeed's own (gpufeed/__init__.py)
