import json

import pytest

from gpufeed.errors import ConfigError
from gpufeed.train import TrainConfig, train
from gpufeed.train.loop import _lr_at


@pytest.mark.slow
def test_gpufeed_learns_what_the_torchvision_pipeline_learns(tmp_path):
    """Accuracy parity: same model, seed and schedule; only the loader differs.

    Two runs that differ only in their augmentation random streams land within about 3 points of
    each other at this size (4,000 training images, 1,000 test, 3 epochs); the tolerance is 6. A
    pipeline that got the normalisation, labels or augmentation wrong lands 10+ points away.
    """
    base = dict(model="small", epochs=3, train_size=4000, test_size=1000, seed=0, device="cpu", progress=False)
    ours = train(TrainConfig(loader="gpufeed", **base), out=tmp_path)
    ref = train(TrainConfig(loader="torch", num_workers=0, **base))
    assert ours[-1].test_acc > 0.35  # well above chance (0.10)
    assert abs(ours[-1].test_acc - ref[-1].test_acc) < 0.06
    assert all(abs(a.train_loss - b.train_loss) < 0.08 for a, b in zip(ours, ref, strict=True))
    saved = json.loads((tmp_path / "train.json").read_text())
    assert [e["epoch"] for e in saved["epochs"]] == [0, 1, 2] and saved["config"]["loader"] == "gpufeed"
    assert saved["epochs"][-1]["test_acc"] == ours[-1].test_acc
    assert all(0 <= e["data_wait_fraction"] < 1 and e["images"] == 15 * 256 for e in saved["epochs"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(cuda_graphs=True, amp="fp16"), "use bf16"),
        (dict(loader="fast"), "loader='fast'"),
        (dict(amp="fp8"), "amp='fp8'"),
        (dict(model="alexnet"), "model='alexnet'"),
    ],
)
def test_bad_configurations_are_refused_with_the_alternative(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kwargs)


def test_cuda_graphs_need_a_cuda_device():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        train(TrainConfig(cuda_graphs=True, device="cpu", train_size=512, test_size=64, progress=False))


def test_schedule_warms_up_then_decays_to_zero():
    lrs = [_lr_at(s, 100, 1.0) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and max(lrs) == pytest.approx(1.0) and lrs[100] == 0.0
    assert lrs.index(max(lrs)) == 15 and all(a >= b for a, b in zip(lrs[15:], lrs[16:], strict=False))
