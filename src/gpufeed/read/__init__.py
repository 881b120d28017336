"""Datasets to arrays: a dataset's own arrays, every sample through a transform, a folder's files and headers, and
what identifies them (cache keys); torch's ``Subset`` and ``ConcatDataset`` seen through."""

__all__: list[str] = []  # the public names are gpufeed's own (gpufeed/__init__.py)
