"""The loaders: :class:`~gpufeed.DeviceLoader` over any store, the per-sample
:class:`~gpufeed.FallbackLoader`, the epoch and resume contract both share, ``prefetch`` and the ``Plan`` record."""

__all__: list[str] = []  # the public names are gpufeed's own (gpufeed/__init__.py)
