"""Datasets gpufeed ships: a synthetic CIFAR-10 in the real on-disk format."""

from .synthetic import SyntheticCIFAR10, cifar10, default_root, describe, write_synthetic_cifar10

__all__ = ["SyntheticCIFAR10", "cifar10", "default_root", "describe", "write_synthetic_cifar10"]
