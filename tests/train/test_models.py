import pytest
import torch

from gpufeed.errors import ConfigError
from gpufeed.train.models import MODELS, build_model

PARAMS = {"small": 94_762, "resnet9": 6_573_120, "resnet18": 11_173_962, "vgg16": 14_724_042}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_map_cifar_batches_to_class_logits(name):
    model = build_model(name).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[name]


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ConfigError, match="resnet9"):
        build_model("alexnet")
