"""AutoAugment, RandAugment, TrivialAugmentWide batched: each op equals torchvision's tensor kernel given the
same op and magnitude, and the ops, magnitudes and signs are drawn with torchvision's distribution."""

from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode
from torchvision.transforms.autoaugment import _apply_op

from gpufeed.augment.auto import AugMix, AutoAugment, RandAugment, TrivialAugmentWide, policies
from gpufeed.augment.auto_ops import OPS, SIGNED, apply_op, magnitude_table
from gpufeed.errors import ConfigError

from fakes import image_summaries, varied_cifar
from stats import chi_square_p_value

# torchvision's per-sample reference on one torch thread (tests/conftest.py), as make test runs it: this file run
# alone beside a load of 4-5 on the 2-core machine took 745 s on torch's 2 threads, 101 s on one (the AugMix recipe
# test 57 s and 8 s)
pytestmark = pytest.mark.usefixtures("one_thread")


def _images(n: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Noise, flat images and dark ones: flat channels exercise autocontrast's and equalize's edge cases."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)
    x[1] = 77  # one flat image
    x[2] //= 8  # a dark one
    x[3, 0] = 200  # one flat channel
    return x


def _magnitudes(kind: str, name: str, h: int, w: int, bins: int) -> list[float]:
    row = magnitude_table(kind, bins, h, w, OPS)[OPS.index(name)]
    values = sorted(set(row.tolist()))
    signed = name in SIGNED
    return values + [-v for v in values if v] if signed else values


def _as_torchvision_gets_it(img: torch.Tensor, pil: bool):
    """An image as torchvision's op receives it: the uint8 tensor, or the PIL image of it."""
    from PIL import Image

    return Image.fromarray(img.permute(1, 2, 0).numpy()) if pil else img


def _as_tensor(out) -> torch.Tensor:
    import numpy as np

    return out if isinstance(out, torch.Tensor) else torch.from_numpy(np.asarray(out).copy()).permute(2, 0, 1)


@pytest.mark.parametrize("pil", [False, True])  # torchvision's tensor kernels, or on PIL images its PIL ones
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
@pytest.mark.parametrize("size", [(32, 32), (24, 41)])
@pytest.mark.parametrize("fill", [None, (10.0, 20.0, 30.0)])
@pytest.mark.parametrize("name", OPS)
def test_each_op_equals_torchvisions_kernel_at_every_magnitude(name, size, fill, mode, pil):
    h, w = size
    mags = sorted(set(_magnitudes("wide", name, h, w, 31) + _magnitudes("rand", name, h, w, 31)))
    mags = (mags * 8)[: max(8, len(mags))]  # at least the 8 kinds of image, for the ops without a magnitude
    x = _images(len(mags), h, w)
    op = torch.full((len(mags),), OPS.index(name))
    got = apply_op(x, op, torch.tensor(mags, dtype=torch.float64), fill, mode, pil=pil)
    tv_fill = list(fill) if fill is not None else None
    for i, m in enumerate(mags):
        img = _as_torchvision_gets_it(x[i], pil)
        want = _as_tensor(_apply_op(img, name, m, interpolation=InterpolationMode(mode), fill=tv_fill))
        assert torch.equal(got[i], want), (name, m, (got[i].int() - want.int()).abs().max())


@pytest.mark.parametrize("pil", [False, True])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_a_batch_of_mixed_ops_equals_torchvision_sample_by_sample(pil, mode):
    x = _images(96, 32, 30, seed=1)
    g = torch.Generator().manual_seed(5)
    ta = TrivialAugmentWide(interpolation=mode, fill=(5.0, 6.0, 7.0), pil=pil)
    params = ta.sample(x, g)
    got = ta.apply(x, params)
    for i in range(96):
        name, m = OPS[int(params["op"][i])], float(params["magnitude"][i])
        img = _as_torchvision_gets_it(x[i], pil)
        want = _as_tensor(_apply_op(img, name, m, InterpolationMode(mode), [5.0, 6.0, 7.0]))
        assert torch.equal(got[i], want), (i, name, m)


@pytest.mark.parametrize("policy", ["imagenet", "cifar10", "svhn"])
def test_autoaugment_applies_each_samples_sub_policy_as_torchvision_does(policy):
    """Each sample's drawn rounds, replayed through torchvision's own ``_apply_op`` with the policy's
    (name, magnitude bin) for that round, give the batched output exactly."""
    x = _images(32, 32, 32, seed=4)
    op = AutoAugment(policy)
    params = op.sample(x, torch.Generator().manual_seed(3))
    got = op.apply(x, params)
    space = T.AutoAugment(T.AutoAugmentPolicy(policy))._augmentation_space(10, (32, 32))
    steps = {OPS.index(name) for sub in policies(policy) for name, _, _ in sub}
    applied = 0
    for i in range(32):
        want = x[i]
        for ops, mags in params["rounds"]:
            k, m = int(ops[i]), float(mags[i])
            if k == 0:  # the sub-policy's step was skipped by its probability
                continue
            assert k in steps
            name = OPS[k]
            table, signed = space[name]
            assert table.ndim == 0 or abs(m) in {float(v) for v in table}  # a magnitude of that op's bins
            want = _apply_op(want, name, m, InterpolationMode.NEAREST, None)
            applied += 1
        assert torch.equal(got[i], want), i
    assert applied > 16  # the steps ran, not only skips


def test_float_batches_are_refused_with_the_fix():
    from gpufeed.errors import ConfigError

    with pytest.raises(ConfigError, match="uint8 images.*put it before ToTensor"):
        RandAugment()(torch.rand(2, 3, 8, 8), generator=torch.Generator())


DRAWS = 20_000  # per distribution test; fixed seeds and a 1e-3 significance (tests/stats.py)


def test_trivial_augment_draws_ops_bins_and_signs_uniformly():
    x = torch.zeros(DRAWS, 3, 2, 2, dtype=torch.uint8)
    ta = TrivialAugmentWide(num_magnitude_bins=31)
    p = ta.sample(x, torch.Generator().manual_seed(0))
    op, mag = p["op"], p["magnitude"]
    assert chi_square_p_value(torch.bincount(op, minlength=14)) > 1e-3
    table = magnitude_table("wide", 31, 2, 2, OPS)
    rotate = op == OPS.index("Rotate")  # 0..135 degrees in 31 bins, either sign
    bins = (mag[rotate].abs()[:, None] - table[OPS.index("Rotate")][None]).abs().argmin(1)
    assert chi_square_p_value(torch.bincount(bins, minlength=31)) > 1e-3
    signed = torch.isin(op, torch.tensor([OPS.index(n) for n in ("ShearX", "Brightness", "Sharpness")]))
    negative = int((mag[signed] < 0).sum())
    nonzero = int((mag[signed] != 0).sum())  # bin 0 is magnitude 0: no sign
    assert abs(negative - nonzero / 2) < 3.3 * (nonzero / 4) ** 0.5  # a fair coin, z < 3.3 (p ~ 1e-3)
    posterize = mag[op == OPS.index("Posterize")]
    assert set(posterize.tolist()) <= set(range(2, 9)) and float(posterize.min()) == 2.0


def test_rand_augment_rounds_draw_ops_uniformly_at_the_fixed_magnitude():
    x = torch.zeros(DRAWS, 3, 2, 2, dtype=torch.uint8)
    ra = RandAugment(num_ops=2, magnitude=9)
    rounds = ra.sample(x, torch.Generator().manual_seed(1))["rounds"]
    assert len(rounds) == 2
    for op, mag in rounds:
        assert chi_square_p_value(torch.bincount(op, minlength=14)) > 1e-3
        rot = mag[op == OPS.index("Rotate")]
        assert set(rot.abs().tolist()) == {9.0} and 0.45 < float((rot < 0).double().mean()) < 0.55
    assert float((rounds[0][0] == rounds[1][0]).double().mean()) == pytest.approx(1 / 14, abs=0.01)  # independent


def test_autoaugment_picks_sub_policies_uniformly_and_applies_each_step_with_its_probability():
    x = torch.zeros(DRAWS, 3, 4, 4, dtype=torch.uint8)
    aa = AutoAugment("cifar10")
    rounds = aa.sample(x, torch.Generator().manual_seed(2))["rounds"]
    pol = policies("cifar10")
    # ("Invert", 0.1) is the first step of sub-policy 0 only; ("Sharpness", 0.8, 1) of sub-policy 2 only.
    applied_invert = float((rounds[0][0] == OPS.index("Invert")).double().mean())
    assert applied_invert == pytest.approx(0.1 / len(pol), abs=3.3 * (0.004 / DRAWS) ** 0.5)
    sharp_first = rounds[0][0] == OPS.index("Sharpness")  # sub-policies 2 (p 0.8) and 9... first steps
    expected = sum(p for (name, p, _), _ in pol if name == "Sharpness") / len(pol)
    assert float(sharp_first.double().mean()) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    "op",
    [T.TrivialAugmentWide(), T.RandAugment(), T.AutoAugment(T.AutoAugmentPolicy.CIFAR10), T.AutoAugment()],
    ids=["TrivialAugmentWide", "RandAugment", "AutoAugment-cifar10", "AutoAugment-imagenet"],
)
def test_a_recipe_is_batched_without_fallback_and_its_outputs_are_distributed_as_torchvisions(op):
    import gpufeed as gf

    from stats import ks_critical, ks_statistic

    n = 3000
    recipe = T.Compose([T.PILToTensor(), op, T.ConvertImageDtype(torch.float32)])
    ds = varied_cifar(n)
    ds.transform = recipe
    loader = gf.accelerate(ds, batch_size=500, shuffle=False, device="cpu", cache=False, progress=False, seed=3)
    assert loader.plan.storage != "fallback" and any(type(op).__name__ in b for b in loader.plan.batched)
    ours = torch.cat([x for x, _ in loader])
    before = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float() / 255
    torch.manual_seed(3)
    theirs = torch.stack([ds[i][0] for i in range(n)])
    a, b = image_summaries(ours, before), image_summaries(theirs, before)
    for key in a:
        assert ks_statistic(a[key], b[key]) < ks_critical(n, n), key


def _augmix_reference(x: torch.Tensor, params: dict, mode: str, fill=None) -> torch.Tensor:
    """torchvision's AugMix.forward for one image, with the draws given (its own code path per op)."""
    mix = params["original"] * x
    for i, steps in enumerate(params["chains"]):
        aug = x
        for op, mag in steps:
            if int(op) != 0:
                aug = _apply_op(aug, OPS[int(op)], float(mag), InterpolationMode(mode), fill)
        mix.add_(params["weights"][i] * aug)
    return mix.to(x.dtype)


@pytest.mark.parametrize("chain_depth, all_ops", [(-1, True), (2, False)])
def test_augmix_equals_torchvisions_arithmetic_given_the_same_draws(chain_depth, all_ops):
    x = _images(16, 24, 20, seed=3)
    op = AugMix(severity=3, mixture_width=3, chain_depth=chain_depth, all_ops=all_ops)
    params = op.sample(x, torch.Generator().manual_seed(9))
    got = op.apply(x, params)
    for i in range(len(x)):
        one = {
            "original": params["original"][i],
            "weights": params["weights"][i],
            "chains": [[(o[i], m[i]) for o, m in steps] for steps in params["chains"]],
        }
        assert torch.equal(got[i], _augmix_reference(x[i], one, op.interpolation)), i
    depths = torch.stack([sum((o != 0).long() for o, _ in steps) for steps in params["chains"]])
    assert int(depths.max()) <= (3 if chain_depth < 0 else 2)


def test_dirichlet_draws_follow_torchs_dirichlet():
    from gpufeed.augment.auto import dirichlet

    from stats import ks_critical, ks_statistic

    n = 20_000
    for alpha in (0.3, 1.0, 2.5):
        ours = dirichlet(torch.tensor([alpha, alpha, alpha]), n, torch.Generator().manual_seed(1))
        torch.manual_seed(1)
        theirs = torch.distributions.Dirichlet(torch.tensor([alpha] * 3)).sample((n,))
        assert torch.allclose(ours.sum(1), torch.ones(n), atol=1e-5)
        assert ks_statistic(ours[:, 0], theirs[:, 0]) < ks_critical(n, n), alpha


def test_augmix_recipe_is_batched_and_distributed_as_torchvisions():
    import gpufeed as gf

    from stats import ks_critical, ks_statistic

    n = 3000
    recipe = T.Compose([T.PILToTensor(), T.AugMix(), T.ConvertImageDtype(torch.float32)])
    ds = varied_cifar(n, seed=2)
    ds.transform = recipe
    loader = gf.accelerate(ds, batch_size=500, shuffle=False, device="cpu", cache=False, progress=False, seed=5)
    assert loader.plan.storage != "fallback" and any("AugMix" in b for b in loader.plan.batched)
    ours = torch.cat([x for x, _ in loader])
    before = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float() / 255
    torch.manual_seed(5)
    theirs = torch.stack([ds[i][0] for i in range(n)])
    a, b = image_summaries(ours, before), image_summaries(theirs, before)
    for key in a:
        assert ks_statistic(a[key], b[key]) < ks_critical(n, n), key


@pytest.mark.slow
@pytest.mark.parametrize("use_v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("policy", ["ra", "ta_wide", "augmix", "imagenet", "cifar10", "svhn"])
def test_the_classification_reference_preset_with_each_policy_runs_batched_as_torchvision(policy, use_v2):
    import gpufeed as gf
    from test_recipes import reference_train

    from stats import ks_critical, ks_statistic

    n = 2000
    ds = varied_cifar(n, seed=3)
    ds.transform = reference_train(24, use_v2=use_v2, backend="tensor", erase=0.25, policy=policy)
    loader = gf.accelerate(ds, batch_size=500, shuffle=False, device="cpu", cache=False, progress=False, seed=6)
    assert loader.plan.storage != "fallback"
    ours = torch.cat([x for x, _ in loader])
    torch.manual_seed(6)
    theirs = torch.stack([ds[i][0] for i in range(n)])
    for key in ("mean", "std"):
        a, b = (getattr(t, key)((1, 2, 3)) for t in (ours, theirs))
        assert ks_statistic(a, b) < ks_critical(n, n), key


def test_on_pil_images_v2s_solarize_thresholds_compare_in_float64_as_pillow_does():
    import numpy as np
    import torchvision.transforms.v2 as T2
    from PIL import Image

    ramp = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(1, 3, 16, 16).contiguous()
    table = magnitude_table("wide", 31, 16, 16, OPS, v2_thresholds=True)[OPS.index("Solarize")].tolist()
    x = ramp.expand(len(table), 3, 16, 16).contiguous()
    op = torch.full((len(table),), OPS.index("Solarize"))
    got = apply_op(x, op, torch.tensor(table, dtype=torch.float64), pil=True, v2=True)
    ta = T2.TrivialAugmentWide()
    img = Image.fromarray(ramp[0].permute(1, 2, 0).numpy())
    fractions = torch.linspace(1.0, 0.0, 31).tolist()  # v2's magnitudes; its threshold is 255.0 * fraction
    assert table == [255.0 * f for f in fractions]
    for i, f in enumerate(fractions):
        want = ta._apply_image_or_video_transform(img, "Solarize", f, InterpolationMode.NEAREST, ta._fill)
        assert np.array_equal(got[i].permute(1, 2, 0).numpy(), np.asarray(want)), f


def test_v2_solarize_thresholds_are_v2s():
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(3, 3, 16, 16).contiguous()
    table = magnitude_table("wide", 31, 16, 16, OPS, v2_thresholds=True)
    for b in (16, 18, 24):  # where 255 * linspace(1, 0) and linspace(255, 0) differ in the last bit
        t = float(table[OPS.index("Solarize"), b])
        got = apply_op(x, torch.full((3,), OPS.index("Solarize")), torch.full((3,), t, dtype=torch.float64))
        want = v2.functional.solarize(x, threshold=255.0 * float(torch.linspace(1.0, 0.0, 31)[b]))
        assert torch.equal(got, want), b
    assert TrivialAugmentWide(v2_thresholds=True).v2_thresholds


POLICIES = {
    "TrivialAugmentWide": (TrivialAugmentWide, T.TrivialAugmentWide),
    "RandAugment": (RandAugment, T.RandAugment),
    "AutoAugment imagenet": (AutoAugment, T.AutoAugment),
    "AutoAugment cifar10": (
        lambda **kw: AutoAugment("cifar10", **kw),
        lambda: T.AutoAugment(T.AutoAugmentPolicy.CIFAR10),
    ),
    "AutoAugment svhn": (lambda **kw: AutoAugment("svhn", **kw), lambda: T.AutoAugment(T.AutoAugmentPolicy.SVHN)),
    "AugMix": (AugMix, T.AugMix),
}


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("channels", [2, 4, 5])
def test_every_policy_refuses_a_channel_count_torchvision_refuses_on_every_batch_naming_itself(name, channels):
    ours, theirs = POLICIES[name]
    x = torch.randint(0, 256, (16, channels, 12, 12), dtype=torch.uint8)
    refused = 0
    for seed in range(30):  # torchvision: each draw of a colour op raises (the geometric ones run)
        torch.manual_seed(seed)
        try:
            theirs()(x[0])
        except TypeError as e:
            assert f"found {channels}" in str(e)
            refused += 1
    assert refused > 0
    op_name = name.split()[0]
    for flags in ({}, {"pil": True}, {"v2_thresholds": True}) if op_name != "AugMix" else ({},):
        for dtype in (torch.uint8, torch.float32):
            for seed in range(8):  # every batch, whatever it draws: never only the ones that draw a colour op
                with pytest.raises(ConfigError, match=f"^{op_name} on {channels}-channel images: torchvision refuses"):
                    ours(**flags)(x.to(dtype), generator=torch.Generator().manual_seed(seed))


def test_a_device_loader_refuses_an_auto_augment_its_images_cannot_take_when_made():
    import gpufeed as gf
    from gpufeed import augment as A

    for channels, dtype in ((4, torch.uint8), (2, torch.uint8), (4, torch.float32)):
        images = torch.randint(0, 256, (37, channels, 16, 16), dtype=torch.uint8).to(dtype) / (
            255 if dtype.is_floating_point else 1
        )
        for op in (A.TrivialAugmentWide(), A.RandAugment(), A.AutoAugment(), A.AugMix()):
            aug = A.Compose([A.RandomCrop(16, padding=2), A.RandomHorizontalFlip(), op])
            with pytest.raises(ConfigError, match=f"{type(op).__name__} on {channels}-channel images") as raised:
                gf.DeviceLoader(images.to(dtype), torch.arange(37), batch_size=8, device="cpu", transform=aug)
            assert "x[:, :" in str(raised.value) and "convert('RGB')" in str(raised.value)
    for channels in (1, 3):  # what torchvision takes is served, every batch
        images = torch.randint(0, 256, (37, channels, 16, 16), dtype=torch.uint8)
        loader = gf.DeviceLoader(images, torch.arange(37), batch_size=8, device="cpu", dtype=None,
                                 transform=A.Compose([A.TrivialAugmentWide()]))  # fmt: skip
        assert [tuple(x.shape) for x, _ in loader][-1] == (5, channels, 16, 16)
