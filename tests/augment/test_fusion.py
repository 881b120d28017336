"""The fused ops (gpufeed.augment.fusion, .jitter, .taps, .moves, .auto_fused): compiled, they give the eager ops'
pixels bit for bit (the resize: its eager taps, within torchvision's float kernel); a batch of one, GPUFEED_COMPILE=0,
a dry run and a device without a compiler run the eager ops (the last with one warning). Compiled in the foreground
here (fusion.foreground: at the call); the background compile: tests/augment/test_background.py."""

import warnings
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import gpufeed as gf
from gpufeed.augment import (
    AugMix,
    AutoAugment,
    ColorJitter,
    Compose,
    KeyedDraws,
    Normalize,
    RandAugment,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    TrivialAugmentWide,
    auto_fused,
    fusion,
    jitter,
    moves,
    taps,
)
from gpufeed.augment import functional as F
from gpufeed.augment.paths import device_path

# A compile that failed would run the eager ops and pass every comparison here: it fails the test instead.
pytestmark = pytest.mark.filterwarnings("error:gpufeed could not compile")


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setenv("GPUFEED_COMPILE", "1")  # the rest of the suite runs the eager ops (tests/conftest.py)
    monkeypatch.setattr(fusion, "_FAILED", {})
    with fusion.foreground():  # compiled at the first call, so that the compiled pixels are the ones compared
        yield


def _eager(op: ColorJitter, x: torch.Tensor, params: dict) -> torch.Tensor:
    with fusion.eager():
        return op.apply(x, params)


# Every code path of .jitter, one compile each (seconds, cold): each adjustment alone (one tensor; contrast's
# reduction with nothing before it; three planes; hue), two blends with a mean after a gray, all four with hue
# around contrast. Ranges wide enough to clip (brightness 1.9 saturates).
CONFIGS = [
    dict(brightness=(0.1, 1.9)),
    dict(contrast=(0.0, 2.0)),
    dict(saturation=(0.0, 3.0)),
    dict(hue=0.5),
    dict(contrast=0.8, saturation=0.8),
    dict(brightness=(0.5, 1.5), contrast=(0.2, 1.8), saturation=(0.0, 2.0), hue=(-0.5, 0.5)),
]
SHAPES = [(5, 13, 29), (2, 8, 8), (17, 32, 32), (3, 64, 48)]  # not square first: one compile serves all


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(c))
def test_the_fused_colorjitter_gives_the_eager_pixels_bit_for_bit(compiled, config):
    op = ColorJitter(**config)
    g = torch.Generator().manual_seed(len(config))
    for n, h, w in SHAPES:
        x = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)
        x[0, :, : h // 2] = x[0, :1, : h // 2]  # gray pixels: saturation 0, hue's max == min
        x[-1, :, :, : w // 3] = 255  # white: brightness clips
        params = op.sample(x, g)
        with pytest.MonkeyPatch.context() as m:  # the compiled path is the one measured here
            m.setattr(jitter, "jitter", _counted(jitter.jitter))
            ours = op.apply(x, params)
            assert jitter.jitter.calls == 1
        assert torch.equal(ours, _eager(op, x, params)), (n, h, w)


def _counted(fn):
    def counted(*args):  # counts the calls that returned: one that raised NotCompiled ran the eager ops
        out = fn(*args)
        counted.calls += 1
        return out

    counted.calls = 0
    return counted


def test_images_too_large_for_an_exact_float_sum_take_torchs_mean_and_stay_exact(compiled):
    op = ColorJitter(0.4, 0.4)  # 257 x 256 pixels: a gray sum can pass 2**24; brightness before contrast or after
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (3, 3, 257, 256), dtype=torch.uint8, generator=g)
    x[1] = 250  # a bright image: its sum is well over 2**24
    params = op.sample(x, g)
    assert torch.equal(op.apply(x, params), _eager(op, x, params))


def test_the_device_path_runs_the_same_fused_op(compiled):
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    x = torch.randint(0, 256, (6, 3, 20, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    params = op.sample(x, torch.Generator().manual_seed(4))
    with device_path():
        on_device_path = op.apply(x, params)
    assert torch.equal(on_device_path, _eager(op, x, params))


def test_a_batch_of_one_runs_the_eager_ops_without_compiling(compiled, monkeypatch):
    # torch.compile specialises on size 1: a last batch of one sample would recompile mid-epoch
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: pytest.fail("compiled for one sample"))
    jitter._kernels.cache_clear()
    op = ColorJitter(0.4, 0.4, 0.4)
    x = torch.randint(0, 256, (1, 3, 9, 9), dtype=torch.uint8)
    params = op.sample(x, torch.Generator().manual_seed(0))
    assert torch.equal(op.apply(x, params), _eager(op, x, params))
    jitter._kernels.cache_clear()


def _no_compiler(fn, **kwargs):
    def failing(*args):
        raise torch._dynamo.exc.BackendCompilerFailed(fn, RuntimeError("no C++ compiler found (test)"), None)

    return failing


def test_where_no_compiler_runs_the_op_warns_once_and_gives_the_eager_pixels(compiled, monkeypatch):
    monkeypatch.setattr(torch, "compile", _no_compiler)
    jitter._kernels.cache_clear()
    op = ColorJitter(brightness=0.4, hue=0.1)
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    params = op.sample(x, torch.Generator().manual_seed(0))
    expected = _eager(op, x, params)
    with pytest.warns(UserWarning, match=r"could not compile its fused ColorJitter on cpu .*no C\+\+ compiler.*"):
        assert torch.equal(op.apply(x, params), expected)
    assert not fusion.compiling(x.device) and fusion.compiling(torch.device("cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: later batches run eager without a word
        assert torch.equal(op.apply(x, params), expected)
    jitter._kernels.cache_clear()


def test_gpufeed_compile_0_torch_compile_disable_and_a_dry_run_never_compile(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: pytest.fail("compiled"))
    jitter._kernels.cache_clear()
    op = ColorJitter(contrast=0.4)
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    params = op.sample(x, torch.Generator().manual_seed(0))
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    op.apply(x, params)
    monkeypatch.setenv("GPUFEED_COMPILE", "1")
    with fusion.eager():
        op.apply(x, params)
    with torch._dynamo.config.patch(disable=True):  # TORCH_COMPILE_DISABLE=1 (monkeypatch would delete the key)
        op.apply(x, params)
    jitter._kernels.cache_clear()


def test_float_and_gray_batches_keep_the_eager_ops(compiled, monkeypatch):
    monkeypatch.setattr(jitter, "jitter", lambda *a: pytest.fail("fused path taken"))
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    for x in (torch.rand(3, 3, 8, 8), torch.randint(0, 256, (3, 1, 8, 8), dtype=torch.uint8)):
        params = op.sample(x, torch.Generator().manual_seed(0))
        assert op.apply(x, params).shape == x.shape


def test_a_loader_compiles_at_construction_and_serves_the_eager_batches(compiled, monkeypatch):
    recipe = Compose([ColorJitter(0.4, 0.4), RandomCrop(16, padding=2), RandomHorizontalFlip(),
                      Normalize([0.5] * 3, [0.25] * 3)])  # fmt: skip
    images = torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(40)
    calls = []
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(fn) or compile_(fn, **kw))
    jitter._kernels.cache_clear()
    loader = gf.DeviceLoader(images, labels, 16, transform=recipe, device="cpu", seed=3)
    assert len(calls) == 2  # the mean gray and the jitter, at construction (the transform's run on two samples)
    assert loader.compile_note.startswith("fused kernels: ColorJitter for cpu compiled in ")  # for the plan
    graphs = counters["stats"]["unique_graphs"]
    ours = [x for x, _ in loader]
    assert len(calls) == 2 and counters["stats"]["unique_graphs"] == graphs  # no recompile: batches of 16 and 8
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    eager = gf.DeviceLoader(images, labels, 16, transform=recipe, device="cpu", seed=3)
    theirs = [x for x, _ in eager]
    assert eager.compile_note is None
    assert len(ours) == 3 and all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert "took over at epoch 0, batch 0, " in loader.compile_note  # compiled at construction: in the foreground


# RandomResizedCrop's taps: shrinking antialiased (5 and 7 taps) and growing with plain bicubic (4). Each tap count
# is a compile of its own (seconds, cold): the other tests below take their shapes so as to reuse these (5 and 7
# taps: a height up to twice the output's, a width over twice and up to three times)
RESIZES = [
    ((5, 37, 50), (24, 20), "bilinear", True),
    ((4, 30, 30), (45, 40), "bicubic", False),
]
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.25)


def _by_eager_taps(x, crop, params, flips=(), normalize=None):
    """The taps' arithmetic eager (.taps.taps_resample), from the same boxes, tap counts and flips."""
    box = (params[k] for k in ("top", "left", "height", "width"))
    tables = taps.tables(x, *box, crop.size, crop.antialias, crop.interpolation, flips)
    if normalize is None:
        return taps.taps_resample(x, *tables)
    return taps.taps_resample(x, *tables, *taps.normalizing(*normalize, x.shape[1], crop.size[1], x.device))


@pytest.mark.parametrize(("shape", "out", "mode", "antialias"), RESIZES, ids=lambda v: str(v))
def test_the_fused_resize_with_its_flips_and_normalize_gives_the_eager_taps_bit_for_bit(
    compiled, shape, out, mode, antialias
):
    x = torch.randint(0, 256, (shape[0], 3, *shape[1:]), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    x[0, :, :, : shape[2] // 3] = 255  # white: bicubic overshoots and clamps
    crop = RandomResizedCrop(out, interpolation=mode, antialias=antialias)
    recipe = Compose([crop, RandomHorizontalFlip(), RandomVerticalFlip(), Normalize(MEAN, STD)])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(taps, "_fused_taps", _counted(taps._fused_taps))
        ours = recipe(x, generator=torch.Generator().manual_seed(1))
        assert taps._fused_taps.calls == 1  # the four ops as one compiled call
        alone = crop.apply(x, params := crop.sample(x, torch.Generator().manual_seed(2)))
        assert taps._fused_taps.calls == 2
    assert torch.equal(alone, _by_eager_taps(x, crop, params))
    g = torch.Generator().manual_seed(1)  # the same draws, in the same order: the box, then each flip
    params = crop.sample(x, g)
    flipped = [torch.rand(shape[0], generator=g) < 0.5 for _ in range(2)]
    levels = _by_eager_taps(x, crop, params)  # and the flips and Normalize as their own ops do them
    levels = torch.where(flipped[0].view(-1, 1, 1, 1), levels.flip(3), levels)
    levels = torch.where(flipped[1].view(-1, 1, 1, 1), levels.flip(2), levels)
    assert torch.equal(ours, F.normalize(levels, MEAN, STD))
    flips = [("cols", flipped[0]), ("rows", flipped[1])]
    assert torch.equal(ours, _by_eager_taps(x, crop, params, flips, (MEAN, STD)))  # the tables gpu_check compares


def test_the_fused_resize_is_within_torchvisions_float_kernel(compiled):
    import torchvision.transforms.functional as TF

    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (24, 3, 30, 26), dtype=torch.uint8, generator=g)  # the tap counts of the tests near
    for mode in ("bilinear", "bicubic"):
        crop = RandomResizedCrop((20, 12), interpolation=mode)
        params = crop.sample(x, g)
        ours = crop.apply(x, params)
        tv = torch.stack([
            TF.resized_crop(x[i], *(int(params[k][i]) for k in ("top", "left", "height", "width")), [20, 12],
                            interpolation=TF.InterpolationMode(mode), antialias=True)
            for i in range(len(x))
        ])  # fmt: skip
        diff = (ours.int() - tv.int()).abs()  # the float kernel's contract (tests/augment/test_resize.py)
        assert diff.max() <= 1 and (diff > 0).double().mean() < 0.01, mode


def test_the_fused_resize_falls_back_to_the_ops_one_by_one_with_the_same_draws(compiled, monkeypatch):
    # GPUFEED_COMPILE=0: the flips drawn for the tail serve the flips run after the eager resize
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    x = torch.randint(0, 256, (6, 3, 30, 26), dtype=torch.uint8, generator=torch.Generator().manual_seed(8))
    crop, flip, norm = RandomResizedCrop(20), RandomHorizontalFlip(), Normalize(MEAN, STD)
    ours = Compose([crop, flip, norm])(x, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    one_by_one = norm(flip(crop(x, generator=g), generator=g))
    assert torch.equal(ours, one_by_one)


def test_a_loader_compiles_the_resize_at_construction_and_never_again(compiled, monkeypatch):
    recipe = Compose([RandomResizedCrop((24, 16)), RandomHorizontalFlip(), Normalize(MEAN, STD)])
    images = torch.randint(0, 256, (40, 3, 40, 36), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    fresh = fusion.fused("RandomResizedCrop's resampling", "-", taps._STATIC)(taps.taps_resample)
    monkeypatch.setattr(taps, "_fused_taps", fresh)
    loader = gf.DeviceLoader(images, torch.arange(40), 16, transform=recipe, device="cpu", seed=3)
    assert "RandomResizedCrop's resampling for cpu" in loader.compile_note
    graphs = counters["stats"]["unique_graphs"]
    for epoch in range(2):  # other boxes every batch, batches of 16 and 8: the tap counts come from the shapes
        loader.set_epoch(epoch)
        batches = [x for x, _ in loader]
    assert counters["stats"]["unique_graphs"] == graphs
    assert [tuple(b.shape) for b in batches] == [(16, 3, 24, 16)] * 2 + [(8, 3, 24, 16)]


def test_the_device_path_runs_the_same_fused_resize(compiled):
    x = torch.randint(0, 256, (6, 3, 33, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    crop = RandomResizedCrop((17, 12))
    recipe = Compose([crop, RandomHorizontalFlip(), Normalize(MEAN, STD)])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(taps, "_fused_taps", _counted(taps._fused_taps))
        with device_path():
            on_device_path = recipe(x, generator=torch.Generator().manual_seed(6))
        assert taps._fused_taps.calls == 1  # the three ops as one compiled call on the GPU's path too
    g = torch.Generator().manual_seed(6)  # the same draws: the box, then the flip
    params, flipped = crop.sample(x, g), torch.rand(len(x), generator=g) < 0.5
    assert torch.equal(on_device_path, _by_eager_taps(x, crop, params, [("cols", flipped)], (MEAN, STD)))


MOVES = [  # one recipe, one compile: every padding mode, both flips, a fill per channel then another fill (two
    # maps), Normalize reciprocal; and the crops and flips alone (uint8 out)
    [RandomCrop(30, padding=3, padding_mode="reflect", pad_if_needed=True), RandomCrop(28, padding=1,
     padding_mode="symmetric"), RandomVerticalFlip(), RandomCrop(26, padding=1, padding_mode="edge"),
     RandomCrop(24, padding=(2, 3, 4, 5), fill=(10, 20, 30)), RandomHorizontalFlip(), RandomCrop(22, padding=2,
     fill=7), Normalize(MEAN, STD, reciprocal=True)],
    [RandomCrop(20, padding=2), RandomHorizontalFlip()],
]  # fmt: skip


@pytest.mark.parametrize("ops", MOVES, ids=lambda ops: "+".join(type(o).__name__ for o in ops))
def test_the_fused_crops_flips_and_normalize_on_the_device_path_give_the_host_pixels(compiled, ops):
    recipe = Compose(ops)
    for n, side in ((9, 24), (4, 26)):  # two batch sizes, one compile
        x = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
        with pytest.MonkeyPatch.context() as m:
            m.setattr(moves, "_fused_moves", _counted(moves._fused_moves))
            with device_path():  # one compiled gather, as on a GPU
                ours = recipe(x, generator=torch.Generator().manual_seed(2))
            assert moves._fused_moves.calls == 1
        host = recipe(x, generator=torch.Generator().manual_seed(2))  # the host's cache-sized chunks, eager
        assert ours.dtype == host.dtype and torch.equal(ours, host), (n, side)


AUTO = [TrivialAugmentWide(), RandAugment(), AutoAugment("cifar10"), AugMix(),
        TrivialAugmentWide(fill=(10, 20, 30), interpolation="bilinear")]  # fmt: skip


@pytest.mark.parametrize("op", AUTO, ids=lambda op: type(op).__name__)
def test_the_fused_auto_augment_colour_ops_on_the_device_path_give_the_host_pixels(compiled, op):
    for n, side in ((64, 32), (9, 20)):  # every op drawn; two sizes, one compile
        x = torch.randint(0, 256, (n, 3, side, side), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
        x[0], x[1, 0] = 7, 200  # flat images and channels: AutoContrast's and Equalize's degenerate cases
        with pytest.MonkeyPatch.context() as m:
            m.setattr(auto_fused, "_fused", _counted(auto_fused._fused))
            with device_path():  # every colour op on every sample, one compiled function a round
                ours = op(x, generator=torch.Generator().manual_seed(3))
            assert auto_fused._fused.calls >= 1
        host = op(x, generator=torch.Generator().manual_seed(3))  # sorted by op, each op eager on its slice
        assert torch.equal(ours, host), (n, side)


def test_a_sample_is_resized_the_same_alone_in_a_batch_and_by_a_random_interpolation(compiled):
    # a batch of one runs its eager taps (compiled code specialises on a size of 1): the same pixels as in a batch
    x = torch.randint(0, 256, (6, 3, 30, 26), dtype=torch.uint8, generator=torch.Generator().manual_seed(9))
    for crop in (RandomResizedCrop((20, 12)), RandomResizedCrop((20, 12), interpolation=("bilinear", "bicubic"))):
        params = crop.sample(x, torch.Generator().manual_seed(1))
        whole = crop.apply(x, params)
        for i in range(len(x)):
            alone = crop.apply(x[i : i + 1], {k: v[i : i + 1] for k, v in params.items()})
            assert torch.equal(alone, whole[i : i + 1]), (crop.interpolation, i)
    recipe = Compose([RandomResizedCrop((20, 12)), RandomHorizontalFlip(), Normalize(MEAN, STD)])
    keyed = lambda ids: KeyedDraws(7, 0, torch.tensor(ids))  # noqa: E731  draws keyed by sample id
    whole = recipe(x, generator=keyed(list(range(len(x)))))
    for i in range(len(x)):  # a sample is augmented the same in any batch, alone too
        assert torch.equal(recipe(x[i : i + 1], generator=keyed([i])), whole[i : i + 1]), i
    assert not hasattr(x, "_dynamo_static_indices")  # the compiled op marks an alias of the caller's batch


def test_a_loader_with_random_interpolations_compiles_once(compiled, monkeypatch):
    # bicubic's tap counts on these shapes are those of the bilinear tests above (5 and 7): their compiled function
    recipe = Compose([RandomResizedCrop((24, 16), interpolation=("bilinear", "bicubic")), RandomHorizontalFlip(),
                      Normalize(MEAN, STD)])  # fmt: skip
    images = torch.randint(0, 256, (40, 3, 24, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    fresh = fusion.fused("RandomResizedCrop's resampling", "-", taps._STATIC)(taps.taps_resample)
    monkeypatch.setattr(taps, "_fused_taps", fresh)
    loader = gf.DeviceLoader(images, torch.arange(40), 16, transform=recipe, device="cpu", seed=3)
    assert [len(x) for x, _ in loader] == [16, 16, 8]  # the probe's two samples may each draw their own mode: one
    assert "RandomResizedCrop's resampling for cpu" in loader.compile_note  # sample runs eager; the batches compile
    graphs = counters["stats"]["unique_graphs"]
    for epoch in range(1, 3):
        loader.set_epoch(epoch)
        assert [len(x) for x, _ in loader] == [16, 16, 8]
    assert counters["stats"]["unique_graphs"] == graphs


def test_one_value_normalize_and_gray_images_on_the_device_path_give_the_host_pixels(compiled):
    # MNIST's Normalize((0.1307,), (0.3081,)): its mean and std enter the compiled gather as tensors, not as scalar
    # constants (a GPU compiler would multiply by the reciprocal of one)
    recipe = Compose([RandomCrop(28, padding=2), RandomHorizontalFlip(), Normalize((0.1307,), (0.3081,))])
    x = torch.randint(0, 256, (12, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    with device_path():
        ours = recipe(x, generator=torch.Generator().manual_seed(5))
    assert torch.equal(ours, recipe(x, generator=torch.Generator().manual_seed(5)))


def test_past_its_limit_of_versions_a_fused_op_says_so_and_runs_eager(compiled, monkeypatch):
    # a function of its own (dynamo counts versions per code object: the suite's other tests compiled taps_resample)
    fresh = fusion.fused("RandomResizedCrop's resampling", "-", taps._STATIC)(lambda *a: taps.taps_resample(*a))
    monkeypatch.setattr(taps, "_fused_taps", fresh)
    monkeypatch.setattr(fusion, "VERSIONS", 1)
    x = torch.randint(0, 256, (4, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    RandomResizedCrop(12)(x, generator=torch.Generator().manual_seed(0))  # the one version allowed
    crop = RandomResizedCrop(12, interpolation="bicubic")  # more taps: another version
    params = crop.sample(x, torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match=r"fused RandomResizedCrop's resampling was compiled for 1 kinds"):
        ours = crop.apply(x, params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert torch.equal(crop.apply(x, params), ours)
    with fusion.eager():
        assert torch.equal(ours, crop.apply(x, params))  # the eager taps: the same pixels


def test_benchmarks_launches_counts_a_fused_op_as_the_kernels_it_compiled_to(compiled, monkeypatch):
    # here, not in tests/test_launches.py: this file's tests share one process's compiler start (about 10 s, cold);
    # last in the file: counting resets dynamo, and the tests after it in the process would compile again
    import torch._inductor.config

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from launches import count

    jitter._kernels.cache_clear()  # compiled afresh here: the kernels are counted as they are generated
    x = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    recipe = Compose([ColorJitter(0.4, 0.4), RandomCrop(16, padding=2)])  # two adjustments: a quick compile
    with torch._inductor.config.patch(fx_graph_cache=False):  # a graph from the cache generates no kernels
        fused = count(recipe, x)
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    eager = count(recipe, x)
    jitter._kernels.cache_clear()
    # the mean gray's and the jitter's loops in place of the eager adjustments' whole-batch ops
    assert (
        fused.ops["fused:mean_gray"] > 0 and fused.ops["fused:jitter"] > 0 and eager.ops["where"] > fused.ops["where"]
    )
    assert fused.host_reads == 0 and fused.total < eager.total / 2
