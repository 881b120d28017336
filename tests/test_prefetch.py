"""prefetch(): pass-through on the CPU, ordered look-ahead, copies that never race on CUDA."""

from collections import namedtuple

import pytest
import torch

from gpufeed import ConfigError, prefetch
from gpufeed.loading.prefetch import lookahead, map_tensors

Pair = namedtuple("Pair", "x y")


def _failing_source(n_ok: int):
    for i in range(n_ok):
        yield torch.full((2,), i)
    raise RuntimeError(f"broken sample after {n_ok}")


def test_cpu_is_a_pass_through_of_the_same_objects():
    batches = [torch.ones(2), {"a": torch.zeros(1)}]
    assert [id(b) for b in prefetch(batches, device="cpu")] == [id(b) for b in batches]


def test_prefetcher_is_reiterable_and_has_the_source_length():
    p = prefetch([1, 2, 3], device="cpu")
    assert len(p) == 3 and list(p) == list(p) == [1, 2, 3]


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_lookahead_starts_exactly_depth_items_ahead(depth):
    log = []
    out = []
    for item in lookahead(
        range(6), depth, start=lambda i: log.append(("start", i)) or i, finish=lambda i: log.append(("finish", i)) or i
    ):
        out.append(item)
        started = max(i for kind, i in log if kind == "start")
        assert started == min(item + depth, 5)  # never more than depth in flight
    assert out == list(range(6))


@pytest.mark.parametrize("depth", [1, 3])
def test_source_error_surfaces_after_the_earlier_batches(depth):
    seen = []
    with pytest.raises(RuntimeError, match="broken sample after 3"):
        for b in lookahead(_failing_source(3), depth, start=lambda b: b, finish=lambda b: b):
            seen.append(int(b[0]))
    assert seen == [0, 1, 2]


def test_map_tensors_keeps_the_structure_and_passes_other_leaves():
    batch = {"img": torch.ones(1), "meta": ["name", 3], "pair": Pair(torch.zeros(1), (torch.ones(1), None))}
    out = map_tensors(batch, lambda t: t + 1)
    assert out["meta"] == ["name", 3] and isinstance(out["pair"], Pair) and out["pair"].y[1] is None
    assert out["img"].item() == 2 and out["pair"].x.item() == 1 and out["pair"].y[0].item() == 2


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_depth_must_be_a_positive_int(depth):
    with pytest.raises(ConfigError, match="depth="):
        prefetch([], device="cpu", depth=depth)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_arrive_intact_and_in_order():
    source = [(torch.full((256, 1024), float(i)), {"label": torch.tensor([i])}, "tag") for i in range(50)]
    for i, (x, d, tag) in enumerate(prefetch(source, device="cuda", depth=3)):
        assert x.is_cuda and d["label"].is_cuda and tag == "tag"
        torch.cuda._sleep(1_000_000)  # a slow consumer: a missing wait or record_stream would show here
        assert float(x.sum()) == i * 256 * 1024 and int(d["label"]) == i


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_source_error_surfaces_after_the_earlier_batches():
    seen = []
    with pytest.raises(RuntimeError, match="broken sample after 2"):
        for b in prefetch(_failing_source(2), device="cuda"):
            seen.append(int(b[0]))
    assert seen == [0, 1]
