import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as TF
from PIL import Image

from gpufeed import ConfigError, DataError, FallbackLoader, UnsupportedTransformError, accelerate
from gpufeed.sampling import epoch_order

from fakes import cifar_like, image_folder

M, S = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR_TF = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(M, S)])


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def test_cifar_runs_from_uint8_on_the_device_tier_with_the_planned_ops(tmp_path):
    ds = cifar_like(100, transform=CIFAR_TF)
    loader = accelerate(ds, batch_size=32, device="cpu", seed=3, cache=tmp_path, progress=False)
    plan = loader.plan
    assert plan.storage == "device" and plan.stored_dtype == "uint8" and plan.stored_shape == (100, 3, 32, 32)
    assert plan.cached == () and plan.ingest.startswith("arrays read of 100 samples")
    assert [b.split("(")[0] for b in plan.batched] == ["RandomCrop", "RandomHorizontalFlip", "Normalize"]
    assert plan.cache_path is not None  # cache=<root> persists
    assert "storage:  in memory (the CPU is the device)" in str(plan) and "batched:  RandomCrop" in str(plan)
    # Each image is torchvision's RandomCrop(32, padding=4) at some offset, flipped or not, then Normalize: found among
    # all 81 offsets x 2 flips computed with torchvision's own ops from the dataset's array.
    first = _batches(loader)
    order = epoch_order(3, 0, 100)
    assert torch.equal(torch.cat([y for _, y in first]), torch.tensor(ds.targets)[order])
    drawn = []
    for k, x in enumerate(torch.cat([x for x, _ in first])):
        padded = TF.pad(TF.to_tensor(ds.data[int(order[k])]), [4])
        crops = [TF.crop(padded, i, j, 32, 32) for i in range(9) for j in range(9)]
        candidates = torch.stack([TF.normalize(c, M, S) for c in crops + [TF.hflip(c) for c in crops]])
        hits = ((candidates - x).abs().amax(dim=(1, 2, 3)) < 1e-5).nonzero().flatten().tolist()
        assert len(hits) == 1, (k, hits)  # a wrong pad, crop, flip or Normalize matches none
        drawn.append(divmod(hits[0], 81))
    assert len({box for _, box in drawn}) > 30  # 100 draws of 81 offsets: about 58 distinct expected
    assert 30 < sum(flip for flip, _ in drawn) < 70  # Binomial(100, 0.5): 4 standard deviations either side
    order = epoch_order(3, 1, 100)  # the next pass serves epoch 1
    assert torch.equal(torch.cat([y for _, y in _batches(loader)]), torch.tensor(ds.targets)[order])
    assert ds.transform is CIFAR_TF


def test_a_budget_too_small_for_the_device_falls_back_to_a_memory_map_with_the_same_batches():
    ds = cifar_like(70, transform=CIFAR_TF)
    fast = accelerate(ds, batch_size=16, device="cpu", cache=False, progress=False)
    with pytest.warns(UserWarning, match="exceeds the device budget of 0.0 MiB"):
        mapped = accelerate(ds, batch_size=16, device="cpu", cache=False, memory_budget=0, progress=False)
    assert mapped.plan.storage == "mmap" and mapped.storage == "mmap"
    for (x, y), (mx, my) in zip(_batches(fast), _batches(mapped), strict=True):
        assert torch.equal(x, mx) and torch.equal(y, my)


def test_per_sample_datasets_are_cached_on_disk_and_hit_next_time(tmp_path):
    folder = image_folder(
        tmp_path / "data",
        [(40, 30), (30, 40), (36, 36), (50, 44)] * 3,
        transform=T.Compose([T.Resize(24), T.CenterCrop(20), T.RandomHorizontalFlip(), T.ToTensor()]),
    )
    first = accelerate(folder, batch_size=4, device="cpu", cache=tmp_path / "cache", num_workers=0, progress=False)
    assert first.plan.ingest.startswith("per-sample read of 12 samples") and "written to the cache" in first.plan.ingest
    assert first.plan.cached == (repr(T.Resize(24)), repr(T.CenterCrop(20)))
    second = accelerate(folder, batch_size=4, device="cpu", cache=tmp_path / "cache", num_workers=0, progress=False)
    assert second.plan.ingest.startswith("cache hit") and second.plan.cache_path == first.plan.cache_path
    for (x, y), (sx, sy) in zip(_batches(first), _batches(second), strict=True):
        assert torch.equal(x, sx) and torch.equal(y, sy)


def test_unsupported_random_ops_raise_unless_the_fallback_is_asked_for():
    ds = cifar_like(40, transform=T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()]))
    with pytest.raises(UnsupportedTransformError, match="fallback='prefetch'"):
        accelerate(ds, device="cpu", progress=False)
    with pytest.warns(UserWarning, match="falls back to per-sample DataLoader workers"):
        loader = accelerate(ds, batch_size=16, device="cpu", fallback="prefetch", num_workers=0, seed=2)
    assert isinstance(loader, FallbackLoader) and len(loader) == 3
    batches = _batches(loader)
    assert [tuple(x.shape) for x, _ in batches] == [(16, 3, 32, 32), (16, 3, 32, 32), (8, 3, 32, 32)]
    assert torch.equal(torch.cat([y for _, y in batches]), torch.tensor(ds.targets)[epoch_order(2, 0, 40)])
    assert "ElasticTransform" in str(loader.plan)


def test_a_container_the_batched_path_cannot_run_takes_the_fallback():
    ds = cifar_like(8, transform=T.Compose([T.RandomApply([T.RandomResizedCrop(24)], p=0.5), T.ToTensor()]))
    with pytest.warns(UserWarning, match="falls back"):
        loader = accelerate(ds, batch_size=4, device="cpu", fallback="prefetch", num_workers=0, progress=False)
    assert loader.plan.storage == "fallback"


def test_opaque_cached_ops_work_but_are_not_persisted(tmp_path):
    ds = cifar_like(10, transform=T.Compose([T.Lambda(lambda im: im.rotate(90)), T.ToTensor()]))
    with pytest.warns(UserWarning, match="cannot be fingerprinted"):
        loader = accelerate(
            ds, batch_size=5, device="cpu", cache_lambda=True, cache=tmp_path, num_workers=0, progress=False
        )
    assert loader.plan.cache_path is None and list(tmp_path.iterdir()) == []
    batches = _batches(loader)
    rotated = torch.stack([T.ToTensor()(Image.fromarray(a).rotate(90)) for a in ds.data])  # the Lambda ran
    order = epoch_order(0, 0, 10)
    assert torch.equal(torch.cat([x for x, _ in batches]), rotated[order])


def test_labels_outside_the_datasets_classes_are_reported():
    ds = cifar_like(20, transform=CIFAR_TF)
    ds.targets[7] = 10
    with pytest.raises(DataError, match=r"labels\[7\]=10 is out of range \[0, 10\)"):
        accelerate(ds, device="cpu", cache=False, progress=False)


_PEAK = textwrap.dedent("""
    import ctypes, gc, json, sys, warnings
    sys.path.insert(0, {tests!r})
    import torchvision.transforms as T
    import gpufeed as gf
    from fakes import cifar_like

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    ds = cifar_like(20_000, transform=T.Compose([T.RandomCrop(32, padding=4), T.ToTensor()]))  # HWC, contiguous
    gf.accelerate(cifar_like(8, transform=ds.transform), batch_size=4, device="cpu", cache=False)  # warm imports
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark (VmHWM) to the current resident size
    before = status("VmRSS")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = gf.accelerate(ds, batch_size=256, device="cpu", cache={cache}, progress=False)
    print(json.dumps([status("VmHWM") - before, ds.data.nbytes, loader.plan.ingest]))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
@pytest.mark.parametrize("cache", ["False", "{root!r}"], ids=["in memory", "written to a cache"])
def test_ingest_holds_at_most_one_copy_of_the_images_beyond_the_dataset(tmp_path, cache):
    script = _PEAK.format(tests=str(Path(__file__).parent), cache=cache.format(root=str(tmp_path)))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    extra, images, ingest = json.loads(run.stdout.strip().splitlines()[-1])
    assert ingest.startswith("arrays read of 20000 samples")
    assert extra <= 1.25 * images, f"peak {extra / images:.2f} x the images beyond the dataset"


@pytest.mark.parametrize(
    "cache, match",
    [("no", "reads as a flag"), ("", "reads as a flag"), ("False", "reads as a flag"), (3, "must be True, False")],
)
def test_a_cache_option_that_is_not_a_directory_is_an_error(cache, match):
    with pytest.raises(ConfigError, match=match):
        accelerate(cifar_like(8, transform=CIFAR_TF), batch_size=4, device="cpu", cache=cache)


def test_a_cache_root_with_a_tilde_is_under_home_and_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    ds = cifar_like(8, transform=T.Compose([T.Resize(16), T.ToTensor()]))
    loader = accelerate(ds, batch_size=4, device="cpu", cache="~/gfcache", progress=False)
    assert loader.plan.cache_path.startswith(str(tmp_path / "gfcache"))
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is a file; pass a directory"):
        accelerate(ds, batch_size=4, device="cpu", cache=tmp_path / "notes.txt")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "float32"}, "dtype='float32' must be a torch.dtype"),
        ({"memory_budget": "1GB"}, r"memory_budget \(bytes\)='1GB' must be an int"),
        ({"num_workers": "2"}, "num_workers='2' must be an int"),
    ],
)
def test_arguments_of_the_wrong_type_are_named(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        accelerate(cifar_like(8, transform=CIFAR_TF), batch_size=4, device="cpu", **kwargs)


def test_a_spill_left_by_a_killed_process_is_removed_by_the_next(tmp_path, monkeypatch):
    import tempfile

    from gpufeed.store.spill import remove_dead_spills, spill

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run(  # a process that spills, then is killed before it can clean up
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import os, tempfile, torch
            tempfile.tempdir = {str(tmp_path)!r}
            from gpufeed.store.spill import spill
            images, labels = spill(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4))
            os._exit(0)
        """),
        ],
        check=True,
    )
    assert dead.returncode == 0
    left = list(tmp_path.glob("gpufeed-mmap-*"))
    assert len(left) == 1 and (left[0] / "entry" / "images.bin").is_file()
    mine = tmp_path / "gpufeed-mmap-999999999-notours"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a spill")  # a name that matches, contents that do not
    images, _ = spill(torch.ones(2, 1, 4, 4, dtype=torch.uint8), torch.arange(2))
    assert not left[0].exists() and mine.exists()
    assert remove_dead_spills(tmp_path) == [] and int(images.sum()) == 32


def test_an_erase_value_per_channel_of_the_wrong_length_is_refused_from_the_pipeline_not_a_lucky_draw():
    # p=0.01: the dry run on three probed samples would almost never draw it; the plan knows the channel count.
    ds = cifar_like(8, transform=T.Compose([T.ToTensor(), T.RandomErasing(p=0.01, value=(0.1, 0.2))]))
    with pytest.raises(ConfigError, match=r"value=\(0.1, 0.2\).*either a single value or 3.*give one value or 3"):
        accelerate(ds, batch_size=4, device="cpu", cache=False, progress=False)
