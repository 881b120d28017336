"""accelerate() as stages: request -> probe -> plan -> materialise -> loader, each once, the dataset read once."""

from collections import Counter
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torch.utils.data import Dataset

import gpufeed as gf
import gpufeed.pipeline.accelerate as accelerate_module
import gpufeed.pipeline.plan as plan_module
import gpufeed.pipeline.probe as probe_module
from gpufeed.pipeline.probe import probe
from gpufeed.store.ragged import Ragged

from fakes import image_folder

KW = dict(device="cpu", cache=False, progress=False, num_workers=0)


class Counted(Dataset):
    """Images of the given (height, width) sizes; counts each read of each index."""

    def __init__(self, sizes, transform=None):
        self.images = [torch.full((3, h, w), i % 251, dtype=torch.uint8) for i, (h, w) in enumerate(sizes)]
        self.transform = transform
        self.reads: Counter = Counter()

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        self.reads[i] += 1
        image = self.images[i]
        return (self.transform(image) if self.transform is not None else image), i % 3


def _reads_beyond_the_probe(ds, transforms):
    """How often accelerate read each index, less what the probe stage alone reads (its reads are fixed)."""
    probe(ds, transforms)
    probed = Counter(ds.reads)
    ds.reads.clear()
    loader = gf.accelerate(ds, batch_size=4, **KW)
    return loader, {i: ds.reads[i] - probed[i] for i in range(len(ds))}


@pytest.mark.parametrize("n", [7, 20])
def test_a_dataset_of_one_size_is_read_once(n):
    ds = Counted([(12, 10)] * n, T.Compose([T.CenterCrop(8), T.RandomHorizontalFlip()]))
    loader, reads = _reads_beyond_the_probe(ds, [ds.transform])
    assert reads == dict.fromkeys(range(n), 1)
    assert loader.images.shape == (n, 3, 8, 8)


@pytest.mark.parametrize("odd", [[1, 2], [3, 4, 5, 6, 7, 8]])
def test_sizes_the_probe_did_not_see_cost_no_second_read(odd):
    # the probe reads samples 0, n/2 and n-1 (one size); the read meets the others and keeps each as it is
    sizes = [(24, 20)] * 10
    for i in odd:
        sizes[i] = (17 + i, 30 - i)
    ds = Counted(sizes, T.RandomResizedCrop(8))
    loader, reads = _reads_beyond_the_probe(ds, [ds.transform])
    assert reads == dict.fromkeys(range(10), 1)
    assert isinstance(loader.images, Ragged)
    assert [tuple(s) for s in loader.images.shapes.tolist()] == [(3, h, w) for h, w in sizes]
    assert "images of different sizes" in loader.plan.notes[1]
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == sorted(i % 3 for i in range(10))


def test_the_batched_ops_are_built_once_per_view_and_the_budget_measured_once(monkeypatch):
    built, measured = [], []
    real_build, real_host = probe_module.build_batched, plan_module.host_available
    monkeypatch.setattr(probe_module, "build_batched", lambda *a, **k: built.append(a) or real_build(*a, **k))
    monkeypatch.setattr(plan_module, "host_available", lambda: measured.append(1) or real_host())
    ds = Counted([(12, 12)] * 8)
    views = [v2.Compose([v2.RandomCrop(10), v2.RandomHorizontalFlip()]), v2.Compose([v2.RandomCrop(6)])]
    loader = gf.accelerate(ds, batch_size=4, views=views, **KW)
    assert len(built) == 2 and len(measured) == 1
    first = next(iter(loader))[0]
    assert [tuple(v.shape) for v in first] == [(4, 3, 10, 10), (4, 3, 6, 6)]


def test_the_stages_run_in_order_each_once(monkeypatch):
    calls = []
    for name in ("request", "probe", "plan", "materialise", "device_loader"):
        real = getattr(accelerate_module, name)
        monkeypatch.setattr(accelerate_module, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    ds = Counted([(9, 9)] * 6, T.RandomCrop(8))
    loader = gf.accelerate(ds, batch_size=3, **KW)
    assert calls == ["request", "probe", "plan", "materialise", "device_loader"]
    assert loader.plan is not None and loader.plan.storage == "device" and len(loader) == 2


def test_a_bad_option_is_refused_before_any_sample_is_read():
    ds = Counted([(9, 9)] * 6, T.RandomCrop(8))
    bad = [dict(batch_size=0), dict(store="png"), dict(even="yes"), dict(dtype=torch.int64), dict(max_side=0)]
    bad += [dict(shard="ring"), dict(cache="no"), dict(num_workers=-1), dict(views=[T.RandomCrop(8)])]
    for options in bad:
        with pytest.raises(gf.ConfigError):
            gf.accelerate(ds, **{**KW, **options})
    assert ds.reads == Counter()
    # what depends on the pipeline is refused by the plan, after the probe's few reads and before the dataset's
    with pytest.raises(gf.ConfigError, match="on_error='skip' leaves out the files of a folder"):
        gf.accelerate(ds, on_error="skip", **KW)
    assert ds.reads == _probe_reads(6, T.RandomCrop(8))


def _probe_reads(n, transform):
    ds = Counted([(9, 9)] * n, transform)
    probe(ds, [transform])
    return ds.reads


def test_an_entry_of_images_of_different_sizes_is_not_served_to_a_recipe_that_needs_one_size(tmp_path):
    # The first recipe keeps them as they are (RandomResizedCrop after a cached Pad: read sample by sample, the
    # probe's three samples share a size, the read meets another): one read, kept under the key of images at their
    # own sizes. A second recipe with the same cached part that needs one size does not find it: its fresh read
    # meets the other size, and is refused (or takes the fallback) as before.
    sizes = [(20, 24)] * 10
    sizes[2] = (27, 19)  # file 2 is sample 1 (two classes alternating); the probe reads samples 0, 5 and 9
    kw = {**KW, "cache": tmp_path / "cache"}
    folder = image_folder(tmp_path / "photos", sizes, transform=T.Compose([T.Pad(1), T.RandomResizedCrop(8)]))
    first = gf.accelerate(folder, batch_size=4, **kw)
    assert isinstance(first.images, Ragged) and first.plan.cache_path is not None
    assert gf.open_cache(first.plan.cache_path).manifest.meta["pipeline"]["kind"] == "pixels"
    assert [p.name for p in (tmp_path / "cache").glob("imagefolder-*")] == [Path(first.plan.cache_path).name]
    again = gf.accelerate(folder, batch_size=4, **kw)
    assert again.plan.ingest.startswith("cache hit") and again.plan.cache_path == first.plan.cache_path
    assert "images of different sizes" in again.plan.notes[1]
    folder.transform = T.Compose([T.Pad(1), T.RandomCrop(8), T.PILToTensor()])
    with pytest.raises(gf.DataError, match="every image must leave the cached part with one shape"):
        gf.accelerate(folder, batch_size=4, **kw)
    with pytest.warns(UserWarning, match="falls back to per-sample"):
        slow = gf.accelerate(folder, batch_size=4, fallback="prefetch", **kw)
    assert slow.plan.storage == "fallback" and sum(y.shape[0] for _, y in slow) == 10
