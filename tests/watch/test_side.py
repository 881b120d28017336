"""side_measurement(): gf.accelerate beside the script's own loader on a real CIFAR-10 dataset, the RNGs as found."""

import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

from gpufeed.watch.side import fitted, side_measurement, subset_size

from fakes import cifar_like

CIFAR_TF = T.Compose(
    [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)]
)


def _rng_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _assert_same_rng(before):
    torch_state, np_state, py_state = before
    assert torch.equal(torch.get_rng_state(), torch_state)
    now = np.random.get_state()
    assert now[0] == np_state[0] and np.array_equal(now[1], np_state[1]) and now[2:] == np_state[2:]
    assert random.getstate() == py_state


def test_a_per_sample_pil_pipeline_is_accelerated_and_both_rates_are_measured():
    loader = DataLoader(cifar_like(1000, transform=CIFAR_TF), batch_size=64, shuffle=True, num_workers=0)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    before = _rng_states()
    out = side_measurement(loader, budget_s=10, device="cpu")
    _assert_same_rng(before)
    assert "error" not in out and "refused" not in out
    # the part measured follows the piloted sample's time (a loaded machine measures fewer): 384 on a quiet one
    assert out["samples"] == fitted(subset_size(1000, 64), 64, out["sample_s"], 10)[0] and out["batch_size"] == 64
    assert out["samples"] % 64 == 0 and subset_size(1000, 64) == 384
    assert "RandomCrop" in out["accelerate"]["plan"] and "RandomHorizontalFlip" in out["accelerate"]["plan"]
    assert out["accelerate"]["img_s"] > 0 and out["accelerate"]["build_s"] > 0
    assert out["script_loader"]["img_s"] > 0
    assert out["script_loader"]["settings"] == {
        "batch_size": 64,
        "shuffle": True,
        "num_workers": 0,
        "pin_memory": False,
        "drop_last": False,
    }


def test_an_opaque_lambda_is_refused_and_tuned_dataloader_settings_are_given_instead():
    tf = T.Compose([T.ToTensor(), T.Lambda(lambda x: x * 2 - 1)])
    loader = DataLoader(cifar_like(600, transform=tf), batch_size=32, shuffle=False)
    before = _rng_states()
    out = side_measurement(loader, budget_s=4, device="cpu")
    _assert_same_rng(before)
    assert "accelerate" not in out
    assert out["refused"]["error"] == "UnsupportedTransformError" and "Lambda" in out["refused"]["reason"]
    assert "num_workers" in out["tuned"]["kwargs"] and "batch_size" not in out["tuned"]["kwargs"]
    assert out["tuned"]["img_s"] > 0 and out["tuned"]["budget_s"] <= 15
    assert out["script_loader"]["img_s"] > 0


def test_the_script_draws_the_same_batches_after_the_measurement_as_without_it():
    loader = DataLoader(cifar_like(256, transform=CIFAR_TF), batch_size=32, shuffle=True)
    torch.manual_seed(3)
    side_measurement(loader, budget_s=5, device="cpu")
    after = next(iter(loader))
    torch.manual_seed(3)
    untouched = next(iter(loader))
    assert torch.equal(after[0], untouched[0]) and torch.equal(after[1], untouched[1])


class _Broken(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        raise OSError(f"cannot read sample {i}")


def test_a_failure_becomes_an_error_entry_and_the_rngs_are_still_restored():
    before = _rng_states()
    out = side_measurement(DataLoader(_Broken(), batch_size=10), budget_s=3, device="cpu")
    assert "cannot read sample" in out["error"]
    _assert_same_rng(before)


def test_a_loader_without_a_batch_size_is_reported_not_raised():
    out = side_measurement(DataLoader(cifar_like(16), batch_size=None), budget_s=3, device="cpu")
    assert "batch_size=None" in out["error"]


def test_workers_are_kept_between_passes_and_the_note_says_so():
    loader = DataLoader(cifar_like(512, transform=CIFAR_TF), batch_size=64, num_workers=1)
    out = side_measurement(loader, budget_s=10, device="cpu")
    assert out["script_loader"]["settings"]["num_workers"] == 1
    assert out["script_loader"]["settings"]["persistent_workers"] is False  # the script's, as found
    assert any("start-up not counted" in n for n in out["notes"])


@pytest.mark.parametrize(
    ("n", "batch", "workers", "expected"),
    [(50_000, 256, 0, 512), (50_000, 256, 4, 2048), (50_000, 32, 0, 384), (50_000, 1000, 16, 8000), (100, 64, 0, 64),
     (20, 64, 0, 20)],
)  # fmt: skip
def test_the_subset_is_whole_batches_at_least_two_when_the_data_allows(n, batch, workers, expected):
    assert subset_size(n, batch, workers) == expected


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_cuda_rng_is_restored_and_accelerate_batches_on_the_device():
    torch.zeros(1, device="cuda")  # the script initialised CUDA
    torch.cuda.manual_seed_all(11)
    cuda_before, before = torch.cuda.get_rng_state_all(), _rng_states()
    loader = DataLoader(cifar_like(1000, transform=CIFAR_TF), batch_size=64, shuffle=True, pin_memory=True)
    out = side_measurement(loader, budget_s=15, device="cuda")
    _assert_same_rng(before)
    assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), cuda_before, strict=True))
    assert out["device"].startswith("cuda") and "refused" not in out
    assert out["accelerate"]["img_s"] > out["script_loader"]["img_s"] > 0


def test_a_distributed_sampler_becomes_a_shuffled_pass_over_the_whole_subset_in_one_process():
    from torch.utils.data.distributed import DistributedSampler

    ds = cifar_like(512, transform=CIFAR_TF)
    loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True))
    out = side_measurement(loader, budget_s=8, device="cpu")
    assert out["script_loader"]["settings"]["shuffle"] is True and "accelerate" in out
    # other notes may say what a loaded machine left out of the budget; this one is there whatever the load
    assert "the script's DistributedSampler is replaced by the samples shuffled, in one process" in out["notes"]


def _prepared(batch_size: int = 16, **config):
    """A DataLoader over 256 CIFAR-shaped samples as ``Accelerator(cpu=True).prepare`` returns it (a shard whose base
    loader has ``batch_size=None`` and a ``batch_sampler``)."""
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True, **config)
    return accelerator, accelerator.prepare(DataLoader(cifar_like(256, transform=CIFAR_TF), batch_size, shuffle=True))


@pytest.mark.parametrize("base", [False, True], ids=["shard", "its-base-loader"])
def test_an_accelerate_prepared_loader_is_measured_at_its_batch_samplers_size_and_order(base):
    _, prepared = _prepared()
    loader = prepared.base_dataloader if base else prepared  # the hook holds the base loader it iterated
    assert loader.batch_size is None  # what the side measurement refused before
    out = side_measurement(loader, budget_s=6, device="cpu")
    assert "error" not in out and "refused" not in out, out
    assert out["batch_size"] == 16 and out["samples"] % out["measured_batch_size"] == 0
    assert out["accelerate"]["img_s"] > 0 and out["accelerate"]["memory_bytes"] > 0
    assert out["script_loader"]["settings"]["shuffle"] is True  # the batch sampler's order, not .sampler's
    assert out["script_loader"]["settings"]["batch_size"] == out["measured_batch_size"]


def test_a_prepared_loader_that_skips_its_first_batches_and_a_split_shard_are_measured_per_process():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, RandomSampler

    from gpufeed.watch.found import batch_size_of, order_sampler

    accelerator, prepared = _prepared(batch_size=8)
    skipping = accelerator.skip_first_batches(prepared, 2)  # a resumed epoch: SkipBatchSampler inside
    assert (batch_size_of(skipping), type(order_sampler(skipping)).__name__) == (8, "RandomSampler")
    ds = cifar_like(64, transform=T.ToTensor())
    # two ranks splitting each batch of 16 (split_batches=True): this process gets 8 of each
    split = BatchSamplerShard(BatchSampler(RandomSampler(ds), 16, False), num_processes=2, split_batches=True)
    loader = DataLoader(ds, batch_sampler=split)
    assert batch_size_of(loader) == 8 == len(next(iter(loader))[0])
    assert isinstance(order_sampler(loader), RandomSampler)
    out = side_measurement(skipping, budget_s=5, device="cpu")
    assert out["batch_size"] == 8 and "accelerate" in out


def test_a_batch_sampler_without_a_batch_size_is_named_in_the_error():
    class Buckets:
        def __iter__(self):
            return iter([[0, 1], [2, 3, 4]])

        def __len__(self):
            return 2

    out = side_measurement(DataLoader(cifar_like(16), batch_sampler=Buckets()), budget_s=3, device="cpu")
    assert "Buckets" in out["error"] and "batch_size" in out["error"]


class _Rows(Dataset):
    """Rows as a Trainer's dataset gives them: a dict with a PIL image the script's collate function leaves out."""

    def __init__(self) -> None:
        self.inner = cifar_like(96)

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> dict:
        image, label = self.inner[i]
        return {"image": image, "pixel_values": T.functional.to_tensor(image), "label": label}


def _stack(rows: list[dict]) -> dict:
    pixels, labels = torch.stack([r["pixel_values"] for r in rows]), torch.tensor([r["label"] for r in rows])
    return {"pixel_values": pixels, "labels": labels}


def test_the_tuned_settings_are_measured_with_the_scripts_collate_function():
    loader = DataLoader(_Rows(), batch_size=16, collate_fn=_stack)
    out = side_measurement(loader, budget_s=4, device="cpu")
    assert "error" not in out, out["error"]  # default_collate cannot batch the rows' PIL images
    assert "refused" in out and out["tuned"]["img_s"] > 0 and out["script_loader"]["img_s"] > 0
