"""Training CIFAR-sized models fast: models, loaders to compare, and the loop (AMP, channels_last, CUDA graphs)."""

from .loop import EpochRecord, TrainConfig, train
from .models import MODELS, build_model

__all__ = ["MODELS", "EpochRecord", "TrainConfig", "build_model", "train"]
