"""Nothing waits on the compiler (gpufeed.augment.fusion, .background, .compiler; RELIABILITY.md): a loader serves its
first batches with the eager ops while its fused kernels compile in the background, the same pixels whenever they
take over; a compile that fails later is one warning; the environment's facts are checked in milliseconds before any
compile. The compile here is a fake one that blocks on an Event (then runs the function as written), so that nothing
depends on this machine's speed."""

import threading
import warnings

import pytest
import torch

import gpufeed as gf
from gpufeed.augment import (
    ColorJitter,
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    compiler,
    fusion,
    jitter,
    taps,
)
from gpufeed.errors import ConfigError

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.25)
RECIPES = {
    "colorjitter": lambda: Compose(
        [ColorJitter(0.4, 0.4, 0.3, 0.1), RandomCrop(16, padding=2), RandomHorizontalFlip(), Normalize(MEAN, STD)]
    ),  # fmt: skip
    "resize": lambda: Compose([RandomResizedCrop((12, 10)), RandomHorizontalFlip(), Normalize(MEAN, STD)]),
}


class SlowCompile:
    """torch.compile replaced: the compiled function's calls block until :attr:`release` is set, then run the
    function as written (eagerly: its arithmetic, so the pixels of the compiled code on the CPU), or raise
    :attr:`error`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.error: Exception | None = None
        self.compiled: list = []
        self.threads: set[str] = set()

    def __call__(self, fn, **kwargs):
        self.compiled.append(fn)

        def run(*args):
            if not run.called:  # the compile: dynamo's first call
                self.threads.add(threading.current_thread().name)
            run.called = True
            assert self.release.wait(60), "never released"
            if self.error is not None:
                raise self.error
            return fn(*args)

        run.called = False
        return run


@pytest.fixture
def slow(monkeypatch):
    monkeypatch.setenv("GPUFEED_COMPILE", "1")
    monkeypatch.setattr(fusion, "_FAILED", {})
    fake = SlowCompile()
    monkeypatch.setattr(torch, "compile", fake)
    fresh = fusion.fused("RandomResizedCrop's resampling", "-", taps._STATIC)(taps.taps_resample)
    monkeypatch.setattr(taps, "_fused_taps", fresh)
    jitter._kernels.cache_clear()  # fused functions of their own: compiled by the fake
    try:
        yield fake
    finally:
        fake.release.set()
        assert fusion.wait(60)
        jitter._kernels.cache_clear()


def _loader(recipe, **kw):
    images = torch.randint(0, 256, (40, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    return gf.DeviceLoader(images, torch.arange(40), 8, transform=recipe, device="cpu", seed=3, chunk_batches=1, **kw)


@pytest.mark.parametrize("switch", [0, 2], ids=lambda k: f"after-batch-{k}")
@pytest.mark.parametrize("name", RECIPES)
def test_the_eager_ops_serve_while_the_fused_kernels_compile_and_the_epoch_is_the_same(slow, monkeypatch, name, switch):
    loader = _loader(RECIPES[name]())  # construction does not wait: the compile is blocked
    jobs = [job for f in loader.takeover.fused for job in f.kinds.values()]
    assert jobs and all(job.finished is None for job in jobs) and not slow.release.is_set()
    assert "compiling in the background" in loader.compile_note
    assert "compiling in the background" in str(loader.plan or "") or loader.plan is None
    ours = []
    for i, (x, _) in enumerate(loader):
        ours.append(x)
        if i == switch:  # the compile finishes here: later batches run compiled
            assert loader.takeover.at is None
            slow.release.set()
            assert fusion.wait(60)
    assert slow.threads == {"gpufeed-compile"} and slow.compiled  # compiled in the background thread only
    assert loader.takeover.at is not None and loader.takeover.at[:2] == (0, switch + 1)
    assert f"took over at epoch 0, batch {switch + 1}, " in loader.compile_note
    served = sum(f.served for f in loader.takeover.fused)
    assert served == (4 - switch) * len(loader.takeover.fused)  # every fused function, in each batch after it
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    theirs = [x for x, _ in _loader(RECIPES[name]())]
    assert len(ours) == 5 and all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_compile_that_fails_after_batches_were_served_is_one_warning_and_eager_goes_on(slow, monkeypatch):
    slow.error = RuntimeError("the compiler ran out of memory (test)")
    loader = _loader(RECIPES["colorjitter"]())
    first = next(iter(loader))[0]
    slow.release.set()
    assert fusion.wait(60)
    with pytest.warns(
        UserWarning, match=r"could not compile its fused ColorJitter on cpu \(RuntimeError: the compiler ran"
    ):
        rest = [x for x, _ in loader]  # the next epoch: every batch eager, no exception
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        again = [x for x, _ in loader]
    assert "could not compile (RuntimeError: the compiler ran out of memory (test))" in loader.compile_note
    assert fusion.compiling(torch.device("cpu"))  # the op's own failure, not the device's
    monkeypatch.setenv("GPUFEED_COMPILE", "0")
    eager = _loader(RECIPES["colorjitter"]())
    assert torch.equal(first, next(iter(eager))[0])
    eager.set_epoch(1)
    assert all(torch.equal(a, b) for a, b in zip(rest, [x for x, _ in eager], strict=True))
    assert len(again) == 5


@pytest.mark.parametrize(("value", "on"), [("0", False), ("false", False), ("No", False), ("OFF", False),
                                           ("1", True), ("TRUE", True), ("yes", True), (" on ", True)])  # fmt: skip
def test_gpufeed_compile_takes_the_usual_switch_words(monkeypatch, value, on):
    monkeypatch.setenv("GPUFEED_COMPILE", value)
    monkeypatch.setattr(fusion, "_FAILED", {})
    assert compiler.setting() is on and fusion.compiling(torch.device("cpu")) is on


def test_gpufeed_compile_with_another_value_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("GPUFEED_COMPILE", "flase")
    op = ColorJitter(0.4)
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    with pytest.raises(ConfigError, match=r"GPUFEED_COMPILE='flase' is not a switch: set it to 0, false, no or off"):
        op(x, generator=torch.Generator().manual_seed(0))


def _checked_fresh(monkeypatch):
    monkeypatch.setenv("GPUFEED_COMPILE", "1")
    monkeypatch.setattr(fusion, "_FAILED", {})
    monkeypatch.setattr(fusion, "_CHECKED", {})
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: pytest.fail("a compile was attempted"))
    jitter._kernels.cache_clear()


def test_without_a_cpp_compiler_the_eager_ops_serve_at_once_with_one_warning(monkeypatch, tmp_path):
    _checked_fresh(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ anywhere
    op = ColorJitter(0.4, 0.4)
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    params = op.sample(x, torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"fused ColorJitter on cpu \(no C\+\+ compiler: Inductor looks for g\+\+"):
        ours = op.apply(x, params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        op.apply(x, params)
    with fusion.eager():
        assert torch.equal(ours, op.apply(x, params))
    assert not fusion.compiling(x.device) and fusion.compiles() == fusion.compiles()
    jitter._kernels.cache_clear()


def test_an_unwritable_inductor_cache_is_said_as_that_not_as_a_missing_compiler(monkeypatch, tmp_path):
    _checked_fresh(monkeypatch)
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    real = compiler.os.access
    monkeypatch.setattr(compiler.os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    assert compiler.cache_dir() == cache
    op = ColorJitter(0.4, 0.4)
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    with pytest.warns(
        UserWarning, match=r"Inductor's cache folder .*inductor is not writable .*set TORCHINDUCTOR_CACHE_DIR"
    ) as caught:
        op(x, generator=torch.Generator().manual_seed(0))
    assert not any("C++" in str(w.message) for w in caught)
    jitter._kernels.cache_clear()


def test_the_inductor_cache_is_found_without_importing_inductor_and_its_size_counted(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    (tmp_path / "fxgraph").mkdir()
    (tmp_path / "fxgraph" / "a").write_bytes(b"x" * 1000)
    (tmp_path / "b.so").write_bytes(b"y" * 24)
    assert compiler.cache_usage() == (tmp_path, 1024)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert str(compiler.cache_dir()) == default_cache_dir()


def test_the_side_measurement_of_gpufeed_diagnose_compiles_nothing_and_says_so(monkeypatch):
    # the compile (46 s) blew its 20 s budget and was sold as the fix's one-time cost (issue 45)
    import torchvision.transforms as T
    from torch.utils.data import DataLoader

    from gpufeed.watch.side import side_measurement

    from fakes import cifar_like

    monkeypatch.setenv("GPUFEED_COMPILE", "1")
    monkeypatch.setattr(fusion, "_FAILED", {})
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: pytest.fail("compiled in the side measurement"))
    jitter._kernels.cache_clear()
    tf = T.Compose([T.RandomCrop(32, padding=4), T.ColorJitter(0.4, 0.4), T.ToTensor(), T.Normalize(MEAN, STD)])
    out = side_measurement(DataLoader(cifar_like(200, transform=tf), batch_size=32), budget_s=4, device="cpu")
    assert "ColorJitter" in out["accelerate"]["plan"] and "fused kernels" not in out["accelerate"]["plan"]
    assert any("measured with its eager ops" in n and "not part of the one-time cost" in n for n in out["notes"])
    assert fusion.compiles() == [j for j in fusion.compiles() if j.op != "ColorJitter" or j.finished is not None]
    jitter._kernels.cache_clear()


def test_cache_info_names_inductors_cache_and_its_size(monkeypatch, tmp_path, capsys):
    from gpufeed.cli.main import main

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "k.so").write_bytes(b"z" * (3 << 20))
    main(["cache", "info", "--cache-dir", str(tmp_path / "gpufeed")])
    said = capsys.readouterr().out
    inductor = f"compiled kernels (torch Inductor's cache, TORCHINDUCTOR_CACHE_DIR): {tmp_path / 'inductor'}, 3.0 MiB"
    assert inductor in said
