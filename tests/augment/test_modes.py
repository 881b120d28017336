"""PIL images of every mode a loader may hand over unconverted (``Image.open(f)`` without ``.convert("RGB")``): each
op either gives torchvision's pixels batched, or is refused up front with torchvision's reason where torchvision
raises, or (where torchvision computes what gpufeed does not batch on that mode) is left to the fallback, which then
gives torchvision's pixels. Never a wrong pixel, never a silent conversion; each refusal names the sample, the mode
and the fix."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image
from torch.utils.data import Dataset

import gpufeed as gf
from gpufeed.errors import ConfigError, UnsupportedTransformError
from gpufeed.loading.fallback import FallbackLoader
from gpufeed.pipeline.translate import PIL_BOUNDS
from gpufeed.pipeline.translate.modes import verdict

pytestmark = pytest.mark.usefixtures("one_thread")  # torchvision's per-sample reference as make test runs it

N = 4
MODES = ["P", "PA", "L", "LA", "RGB", "RGBA", "CMYK", "YCbCr", "HSV", "LAB", "F", "I", "I;16", "1"]


@functools.cache
def make_image(mode: str, i: int, size=(12, 10)) -> Image.Image:
    """Image ``i`` of ``mode``, from random RGB(A) pixels (with a varied alpha where the mode has one)."""
    rng = np.random.default_rng(100 + i)
    h, w = size
    rgba = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    image = Image.fromarray(rgba, "RGBA")
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16))
    if mode in ("P", "PA"):
        palette = image.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=48)
        return palette if mode == "P" else palette.convert("PA")
    return image if mode == "RGBA" else image.convert("RGB").convert(mode) if mode != "LA" else image.convert("LA")


class Images(Dataset):
    """``(image, i)``: the images of the given modes (one each, or one mode for all), through ``transform``."""

    def __init__(self, modes, transform=None):
        self.modes = [modes] * N if isinstance(modes, str) else list(modes)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.modes)

    def raw(self, i: int) -> Image.Image:
        return make_image(self.modes[i], i).copy()  # made once (a conversion to LAB is slow), handed out fresh

    def __getitem__(self, i: int):
        image = self.raw(i)
        return (self.transform(image) if self.transform is not None else image), i


class Arrays(Images):
    """The same images as numpy arrays (HWC, or HW for L) or as CHW uint8 tensors (``form="tensor"``), as a
    ``__getitem__`` that does not make PIL images hands them over."""

    def __init__(self, modes, transform=None, form="ndarray"):
        super().__init__(modes, transform)
        self.form = form

    def raw(self, i: int):
        array = np.array(make_image(self.modes[i], i))
        if self.form == "ndarray":
            return array
        return (
            torch.from_numpy(array).permute(2, 0, 1).contiguous() if array.ndim == 3 else torch.from_numpy(array)[None]
        )


def ops(m):
    """Each op where torchvision's parameters are fixed (p=1, one-value ranges, a crop that can only be the padded
    image), so that its output is one image to compare with."""
    bilinear, nearest = T.InterpolationMode.BILINEAR, T.InterpolationMode.NEAREST
    return {
        "hflip": m.RandomHorizontalFlip(1.0),
        "vflip": m.RandomVerticalFlip(1.0),
        "crop, fill": m.RandomCrop((16, 14), padding=2, fill=9),
        "crop, reflect": m.RandomCrop((16, 14), padding=2, padding_mode="reflect"),
        "resized crop": m.RandomResizedCrop((7, 6), scale=(1.0, 1.0), ratio=(10 / 12, 10 / 12)),
        "rotate bilinear": m.RandomRotation((30, 30), interpolation=bilinear, fill=5),
        "rotate nearest": m.RandomRotation((30, 30), interpolation=nearest),
        "affine bilinear": m.RandomAffine((10, 10), scale=(0.8, 0.8), shear=(5, 5), interpolation=bilinear),
        "brightness": m.ColorJitter(brightness=(1.3, 1.3)),
        "contrast": m.ColorJitter(contrast=(0.6, 0.6)),
        "saturation": m.ColorJitter(saturation=(0.4, 0.4)),
        "hue": m.ColorJitter(hue=(0.2, 0.2)),
        "RandomGrayscale": m.RandomGrayscale(p=1.0),
        "Grayscale": m.Compose([m.RandomHorizontalFlip(1.0), m.Grayscale()]),  # batched: after a random op
        "sharpness": m.RandomAdjustSharpness(2.0, p=1.0),
        "solarize": m.RandomSolarize(128, p=1.0),
        "posterize": m.RandomPosterize(3, p=1.0),
        "autocontrast": m.RandomAutocontrast(p=1.0),
        "equalize": m.RandomEqualize(p=1.0),
        "invert": m.RandomInvert(p=1.0),
        "blur": m.GaussianBlur(3, sigma=(1.0, 1.0)),
        "TrivialAugmentWide": m.TrivialAugmentWide(),
        "RandAugment": m.RandAugment(),
        "AutoAugment": m.AutoAugment(),
        "AugMix": m.AugMix(),
    }


_RANDOM = ("TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix")  # torchvision's draws decide what runs
# PIL's kernels against the tensor kernels gpufeed batches on L and RGB (and LA/RGBA's colour): within these levels
_BOUND = {"contrast": PIL_BOUNDS["contrast"], "saturation": PIL_BOUNDS["saturation"], "hue": PIL_BOUNDS["hue"]}
_BOUND |= {"RandomGrayscale": 1, "Grayscale": 1, "autocontrast": 1}


def _torchvision(transform, ds: Images, draws: int):
    """torchvision's batch (per sample, stacked), or the exception it raises (the random ones: on any of ``draws``
    draws on the first image, each drawing its ops anew)."""
    try:
        with torch.random.fork_rng():
            for seed in range(1, draws):
                torch.manual_seed(seed)
                transform(ds.raw(0))
            torch.manual_seed(0)
            out = [transform(ds.raw(i)) for i in range(N)]
        return torch.stack(out)
    except Exception as e:  # noqa: BLE001  what torchvision refuses, whatever it raises
        return e


def _loader(ds, **kw):
    return gf.accelerate(ds, batch_size=N, shuffle=False, device="cpu", progress=False, **{"cache": False, **kw})


def _check(mode: str, name: str, op, m, seen: set[str] | None = None) -> str:
    """One case: what gpufeed did ("batched", "refused", "fallback"), asserting it is what torchvision allows. The
    fallback's own run is checked for the first case of each outcome in ``seen`` (all of them when None)."""
    seen = set() if seen is None else seen
    transform = m.Compose([op, m.PILToTensor()])
    ds = Images(mode, transform)
    want = _torchvision(transform, ds, {"AugMix": 6}.get(name, 30 if name in _RANDOM else 1))
    try:
        got, labels = next(iter(_loader(ds)))
    except (ConfigError, gf.DataError) as e:
        message = str(e)
        if isinstance(e, (UnsupportedTransformError, gf.DataError)):  # the fallback's cases
            assert f"{mode}" in message and "convert(" in message and "fallback='prefetch'" in message, message
            assert isinstance(want, torch.Tensor), f"{mode} {name}: torchvision raises {want!r}: refuse it, no fallback"
            if isinstance(want, torch.Tensor) and name not in _RANDOM and "fallback" not in seen:
                seen.add("fallback")  # the fallback runs torchvision itself
                with pytest.warns(UserWarning, match="falls back"):
                    fallback = _loader(ds, fallback="prefetch", num_workers=0)
                assert isinstance(fallback, FallbackLoader)
                assert torch.equal(next(iter(fallback))[0], want)
            return "fallback"
        assert isinstance(want, Exception), f"{mode} {name}: torchvision runs it, gpufeed refused: {message}"
        assert "torchvision refuses it" in message and "DS[" not in message, message
        assert "convert(" in message or "image[:" in message, message
        if "refused" not in seen:
            seen.add("refused")
            with pytest.raises(ConfigError, match="torchvision refuses it"):  # no fallback runs it either
                _loader(ds, fallback="prefetch", num_workers=0)
        return "refused"
    assert isinstance(want, torch.Tensor), f"{mode} {name}: torchvision raises {want!r}, gpufeed served a batch"
    if name in _RANDOM:
        assert got.shape == want.shape and got.dtype == want.dtype
        return "batched"
    assert got.shape == want.shape and got.dtype == want.dtype, (mode, name, got.shape, want.shape)
    bound = _BOUND.get(name, 0) if mode in ("L", "RGB", "LA", "RGBA") else 0
    colour = got.shape[1] - (1 if got.shape[1] in (2, 4) and mode in ("LA", "RGBA") and name != "hue" else 0)
    diff = (got[:, :colour].double() - want[:, :colour].double()).abs().max().item()
    assert diff <= bound, f"{mode} {name}: {diff} levels from torchvision's"
    assert torch.equal(got[:, colour:], want[:, colour:])  # alpha exactly
    return "batched"


@pytest.mark.parametrize("mode", MODES)
def test_each_op_on_each_mode_gives_torchvisions_pixels_or_is_refused_as_torchvision_refuses(mode):
    seen: set[str] = set()
    every = ops(T).items()  # on L and RGB the policies are tests/augment/test_auto.py's
    outcome = {
        name: _check(mode, name, op, T, seen) for name, op in every if mode not in ("L", "RGB") or name not in _RANDOM
    }
    moves = ("hflip", "vflip", "crop, reflect") + (("crop, fill",) if mode != "LAB" else ())  # LAB's fill: signed
    if mode not in ("I", "I;16", "1"):  # uint8 or float32 stores: what only moves pixels is batched on every mode
        assert all(outcome[name] == "batched" for name in moves), outcome
    if mode in ("L", "RGB"):
        assert set(outcome.values()) == {"batched"}, outcome
    if mode == "P":  # the cases: ColorJitter refused, RandomGrayscale not served as indices
        assert outcome["brightness"] == "refused" and outcome["RandomGrayscale"] == "fallback"
        assert outcome["rotate bilinear"] == outcome["affine bilinear"] == "batched"  # as nearest, as Pillow does


@pytest.mark.parametrize("mode", ["P", "RGBA", "CMYK", "F"])
@pytest.mark.parametrize("name", ["hflip", "resized crop", "rotate bilinear", "brightness", "RandomGrayscale"])
def test_v2_on_pil_images_follows_the_same_rules(mode, name):
    _check(mode, name, ops(v2)[name], v2)


def test_the_verdicts_agree_with_torchvision_on_a_drawn_pipeline():
    # a rotation with a random angle on palette images: Pillow's nearest, batched, equal to torchvision given the angles
    import copy

    from gpufeed.pipeline.translate import build_batched, split_transform
    from gpufeed.read.samples import to_chw

    op = T.RandomRotation(40, interpolation=T.InterpolationMode.BICUBIC, fill=3)
    assert verdict("RandomRotation", op, "P") is None
    images = [make_image("P", i) for i in range(6)]
    stored = torch.stack([to_chw(im) for im in images])
    ops_ = build_batched(split_transform(T.Compose([op, T.PILToTensor()])).device, torch.uint8, (12, 10), True,
                         mode="P")  # fmt: skip
    rotate = ops_.transforms[0]
    params = rotate.sample(stored, torch.Generator().manual_seed(1))
    got = rotate.apply(stored, params)
    for i, image in enumerate(images):
        pinned = copy.deepcopy(op)
        pinned.get_params = lambda degrees, a=float(params["angle"][i]): a
        assert torch.equal(got[i], to_chw(pinned(image)))


def test_a_mixed_dataset_is_served_where_torchvision_moves_every_mode_alike():
    modes = ["L", "P", "L", "P"]  # one channel each: L levels and palette indices, stacked as DataLoader stacks them
    transform = T.Compose([T.RandomHorizontalFlip(1.0), T.RandomCrop((16, 14), padding=2), T.PILToTensor()])
    ds = Images(modes, transform)
    loader = _loader(ds)
    x, _ = next(iter(loader))
    flip = T.Compose([T.RandomHorizontalFlip(1.0), T.Pad(2), T.PILToTensor()])
    assert torch.equal(x, torch.stack([flip(ds.raw(i)) for i in range(N)]))


@pytest.mark.parametrize("at", [1, 2])  # 1: found by the read; 2 (n/2): by the probe
def test_a_mixed_dataset_is_refused_naming_the_sample_where_its_mode_changes_what_is_computed(at):
    modes = ["L"] * N
    modes[at] = "P"
    jitter = Images(modes, T.Compose([T.ColorJitter(brightness=0.4), T.PILToTensor()]))
    with pytest.raises(
        ConfigError, match=rf"on P \(palette\) PIL images \(Images\[{at}\] is one\): torchvision refuses"
    ):
        _loader(jitter)
    with pytest.raises(ConfigError, match="torchvision refuses it"):
        _loader(jitter, fallback="prefetch", num_workers=0)
    rotate = Images(modes, T.Compose([T.RandomRotation(20, interpolation=T.InterpolationMode.BILINEAR), T.ToTensor()]))
    with pytest.raises(gf.DataError, match=rf"Images\[{at}\] is a P image but Images\[0\] a L one.*convert\('RGB'\)"):
        _loader(rotate)
    with pytest.warns(UserWarning, match="falls back"):
        assert isinstance(_loader(rotate, fallback="prefetch", num_workers=0), FallbackLoader)


def test_rgb_and_palette_images_together_are_refused_naming_the_sample_and_the_fix():
    ds = Images(["RGB", "RGB", "P", "RGB"], T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    with pytest.raises(gf.DataError, match=r"Images\[2\] has shape \(1, 12, 10\).*image.convert\('RGB'\)"):
        _loader(ds)


def _mixed_folder(tmp_path, monkeypatch, modes=("L", "P", "L", "L")):
    """An ImageFolder of PNGs saved in ``modes``, read without conversion, that gpufeed fingerprints (none of
    torchvision's own sources yields mixed modes today; the entry must not depend on that staying so)."""
    import gpufeed.read.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "standard_loader", lambda dataset: True)
    (tmp_path / "data" / "a").mkdir(parents=True)
    for i, mode in enumerate(modes):
        make_image(mode, i).save(tmp_path / "data" / "a" / f"{i}.png")
    from torchvision.datasets import ImageFolder

    return lambda transform: ImageFolder(str(tmp_path / "data"), transform=transform, loader=Image.open)


_FLIP = T.Compose([T.RandomHorizontalFlip(), T.PILToTensor()])  # moves pixels: any mode, so no mode is checked
_ROTATE = T.Compose([T.RandomRotation(20, interpolation=T.InterpolationMode.BILINEAR), T.PILToTensor()])
_JITTER = T.Compose([T.ColorJitter(brightness=0.4), T.PILToTensor()])


@pytest.mark.parametrize("built_by", ["accelerate", "build_cache"])
def test_a_cache_entry_records_the_modes_it_read_and_a_hit_refuses_a_mixed_dataset_as_a_fresh_read_does(
    tmp_path, monkeypatch, built_by
):
    folder = _mixed_folder(tmp_path, monkeypatch)  # sample 1 is P: no probe reads it (0, n/2 and n-1)
    root = tmp_path / "cache"
    if built_by == "accelerate":
        _loader(folder(_FLIP), cache=root)
    else:
        gf.build_cache(folder(_FLIP), root=root, progress=False)
    (entry,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert gf.open_cache(entry).manifest.meta["modes"] == [[0, "L"], [1, "P"]]  # each mode's first sample
    with pytest.raises(gf.DataError, match=r"ImageFolder\[1\] is a P image but ImageFolder\[0\] a L one"):
        _loader(folder(_ROTATE), cache=root)
    with pytest.raises(ConfigError, match=r"on P \(palette\) PIL images \(ImageFolder\[1\] is one\): torchvision"):
        _loader(folder(_JITTER), cache=root)
    with pytest.warns(UserWarning, match="falls back"):
        assert isinstance(_loader(folder(_ROTATE), cache=root, fallback="prefetch", num_workers=0), FallbackLoader)


def _entry_without_modes(monkeypatch, folder, root) -> None:
    """An entry written as gpufeed wrote them before it recorded the modes its read met."""
    import dataclasses

    from gpufeed.pipeline import entries

    store = entries.store
    with monkeypatch.context() as m:
        m.setattr(entries, "store", lambda *a, **kw: store(*a[:3], dataclasses.replace(a[3], modes=None), **kw))
        _loader(folder(_FLIP), cache=root)
    (entry,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert "modes" not in gf.open_cache(entry).manifest.meta


def test_an_entry_that_records_no_modes_is_rebuilt_once_where_the_pipeline_depends_on_them(tmp_path, monkeypatch):
    import warnings

    mixed = _mixed_folder(tmp_path / "mixed", monkeypatch)
    _entry_without_modes(monkeypatch, mixed, tmp_path / "c1")
    with pytest.warns(UserWarning, match="records no PIL modes"), pytest.raises(gf.DataError, match=r"Folder\[1\]"):
        _loader(mixed(_ROTATE), cache=tmp_path / "c1")
    one_mode = _mixed_folder(tmp_path / "one", monkeypatch, ("L",) * N)
    _entry_without_modes(monkeypatch, one_mode, tmp_path / "c2")
    with pytest.warns(UserWarning, match="records no PIL modes"):
        first = _loader(one_mode(_ROTATE), cache=tmp_path / "c2")
    assert "written to the cache" in first.plan.ingest
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = _loader(one_mode(_ROTATE), cache=tmp_path / "c2")
    assert again.plan.ingest.startswith("cache hit")
    assert torch.equal(next(iter(first))[0], next(iter(again))[0])


_FIXES = ("ToImage()", "Image.fromarray(", "ConvertImageDtype(")


def _check_form(ds: Arrays, name: str, op, m) -> str:
    """One op on numpy arrays or tensors before the first conversion: torchvision's batch, or its refusal (v1's ops
    take PIL images or tensors; v2 passes an array by unchanged, or raises where it needs the image's size), or the
    fallback (which runs torchvision's own no-op) -- never the op applied where torchvision does not apply it."""
    convert = {"ndarray": m.ToTensor() if m is T else v2.ToImage(), "tensor": v2.ToImage() if m is v2 else None}
    transform = m.Compose([op, *([convert[ds.form]] if convert[ds.form] is not None else [])])
    ds.transform = transform
    want = _torchvision(transform, ds, 30 if name in _RANDOM else 1)
    try:
        got = next(iter(_loader(ds)))[0]
    except ConfigError as e:
        message = str(e)
        assert "Arrays[0]" in message and any(fix in message for fix in _FIXES), message
        if isinstance(e, UnsupportedTransformError):
            assert isinstance(want, torch.Tensor), f"{ds.form} {name}: torchvision raises {want!r}: refuse it"
            assert "fallback='prefetch'" in message and "unchanged" in message, message
            with pytest.warns(UserWarning, match="falls back"):
                assert torch.equal(next(iter(_loader(ds, fallback="prefetch", num_workers=0)))[0], want)
            return "fallback"
        assert isinstance(want, Exception), f"{ds.form} {name}: torchvision runs it, gpufeed refused: {message}"
        assert "torchvision refuses it" in message, message
        return "refused"
    assert isinstance(want, torch.Tensor), f"{ds.form} {name}: torchvision raises {want!r}, gpufeed served a batch"
    assert got.shape == want.shape and got.dtype == want.dtype, (ds.form, name, got.shape, want.shape)
    if name not in _RANDOM:  # v2's autocontrast rounds otherwise than v1's, which gpufeed batches (a plan note)
        bound = 1 if (m is v2 and name == "autocontrast") else 0
        diff = (got.double() - want.double()).abs().max().item()
        assert diff <= bound, f"{ds.form} {name}: {diff} levels"
    return "batched"


@pytest.mark.parametrize("form,mode", [("ndarray", "RGB"), ("ndarray", "L"), ("tensor", "RGB")])
@pytest.mark.parametrize("m", [T, v2], ids=["v1", "v2"])
def test_arrays_and_tensors_get_torchvisions_batch_or_its_refusal_never_an_op_torchvision_does_not_apply(form, mode, m):
    every = {k: op for k, op in ops(m).items() if k not in ("contrast", "saturation", "hue", "Grayscale")}
    if form == "tensor" and m is T:  # v1's tensor kernels: tests/augment/test_auto.py and test_color.py compare them
        every = {"hflip": every["hflip"], "crop, fill": every["crop, fill"], "rotate nearest": every["rotate nearest"]}
    outcome = {name: _check_form(Arrays(mode, form=form), name, op, m) for name, op in every.items()}
    if form == "ndarray":  # v1's ops take PIL images or tensors; v2 leaves an array as it is, or raises
        assert outcome["hflip"] == ("refused" if m is T else "fallback"), outcome
        assert outcome["crop, fill"] == "refused", outcome
    else:
        assert set(outcome.values()) == {"batched"}, outcome


@pytest.mark.parametrize("form,conversion,outcome", [
    ("tensor", T.ToTensor(), "refused"),  # "pic should be PIL Image or ndarray"
    ("tensor", T.PILToTensor(), "refused"),
    ("tensor", v2.PILToTensor(), "batched"),  # v2 passes a tensor by: the same pixels
    ("ndarray", T.PILToTensor(), "refused"),  # "pic should be PIL Image"
    ("ndarray", v2.ToDtype(torch.float32, scale=True), "fallback"),  # v2 leaves the array as it is
])  # fmt: skip
def test_a_conversion_torchvision_refuses_on_arrays_or_tensors_is_refused(form, conversion, outcome):
    ds = Arrays("RGB", form=form)
    ds.transform = T.Compose([T.RandomHorizontalFlip(1.0) if form == "tensor" else v2.ToImage(), conversion])
    if form == "ndarray":
        ds.transform = v2.Compose([conversion, v2.RandomHorizontalFlip(1.0), v2.ToImage()])
    assert _check_form_of(ds) == outcome


def _check_form_of(ds: Arrays) -> str:
    transform = ds.transform
    want = _torchvision(transform, ds, 1)
    try:
        got = next(iter(_loader(ds)))[0]
    except ConfigError as e:
        assert "Arrays[0]" in str(e) and any(fix in str(e) for fix in _FIXES), str(e)
        if isinstance(e, UnsupportedTransformError):
            assert isinstance(want, torch.Tensor) and "fallback='prefetch'" in str(e)
            return "fallback"
        assert isinstance(want, Exception) and "torchvision refuses it" in str(e), (want, str(e))
        return "refused"
    assert isinstance(want, torch.Tensor) and torch.equal(got, want), want
    return "batched"


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
@pytest.mark.parametrize("op", [T.RandomRotation((30, 30)), T.RandomHorizontalFlip(1.0)], ids=["rotate", "flip"])
def test_the_fix_named_for_16_bit_and_float_images_keeps_their_values_and_then_batches(mode, op):
    # convert('L') clips every value above 255 (a 16-bit scan turns white, floats in [0, 1] black): never the fix
    ds = Images(mode, T.Compose([op, T.ToTensor()]))
    if mode == "F" and isinstance(op, T.RandomHorizontalFlip):
        assert torch.equal(next(iter(_loader(ds)))[0], _torchvision(ds.transform, ds, 1))  # float32: stored as it is
        return
    with pytest.raises((ConfigError, gf.DataError)) as caught:
        _loader(ds)
    message = str(caught.value)
    assert "convert('L')" not in message.replace("convert('L') would clip", ""), message
    assert "np.array(im, np.float32)" in message and "cache_lambda=True" in message, message
    scale = " / 65535" if mode == "I;16" else ""
    assert f"np.array(im, np.float32))[None]{scale})" in message, message
    as_float = T.Lambda(lambda im: torch.from_numpy(np.array(im, np.float32))[None] / (65535 if mode == "I;16" else 1))
    ds = Images(mode, T.Compose([as_float, op]))  # the fix, followed: a float tensor, batched as torchvision runs it
    loader = _loader(ds, cache_lambda=True)
    assert torch.equal(next(iter(loader))[0], _torchvision(ds.transform, ds, 1))


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
@pytest.mark.parametrize("m", [T, v2], ids=["v1", "v2"])
def test_a_normalize_of_another_channel_count_is_refused_where_torchvision_refuses_it(mode, m):
    convert = [T.ToTensor()] if m is T else [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
    for values in (1, 2, 3):
        ds = Images(
            mode, m.Compose([m.RandomHorizontalFlip(1.0), *convert, m.Normalize([0.5] * values, [0.25] * values)])
        )
        want = _torchvision(ds.transform, ds, 1)  # v1 normalizes in place: 1 value or one per channel; v2 broadcasts
        try:
            got = next(iter(_loader(ds)))[0]
        except ConfigError as e:
            message = str(e)
            if isinstance(e, UnsupportedTransformError):  # v2 makes 3 channels of 1: torchvision's, by the fallback
                assert isinstance(want, torch.Tensor) and want.shape[1] != got_channels(mode), (mode, values, message)
                with pytest.warns(UserWarning, match="falls back"):
                    assert torch.equal(next(iter(_loader(ds, fallback="prefetch", num_workers=0)))[0], want)
                continue
            assert isinstance(want, Exception), f"{mode} {values}: torchvision runs it, gpufeed refused: {message}"
            assert "torchvision refuses it" in message and f"{values} values" in message, message
            assert f"{got_channels(mode)} channels" in message and "Images[0]" in message, message
            with pytest.raises(ConfigError, match="torchvision refuses it"):  # no fallback runs it either
                _loader(ds, fallback="prefetch", num_workers=0)
            continue
        assert isinstance(want, torch.Tensor) and torch.equal(got, want), (mode, values, want)


def got_channels(mode: str) -> int:
    return len(mode)
