"""timm's own RandAugment and AutoAugment, batched: each op equals timm's PIL op pixel for pixel given the same
argument; the ops, magnitudes and signs are drawn as timm draws them; timm's recipes are accepted and give
images distributed as timm's."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import gpufeed as gf
from gpufeed.augment import timm_auto as TA

from fakes import varied_cifar
from stats import ALPHA, DRAWS, ks_critical, ks_statistic

timm_data = pytest.importorskip("timm.data")
from timm.data import auto_augment as AA  # noqa: E402

FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}
FILL = (124, 116, 104)


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for t, (h, w) in enumerate([(17, 23), (32, 32), (40, 31), (9, 9)]):
        yy, xx = np.mgrid[0:h, 0:w]
        smooth = np.stack([(xx * 7 + yy * 3) % 256, (yy * 11) % 256, np.clip(rng.normal(100, 40, (h, w)), 0, 255)], -1)
        out.append(rng.integers(0, 256, (h, w, 3)).astype(np.uint8) if t % 2 else smooth.astype(np.uint8))
    return out


@pytest.fixture
def pillow_12_posterize(monkeypatch):
    """timm's posterize can ask for 0 bits, which Pillow 13 refuses; before 13 it gave a black image, as gpufeed."""
    original = ImageOps.posterize
    monkeypatch.setattr(
        ImageOps, "posterize", lambda img, bits: Image.new(img.mode, img.size, 0) if bits <= 0 else original(img, bits)
    )


def _timm_level_args(name: str, level: float, sign: float, hparams: dict) -> tuple:
    """timm's LEVEL_TO_ARG for ``name`` with the sign forced (its _randomly_negate draws it)."""
    state = random.getstate()
    random.seed(0 if sign < 0 else 1)  # random.random() > 0.5 negates: seed 0 draws 0.84, seed 1 draws 0.13
    try:
        fn = AA.LEVEL_TO_ARG[name]
        return fn(level * 10.0, hparams) if fn is not None else ()
    finally:
        random.setstate(state)


@pytest.mark.parametrize("name", TA.NAMES)
def test_each_op_equals_timms_pil_op_for_the_same_argument(name, pillow_12_posterize):
    hparams = {"translate_const": 7, "img_mean": FILL, "translate_pct": 0.45}
    modes = ("nearest", "bilinear", "bicubic") if name in TA._GEOMETRIC else ("bilinear",)
    checked = 0
    for a in _images():
        x = torch.from_numpy(a).permute(2, 0, 1)[None].contiguous()
        h, w = a.shape[:2]
        for level in np.linspace(0.0, 1.0, 7):
            for sign in (1.0, -1.0):
                for mode in modes:
                    op = TA.TimmRandAugment((TA.TimmOp(name),), hparams=TA.Hparams.make(FILL, (mode,), 7, 0.45))
                    kind = torch.tensor([TA.NAMES.index(name)])
                    lv, sg = (torch.tensor([v], dtype=torch.float64) for v in (level, sign))
                    arg = op._arg(kind, lv, sg, h, w)
                    got = op._apply_round(x, {"kind": kind, "arg": arg, "mode": torch.tensor([0])})
                    args = _timm_level_args(name, level, sign, hparams)
                    ref = AA.NAME_TO_OP[name](Image.fromarray(a), *args, fillcolor=FILL, resample=FILTERS[mode])
                    np.testing.assert_array_equal(got[0].permute(1, 2, 0).numpy(), np.asarray(ref), err_msg=name)
                    checked += 1
    assert checked == 4 * 7 * 2 * len(modes)


@pytest.mark.parametrize("degrees", [0.0, 90.0, 180.0, 270.0, -90.0, 37.5, 360.0 + 12.0])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_rotations_take_pillows_shortcuts_at_right_angles(degrees, mode):
    from gpufeed.augment import pil

    for a in _images():
        x = torch.from_numpy(a).permute(2, 0, 1)[None].contiguous()
        got = pil.rotate(x, [degrees], mode, FILL)
        ref = Image.fromarray(a).rotate(degrees, resample=FILTERS[mode], fillcolor=FILL)
        np.testing.assert_array_equal(got[0].permute(1, 2, 0).numpy(), np.asarray(ref))


def _timm_draws(transform, n: int) -> list[list[tuple[str, tuple]]]:
    """What timm's transform applies to each of ``n`` images: (op name, its arguments) per applied op."""
    log: list[tuple[str, tuple]] = []
    ops = transform.ops if hasattr(transform, "ops") else [a for sub in transform.policy for a in sub]
    for a in ops:
        a.aug_fn = lambda img, *args, _name=a.name, **kw: (log.append((_name, args)), img)[1]
    draws = []
    random.seed(3)
    np.random.seed(3)
    img = Image.new("RGB", (8, 8))
    for _ in range(n):
        log.clear()
        transform(img)
        draws.append(list(log))
    return draws


def _our_draws(op, n: int, h: int = 8, w: int = 8) -> list[list[tuple[str, float]]]:
    params = op.sample(torch.zeros(n, 3, h, w, dtype=torch.uint8), torch.Generator().manual_seed(5))
    rounds = [(r["kind"].tolist(), r["arg"].tolist()) for r in params["rounds"]]
    return [[(TA.NAMES[k[i]], a[i]) for k, a in rounds if k[i] >= 0] for i in range(n)]


def _first_arg(name: str, args: tuple, h: int = 8, w: int = 8) -> float:
    if not args:
        return 0.0
    v = float(args[0])
    return v * (w if name == "TranslateXRel" else h) if name in ("TranslateXRel", "TranslateYRel") else v


def _compare(ours: list, theirs: list, names: list[str]) -> None:
    # how many ops each image got, and which: chi-square of ours against timm's frequencies
    for summary in (lambda d: len(d), lambda d: tuple(sorted(name for name, _ in d))):
        a, b = (torch.tensor([hash(summary(d)) for d in side]) for side in (ours, theirs))
        keys = torch.cat([a, b]).unique()
        ca = torch.stack([(a == k).sum() for k in keys]).double()
        cb = torch.stack([(b == k).sum() for k in keys]).double()
        keep = (ca + cb) >= 20  # pool the rare cells
        ca = torch.cat([ca[keep], ca[~keep].sum().view(1)])
        cb = torch.cat([cb[keep], cb[~keep].sum().view(1)])
        stat = float((((ca - cb) ** 2) / (ca + cb).clamp(min=1)).sum())  # two-sample chi-square, equal sizes
        dof = int((ca + cb > 0).sum()) - 1
        assert 1 - float(torch.distributions.Chi2(dof).cdf(torch.tensor(stat))) > ALPHA, (stat, dof)
    # each op's argument (magnitude noise, sign, the level formula): KS per op
    for name in names:
        a = torch.tensor([v for d in ours for op, v in d if op == name], dtype=torch.float64)
        b = torch.tensor([_first_arg(op, v) for d in theirs for op, v in d if op == name], dtype=torch.float64)
        if len(a) > 50 and len(b) > 50:
            assert ks_statistic(a, b) < ks_critical(len(a), len(b)), name


def _hparams(**extra) -> dict:
    return {"translate_const": 3, "img_mean": FILL, **extra}


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", ["rand-m9-mstd0.5-inc1", "rand-m7-n3-mstd101", "rand-m9-mmax15-mstd1", "rand-m9-tweights-p0.8"]
)
def test_rand_augment_draws_ops_magnitudes_and_signs_as_timm(config):
    from gpufeed.pipeline.translate import CONVERTERS
    from gpufeed.pipeline.translate.state import State

    theirs_t = AA.rand_augment_transform(config, _hparams())
    ours_t = CONVERTERS["TimmRandAugment"](theirs_t, State(torch.uint8, (8, 8), pil=True))
    theirs = _timm_draws(theirs_t, DRAWS)
    ours = _our_draws(ours_t, DRAWS)
    _compare(ours, theirs, [o.name for o in theirs_t.ops])


@pytest.mark.slow
@pytest.mark.parametrize("config", ["original-mstd0.5", "v0", "v0r", "originalr"])
def test_auto_augment_draws_sub_policies_as_timm(config):
    from gpufeed.pipeline.translate import CONVERTERS
    from gpufeed.pipeline.translate.state import State

    theirs_t = AA.auto_augment_transform(config, _hparams())
    ours_t = CONVERTERS["TimmAutoAugment"](theirs_t, State(torch.uint8, (8, 8), pil=True))
    theirs = _timm_draws(theirs_t, DRAWS)
    ours = _our_draws(ours_t, DRAWS)
    _compare(ours, theirs, sorted({a.name for sub in theirs_t.policy for a in sub}))


@pytest.mark.parametrize(
    "config, interpolation",
    [
        ("rand-m9-mstd0.5-inc1", "bilinear"),
        ("rand-m7-n3-mstd101", "random"),
        ("rand-m9-tweights-p0.8", "bicubic"),
        ("original-mstd0.5", "random"),
        ("v0r", "bilinear"),
    ],
)
def test_timms_auto_augment_recipes_are_batched_and_distributed_as_timms(config, interpolation, pillow_12_posterize):
    n = 2000
    ds = varied_cifar(n, seed=4)
    ds.transform = timm_data.create_transform(24, is_training=True, auto_augment=config, interpolation=interpolation)
    loader = gf.accelerate(ds, batch_size=500, shuffle=False, device="cpu", cache=False, progress=False, seed=8)
    assert loader.plan.storage != "fallback"
    assert any(step.startswith("Timm") for step in loader.plan.batched)
    ours = torch.cat([x for x, _ in loader])
    torch.manual_seed(8)
    random.seed(8)
    np.random.seed(8)
    theirs = torch.stack([ds[i][0] for i in range(n)])
    for key in ("mean", "std"):
        a, b = (getattr(t, key)((1, 2, 3)) for t in (ours, theirs))
        assert ks_statistic(a, b) < ks_critical(n, n), key


def test_the_issues_timm_recipe_at_224_is_batched_without_fallback():
    ds = varied_cifar(8)
    ds.transform = timm_data.create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
    loader = gf.accelerate(ds, batch_size=4, device="cpu", cache=False, progress=False)
    steps = " ".join(loader.plan.batched)
    assert loader.plan.storage != "fallback" and "TimmRandAugment" in steps and "TimmRandomErasing" in steps
    assert any("Pillow 13" in note for note in loader.plan.notes)
    x, _ = next(iter(loader))
    assert x.shape == (4, 3, 224, 224) and x.dtype == torch.float32


@pytest.mark.parametrize("config", ["3a", "augmix-m5-w3", "rand-m9-t3aw"])
def test_timm_ops_gpufeed_does_not_batch_are_refused_by_name_and_run_through_the_fallback(config):
    ds = varied_cifar(8)
    ds.transform = timm_data.create_transform(24, is_training=True, auto_augment=config)
    with pytest.raises(gf.UnsupportedTransformError, match="GaussianBlur|AugMix"):
        gf.accelerate(ds, batch_size=4, device="cpu", progress=False)
    loader = gf.accelerate(ds, batch_size=4, device="cpu", progress=False, fallback="prefetch")
    assert loader.plan.storage == "fallback" and next(iter(loader))[0].shape == (4, 3, 24, 24)


def test_timms_auto_augment_on_tensors_is_refused_with_the_fix():
    import torchvision.transforms as T

    ds = varied_cifar(8)
    ds.transform = T.Compose([T.PILToTensor(), AA.rand_augment_transform("rand-m9", _hparams())])
    with pytest.raises(gf.UnsupportedTransformError, match="needs PIL images"):
        gf.accelerate(ds, batch_size=4, device="cpu", progress=False)


def test_a_probability_above_one_applies_always_and_no_layers_leave_the_image(pillow_12_posterize):
    ds = varied_cifar(8)
    ds.transform = timm_data.create_transform(24, is_training=True, auto_augment="rand-m9-p1.5")
    loader = gf.accelerate(ds, batch_size=4, device="cpu", cache=False, progress=False)
    assert "TimmRandAugment" in " ".join(loader.plan.batched)  # timm runs it (prob >= 1: always), so does gpufeed
    theirs = AA.rand_augment_transform("rand-m9-n0-tweights", _hparams())
    from gpufeed.pipeline.translate import CONVERTERS
    from gpufeed.pipeline.translate.state import State

    ours = CONVERTERS["TimmRandAugment"](theirs, State(torch.uint8, (8, 8), pil=True))
    x = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    assert torch.equal(ours(x, generator=torch.Generator().manual_seed(0)), x)  # timm: np.random.choice of 0 ops


@pytest.mark.parametrize("fill", [(128,), (7, 9, 11)])
def test_grey_images_and_short_fills_are_filled_as_pillow_fills_them(fill):
    from gpufeed.augment import pil

    rgb = _images()[2]
    for a, mode_channels in ((rgb, 3), (rgb[..., 0].copy(), 1)):
        if mode_channels == 1 and len(fill) > 1:
            op = TA.TimmRandAugment((TA.TimmOp("ShearX"),), hparams=TA.Hparams.make(fill, ("bilinear",), 7, 0.45))
            with pytest.raises(gf.ConfigError, match="TypeError"):  # Pillow refuses 3 values for an L image
                op(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), generator=torch.Generator())
            continue
        x = torch.from_numpy(a).view(1, *a.shape[:2], -1).permute(0, 3, 1, 2).contiguous()
        got = pil.affine(x, [(1, 0.3, -9.5, 0.1, 1, 4)], "bilinear", fill)
        ref = Image.fromarray(a).transform(
            (a.shape[1], a.shape[0]), Image.Transform.AFFINE, (1, 0.3, -9.5, 0.1, 1, 4), Image.Resampling.BILINEAR,
            fillcolor=fill if mode_channels == 3 else fill[0],
        )  # fmt: skip
        np.testing.assert_array_equal(got[0].permute(1, 2, 0).numpy().reshape(np.asarray(ref).shape), np.asarray(ref))


def test_smooth_equals_pillows_filter_on_many_images():
    from PIL import ImageFilter

    from gpufeed.augment import pil

    rng = np.random.default_rng(9)
    for t in range(60):
        h, w = int(rng.integers(3, 30)), int(rng.integers(3, 30))
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8) if t % 3 else np.full((h, w, 3), t * 4, np.uint8)
        got = pil.smooth(torch.from_numpy(a).permute(2, 0, 1)[None].contiguous())[0].permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(got, np.asarray(Image.fromarray(a).filter(ImageFilter.SMOOTH)))
