"""A zoo of real pipelines: each accepted one matches torchvision per sample given the same parameters
(exactly, or within the stated bound); each refused one runs through the fallback unchanged."""

import random

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset, default_collate
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode
from torchvision.transforms._presets import ImageClassification

import gpufeed as gf
from gpufeed.pipeline.probe import probe_samples
from gpufeed.pipeline.translate import split_transform
from gpufeed.sampling import derive_seed, epoch_order
from pinned import run_both

from fakes import cifar_like, image_folder

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CIFAR = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


def reference_train(crop, use_v2=False, backend="pil", erase=0.0, hflip=0.5, policy=None):
    """torchvision's references/classification ClassificationPresetTrain (``policy``: its auto_augment_policy)."""
    M = v2 if use_v2 else T
    bilinear = InterpolationMode.BILINEAR
    ops = [M.PILToTensor()] if backend == "tensor" else []
    ops.append(M.RandomResizedCrop(crop, interpolation=bilinear, antialias=True))
    if hflip > 0:
        ops.append(M.RandomHorizontalFlip(hflip))
    if policy == "ra":
        ops.append(M.RandAugment(interpolation=bilinear, magnitude=9))
    elif policy == "ta_wide":
        ops.append(M.TrivialAugmentWide(interpolation=bilinear))
    elif policy == "augmix":
        ops.append(M.AugMix(interpolation=bilinear, severity=3))
    elif policy is not None:
        ops.append(M.AutoAugment(policy=M.AutoAugmentPolicy(policy), interpolation=bilinear))
    if backend == "pil":
        ops.append(M.PILToTensor())
    ops += [v2.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float), M.Normalize(*IMAGENET)]
    if erase > 0:
        ops.append(M.RandomErasing(p=erase))
    if use_v2:
        ops.append(v2.ToPureTensor())
    return M.Compose(ops)


def reference_eval(crop, resize, use_v2=False, backend="pil"):
    """torchvision's references/classification ClassificationPresetEval."""
    M = v2 if use_v2 else T
    ops = [M.PILToTensor()] if backend == "tensor" else []
    ops += [M.Resize(resize, interpolation=InterpolationMode.BILINEAR, antialias=True), M.CenterCrop(crop)]
    if backend == "pil":
        ops.append(M.PILToTensor())
    ops += [v2.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float), M.Normalize(*IMAGENET)]
    if use_v2:
        ops.append(v2.ToPureTensor())
    return M.Compose(ops)


# uint8 levels of difference allowed before conversion. RandomResizedCrop on uint8 computes Pillow's integers on PIL
# images and v2's on uint8 tensors (exact); v1's float kernel is rounded where gpufeed's float sums may land on the
# other side of .5 (one level), and so is v2's bilinear on CPUs without AVX2 (where v2 takes the float kernel too).
EXACT, ONE_LEVEL = 0, 1
ACCEPTED = {
    "cifar v1": (
        T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*CIFAR)]),
        EXACT,
    ),
    "cifar v2, ToPureTensor": (
        v2.Compose(
            [
                v2.ToImage(),
                v2.RandomCrop(32, padding=[4]),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(*CIFAR),
                v2.ToPureTensor(),
            ]
        ),
        EXACT,
    ),
    "cifar v1, padding=[4]": (T.Compose([T.RandomCrop(32, padding=[4]), T.ToTensor()]), EXACT),
    "reference train v1 pil": (reference_train(24), EXACT),
    "reference train v1 pil, erasing": (reference_train(40, erase=1.0), EXACT),
    "reference train v2 pil": (reference_train(24, use_v2=True), EXACT),
    "reference train v2 tensor, erasing": (reference_train(20, use_v2=True, backend="tensor", erase=0.5), ONE_LEVEL),
    "reference train v1 tensor": (reference_train(48, backend="tensor"), ONE_LEVEL),
    "reference eval v1 pil": (reference_eval(28, 36), EXACT),
    "reference eval v2 tensor": (reference_eval(24, 30, use_v2=True, backend="tensor"), EXACT),
    "weights preset (ImageClassification)": (ImageClassification(crop_size=28, resize_size=36), EXACT),
    "RandomResizedCrop up, then flip, crop, erase": (
        T.Compose(
            [
                T.RandomResizedCrop(64),
                T.RandomHorizontalFlip(),
                T.RandomCrop(56, padding=2),
                T.ToTensor(),
                T.RandomErasing(p=1.0),
            ]
        ),
        EXACT,
    ),
    "RandomResizedCrop down, then flip, crop, erase": (
        T.Compose(
            [
                T.PILToTensor(),
                T.RandomResizedCrop(20, antialias=False),
                T.RandomVerticalFlip(),
                T.RandomCrop(16),
                T.RandomErasing(p=1.0, value=9),
            ]
        ),
        ONE_LEVEL,
    ),
    "RandomResizedCrop antialias=False on PIL (PIL always antialiases)": (
        T.Compose([T.RandomResizedCrop(12, scale=(0.5, 1.0), antialias=False), T.PILToTensor()]),
        EXACT,
    ),
    "bicubic RandomResizedCrop on PIL (Pillow's integers)": (
        T.Compose([T.RandomResizedCrop(20, interpolation=InterpolationMode.BICUBIC), T.PILToTensor()]),
        EXACT,
    ),
    "v2 bicubic RandomResizedCrop on uint8 tensors (v2's uint8 kernel)": (
        v2.Compose(
            [v2.PILToTensor(), v2.RandomResizedCrop(20, interpolation=InterpolationMode.BICUBIC, antialias=False)]
        ),
        EXACT,
    ),
    "RandomCrop fill 300 on PIL (Pillow clips it to 255)": (
        T.Compose([T.RandomCrop(36, padding=2, fill=300), T.PILToTensor()]),
        EXACT,
    ),
    "tensors made in the cached part, then RandomResizedCrop antialias=False (the tensor kernel)": (
        T.Compose([T.PILToTensor(), T.CenterCrop(30), T.RandomResizedCrop(12, antialias=False)]),
        ONE_LEVEL,
    ),
    "v2 float16, Normalize in half precision": (
        v2.Compose(
            [v2.ToImage(), v2.RandomCrop(32, padding=2), v2.ToDtype(torch.float16, scale=True), v2.Normalize(*CIFAR)]
        ),
        EXACT,
    ),
    "v2 fill dict (PIL images use 'others')": (
        v2.Compose([v2.RandomCrop(36, padding=4, fill={tv_tensors.Image: 9, "others": 41}), v2.PILToTensor()]),
        EXACT,
    ),
    "v2 fill dict after ToImage (tv_tensors.Image)": (
        v2.Compose([v2.ToImage(), v2.RandomCrop(36, padding=4, fill={tv_tensors.Image: 9, "others": 41})]),
        EXACT,
    ),
    "v2 ends in uint8": (v2.Compose([v2.ToImage(), v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]), EXACT),
    "bicubic RandomResizedCrop on tensors (timm's and the references' bicubic option)": (
        T.Compose(
            [
                T.PILToTensor(),
                T.RandomResizedCrop(20, interpolation=InterpolationMode.BICUBIC),
                T.RandomHorizontalFlip(),
            ]
        ),
        ONE_LEVEL,
    ),
}


def _images(n=6, h=32, w=40, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(a) for a in rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)]


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_an_accepted_recipe_matches_torchvision_per_sample(name):
    transform, levels = ACCEPTED[name]
    batched, reference, composed = run_both(transform, _images(), pil=True)
    assert batched.dtype == reference.dtype and batched.shape == reference.shape, name
    assert torch.equal(composed, batched)  # the fused Compose draws and computes what op-by-op does
    if levels == EXACT:
        assert torch.equal(batched, reference), name
    else:  # one uint8 level, carried through ConvertImageDtype and Normalize
        scale = 1.0 if batched.dtype == torch.uint8 else 1 / 255 / min(IMAGENET[1] + CIFAR[1])
        assert (batched.double() - reference.double()).abs().max() <= levels * scale + 1e-5, name


def test_random_resized_crop_then_geometric_ops_keep_the_output_size():
    # 32x32 up to 64 and 72x96 down to 64, each followed by a flip and erasing (the ImageNet recipe).
    for h, w in ((32, 32), (72, 96)):
        ds = TensorDataset(torch.randint(0, 256, (8, 3, h, w), dtype=torch.uint8), torch.arange(8))
        tf = v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.RandomErasing(p=1.0)])
        loader = gf.accelerate(ds, batch_size=4, device="cpu", transform=tf, progress=False)
        assert [tuple(x.shape) for x, _ in loader] == [(4, 3, 64, 64)] * 2


def test_the_default_output_is_what_the_pipeline_returns():
    ds = TensorDataset(torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8), torch.arange(8))
    uint8 = v2.Compose([v2.ToImage(), v2.RandomCrop(16, padding=2), v2.RandomHorizontalFlip()])
    x, _ = next(iter(gf.accelerate(ds, batch_size=4, device="cpu", transform=uint8, progress=False)))
    ref, _ = next(iter(DataLoader(TensorDataset(*ds.tensors), batch_size=4)))
    assert x.dtype == torch.uint8 == ref.dtype and int(x.max()) > 1
    asked = gf.accelerate(ds, batch_size=4, device="cpu", transform=uint8, dtype=torch.float32, progress=False)
    assert next(iter(asked))[0].dtype == torch.float32  # converted only when asked
    floats = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float16, scale=True)])
    assert next(iter(gf.accelerate(ds, batch_size=4, device="cpu", transform=floats)))[0].dtype == torch.float16


def test_look_alike_classes_are_not_converted_by_name():
    class ToTensor:  # what timm's ToTensor does: to a tensor, without the division by 255
        def __call__(self, pil):
            return torch.from_numpy(np.array(pil)).permute(2, 0, 1).float()

    class Normalize(T.Normalize):  # a subclass may change the computation too
        def forward(self, x):
            return super().forward(x) * 2

    for op in (ToTensor(), Normalize(*CIFAR)):
        with pytest.raises(gf.UnsupportedTransformError, match="gpufeed converts torchvision's own"):
            split_transform(T.Compose([T.RandomHorizontalFlip(), op]))
    ds = cifar_like(8, transform=T.Compose([T.RandomHorizontalFlip(), ToTensor(), T.Normalize(*CIFAR)]))
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(ds, batch_size=4, device="cpu", fallback="prefetch", num_workers=0)
    x, _ = next(iter(loader))
    assert float(x.max()) > 100  # timm's range, not ToTensor's [0, 1]


# -- refused pipelines run unchanged through the fallback -----------------------------------------------------------


def _expected(dataset, loader_seed, epoch, batch_size, n):
    """What the fallback must yield: the dataset's own pipeline per sample, seeded from (seed, epoch, index)."""
    order = epoch_order(loader_seed, epoch, n, True).tolist()
    batches = []
    for b in range(0, n, batch_size):
        items = []
        for i in order[b : b + batch_size]:
            s = derive_seed(loader_seed, epoch, i)
            with torch.random.fork_rng():
                torch.manual_seed(s)
                random.seed(s)
                np.random.seed(s % 2**32)
                items.append(dataset[i])
        batches.append(default_collate(items))
    return batches


REFUSED = {
    "lanczos RandomResizedCrop (PIL only)": T.Compose(
        [T.RandomResizedCrop(24, interpolation=InterpolationMode.LANCZOS), T.ToTensor()]
    ),
    "ToDtype(scale=False)": v2.Compose(
        [v2.ToImage(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=False)]
    ),
    "RandomRotation, bicubic": T.Compose([T.RandomRotation(15, InterpolationMode.BICUBIC), T.ToTensor()]),
    "ElasticTransform": T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()]),
    "ToDtype(uint8, scale=False)": v2.Compose(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.RandomHorizontalFlip(), v2.ToDtype(torch.uint8)]
    ),
    "RandomErasing of a value a uint8 image cannot hold": v2.Compose(
        [v2.PILToTensor(), v2.RandomErasing(1.0, value=0.5)]
    ),
    "RandomErasing with value='random' on uint8 (torchvision truncates the draws)": v2.Compose(
        [v2.PILToTensor(), v2.RandomErasing(1.0, value="random")]
    ),
    "v2 TrivialAugmentWide on float images": v2.Compose(
        [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.TrivialAugmentWide()]
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_refused_recipe_runs_unchanged_through_the_fallback(name):
    ds = cifar_like(10, transform=REFUSED[name])
    with pytest.raises(gf.UnsupportedTransformError):
        gf.accelerate(ds, batch_size=4, device="cpu")
    with pytest.warns(UserWarning, match="falls back to per-sample"):
        loader = gf.accelerate(ds, batch_size=4, device="cpu", seed=5, fallback="prefetch", num_workers=0)
    got = list(loader)
    for (x, y), (ex, ey) in zip(got, _expected(ds, 5, 0, 4, 10), strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_variable_size_images_take_the_fallback_without_an_ingest_when_no_op_takes_them(tmp_path):
    # RandomCrop cannot take images of different sizes in one batch (RandomResizedCrop can: test_image_folders)
    sizes = [(40, 30), (33, 50), (64, 48), (30, 30), (50, 41), (45, 45)]
    tf = T.Compose([T.RandomCrop(24), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(*IMAGENET)])
    ds = image_folder(tmp_path, sizes, transform=tf)
    with pytest.raises(gf.DataError, match=r"ImageFolder\[\d\] has shape .*fallback='prefetch'"):
        gf.accelerate(ds, batch_size=3, device="cpu")
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(ds, batch_size=3, device="cpu", seed=1, fallback="prefetch", num_workers=2)
    assert loader.plan.ingest == "none"
    for (x, y), (ex, ey) in zip(loader, _expected(ds, 1, 0, 3, 6), strict=True):
        assert x.shape == (3, 3, 24, 24) and torch.equal(x, ex) and torch.equal(y, ey)


def test_a_deterministic_refused_pipeline_equals_the_dataloader():
    ds = cifar_like(12, transform=v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=False)]))
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(ds, batch_size=5, shuffle=False, device="cpu", fallback="prefetch", num_workers=2)
    for (x, y), (ex, ey) in zip(loader, DataLoader(ds, batch_size=5), strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_dataloader_workers_follow_one_rule_everywhere(monkeypatch):
    from gpufeed.train.loaders import make_train_loader
    from gpufeed.workers import default_workers

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a process that holds CUDA state
    ds = cifar_like(8, transform=T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()]))
    with pytest.warns(UserWarning, match="falls back"):
        fallback = gf.accelerate(ds, batch_size=4, device="cpu", fallback="prefetch", num_workers=2)
    baseline = make_train_loader("torch", ds, 4, torch.device("cpu"), 0, num_workers=2)
    for dl in (fallback.loader, baseline.loader):
        assert dl.num_workers == 2 and dl.multiprocessing_context.get_start_method() == "forkserver"
        assert dl.persistent_workers
    for cores, expected in ((1, 0), (4, 4), (64, 16)):
        monkeypatch.setattr("gpufeed.workers.usable_cores", lambda cores=cores: cores)
        assert default_workers() == expected and default_workers(samples=100) == 0


def test_samples_a_dataloader_collates_but_gpufeed_cannot_store_take_the_fallback():
    class Named(torch.utils.data.Dataset):  # string labels; and a variant returning dicts
        def __init__(self, as_dict):
            self.as_dict, self.transform = as_dict, T.Compose([T.RandomHorizontalFlip(), T.ToTensor()])

        def __len__(self):
            return 6

        def __getitem__(self, i):
            image = self.transform(Image.fromarray(np.full((4, 4, 3), i, dtype=np.uint8)))
            return {"image": image, "name": f"img{i}"} if self.as_dict else (image, f"img{i}")

    for as_dict in (False, True):
        with pytest.raises(gf.DataError, match="returned a dict" if as_dict else "has label 'img0'"):
            gf.accelerate(Named(as_dict), batch_size=3, device="cpu", shuffle=False, cache=False)
        with pytest.warns(UserWarning, match="falls back"):
            loader = gf.accelerate(Named(as_dict), batch_size=3, shuffle=False, device="cpu", fallback="prefetch")
        got, expected = list(loader), list(DataLoader(Named(as_dict), batch_size=3))  # flips of flat images
        assert len(got) == len(expected) == 2
        for a, b in zip(got, expected, strict=True):
            a, b = (a, b) if as_dict else ({"image": a[0], "name": a[1]}, {"image": b[0], "name": b[1]})
            assert a["name"] == b["name"] and torch.equal(a["image"], b["image"])


def test_the_fill_dicts_image_type_and_the_pil_state_follow_the_pipeline():
    from gpufeed.pipeline.translate import build_batched, split_transform

    crop_after_tensor = T.Compose([T.PILToTensor(), T.CenterCrop(30), T.RandomResizedCrop(12, antialias=False)])
    probed = probe_samples(
        cifar_like(4, transform=crop_after_tensor), split_transform(crop_after_tensor).cached_transform()
    )
    assert probed.pil is False  # the cached part made tensors: the tensor kernel runs, without antialiasing
    (rrc,) = build_batched(split_transform(crop_after_tensor).device, torch.uint8, (30, 30), probed.pil).transforms
    assert rrc.antialias is False


def test_a_dataset_that_draws_random_numbers_in_getitem_is_not_frozen():
    class Jittered(torch.utils.data.Dataset):  # augments in __getitem__ through its own attribute
        def __init__(self):
            self.aug, self.transform = T.RandomHorizontalFlip(), None

        def __len__(self):
            return 8

        def __getitem__(self, i):
            image = torch.arange(3 * 4 * 4, dtype=torch.uint8).view(3, 4, 4) + i
            return self.aug(image), i

    with pytest.raises(gf.DataError, match=r"Jittered\[0\] differs between two reads: its __getitem__ draws random"):
        gf.accelerate(Jittered(), batch_size=4, device="cpu", cache=False)
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(Jittered(), batch_size=8, device="cpu", fallback="prefetch", num_workers=0)
    first, second = next(iter(loader))[0], next(iter(loader))[0]
    assert not torch.equal(first, second)  # each epoch draws again, as the DataLoader's would


def test_images_gpufeed_cannot_store_take_the_fallback(tmp_path):
    for i in range(4):
        Image.fromarray(np.full((6, 6), 255 * (i % 2), dtype=np.uint8)).convert("1").save(tmp_path / f"{i}.png")

    class Bits(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.from_numpy(np.array(Image.open(tmp_path / f"{i}.png"))).unsqueeze(0), i  # bool pixels

    with pytest.raises(gf.DataError, match=r"Bits\[0\] gives images of dtype torch.bool"):
        gf.accelerate(Bits(), batch_size=2, device="cpu", cache=False)
    with pytest.warns(UserWarning, match="falls back"):
        loader = gf.accelerate(Bits(), batch_size=2, shuffle=False, device="cpu", fallback="prefetch", num_workers=0)
    assert [x.dtype for x, _ in loader] == [torch.bool, torch.bool]


def test_float64_arrays_through_to_tensor_stay_float64_as_torchvision_leaves_them():
    ds = TensorDataset(torch.rand(6, 5, 5, 3, dtype=torch.float64), torch.arange(6))

    class Arrays(torch.utils.data.Dataset):
        transform = T.ToTensor()

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return self.transform(ds.tensors[0][i].numpy()), i

    x, _ = next(iter(gf.accelerate(Arrays(), batch_size=6, shuffle=False, device="cpu", cache=False)))
    ref, _ = next(iter(DataLoader(Arrays(), batch_size=6)))
    assert x.dtype == ref.dtype == torch.float64 and torch.equal(x, ref)


@pytest.mark.parametrize(
    "make", [lambda p: v2.RandomEqualize(p=p), lambda p: v2.RandomPosterize(3, p=p)], ids=["equalize", "posterize"]
)
def test_v2_equalize_and_posterize_on_float_images_run_batched_as_v2_runs_them(make):
    # The issue: planned as batched, then ConfigError mid-epoch once the op was drawn (fallback='prefetch' too).
    images = torch.randint(0, 256, (10, 3, 9, 11), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ds = TensorDataset(images, torch.arange(10))
    always = v2.Compose([v2.ToDtype(torch.float32, scale=True), make(1.0)])
    loader = gf.accelerate(ds, batch_size=4, shuffle=False, device="cpu", transform=always, cache=False)
    assert any(type(make(1.0)).__name__ in step for step in loader.plan.batched)
    got = torch.cat([x for x, _ in loader])
    assert torch.equal(got, torch.stack([always(im) for im in images]))  # p=1: every sample, exactly
    rare = v2.Compose([v2.ToDtype(torch.float32, scale=True), make(0.05)])
    epoch = gf.accelerate(ds, batch_size=4, device="cpu", transform=rare, cache=False)
    assert sum(len(x) for x, _ in epoch) == 10  # the whole epoch, whatever is drawn


def test_a_pipeline_torchvision_refuses_is_refused_before_reading_with_its_reason_fallback_or_not():
    # T.ToTensor() then RandomSolarize(128): torchvision raises on every sample; gpufeed used to never solarize.
    ds = cifar_like(6, transform=T.Compose([T.ToTensor(), T.RandomSolarize(128, p=1.0)]))
    for fallback in ("error", "prefetch"):
        with pytest.raises(gf.ConfigError, match="Threshold should be less than bound of img") as refused:
            gf.accelerate(ds, batch_size=3, device="cpu", fallback=fallback, cache=False)
        assert not isinstance(refused.value, gf.UnsupportedTransformError)  # the fallback would raise the same
        assert "give a threshold <= 1.0 (0.502 is 128 in pixel values)" in str(refused.value)


@pytest.mark.parametrize("v2_ops", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize(
    "mode, padding, refused",
    [("reflect", 5, False), ("reflect", 6, True), ("symmetric", 6, False), ("symmetric", 7, True)],
)
def test_mirror_padding_torch_cannot_do_on_tensors_is_refused_as_torchvision_refuses_it(v2_ops, mode, padding, refused):
    import torchvision.transforms.v2 as v2

    from gpufeed import ConfigError, accelerate

    ops = v2 if v2_ops else T
    tf = ops.Compose([ops.RandomCrop(6, padding=padding, padding_mode=mode), ops.ConvertImageDtype(torch.float32)])
    ds = torch.utils.data.TensorDataset(torch.randint(0, 256, (4, 3, 6, 8), dtype=torch.uint8), torch.arange(4))
    torchvision_refuses = False
    try:
        tf(ds[0][0])
    except (RuntimeError, IndexError):
        torchvision_refuses = True
    assert torchvision_refuses == refused
    if refused:
        with pytest.raises(ConfigError, match=rf"padding {padding} with padding_mode='{mode}' along the height of 6"):
            accelerate(ds, transform=tf, batch_size=2, device="cpu", progress=False, fallback="prefetch")
    else:
        assert accelerate(ds, transform=tf, batch_size=2, device="cpu", progress=False).plan.storage == "device"
