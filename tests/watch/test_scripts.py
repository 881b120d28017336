"""``gpufeed diagnose -- CMD`` end to end: real training scripts (tests/watch/scripts/) run through the command line
in a subprocess, unchanged. Each test checks the verdict, the loader as found, and that the script printed the same
results (losses, batches seen) as when run without gpufeed."""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fakes import hf_image_dataset, image_folder

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT = 300  # seconds; the runs take a few: a hang must fail, not stall the suite
# the changed copy once against the diagnosis run: these tests check that the change runs to the script's end; the
# interleaved runs and their spread are tests/watch/test_verify.py's (six runs a test here cost minutes on 2 cores)
VERIFY_ONCE = ("--steps", "0", "--verify", "--verify-runs", "1")
QUICK = ("--steps", "0", "--no-side")  # let the script finish, no side measurement
# One thread per process: two cores are shared by the tests, and a thread pool waiting on a descheduled thread
# makes a step's time noise rather than work. Both the plain and the diagnosed runs get it.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GPUFEED_WATCH_SIDE_SECONDS": "8"}
# found anywhere in the output: torchrun's ranks share one pipe, and an unbuffered print writes its line and its
# newline apart, so one rank's line can land inside another's
RESULT = re.compile(r"(?:rank \d+ )?(?:step \d+ loss -?\d+\.\d{6}|batches seen \d+)")


def _results(stdout: str) -> list[str]:
    """What the script printed about its training (not the report, nor libraries' messages)."""
    return RESULT.findall(stdout)


@functools.cache
def _plain(*cmd: str) -> tuple[str, ...]:
    """The script's results run without gpufeed (once per command in a test session)."""
    run = subprocess.run(list(cmd), capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    assert run.returncode == 0, run.stderr[-3000:]
    return tuple(_results(run.stdout))


def _diagnose(
    out: Path, cmd: list[str], options: tuple[str, ...] = QUICK, cwd: Path | None = None, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """``gpufeed diagnose OPTIONS --out OUT -- CMD`` (from ``cwd``, ``env`` added), and the report it saved (empty
    if none)."""
    argv = [sys.executable, "-m", "gpufeed", "diagnose", *options, "--out", str(out), "--", *cmd]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env={**ENV, **(env or {})}, cwd=cwd)
    saved = out / "report.json"
    return run, json.loads(saved.read_text()) if saved.exists() else {}


def _python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / script), *args]


def _main(report: dict) -> dict:
    [main] = [loader for loader in report["loaders"] if loader["main"]]
    return main


def _line_of(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _unchanged(run: subprocess.CompletedProcess, cmd: list[str]) -> list[str]:
    """The diagnosed run printed what the plain run printed; returns those results."""
    plain = list(_plain(*cmd))
    assert _results(run.stdout) == plain and plain[-1].startswith("batches seen"), run.stdout[-3000:]
    return plain


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 PNGs of 160 to 232 pixels a side in two classes: decoding and the recipe cost more than the tiny model."""
    root = tmp_path_factory.mktemp("folder") / "train"
    image_folder(root, [(160 + 8 * (i % 10), 168 + 8 * (i % 7)) for i in range(64)])
    return root


@pytest.fixture(scope="module")
def diagnosed_folder(tmp_path_factory: pytest.TempPathFactory, folder: Path):
    """The ImageFolder script at 2 workers diagnosed with the side measurement: one run for the two tests that read
    it (each run costs seconds of imports in two processes)."""
    out = tmp_path_factory.mktemp("diagnosed_folder")
    cmd = _python("imagenet_folder.py", str(folder), "--workers", "2")
    return cmd, *_diagnose(out, cmd, ("--steps", "0"))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_folder_with_the_imagenet_recipe_is_data_bound_and_found_as_built(tmp_path, folder, workers, request):
    cmd = _python("imagenet_folder.py", str(folder), "--workers", str(workers))
    if workers == 2:  # with the side measurement, which the next test needs (asked for here only: under xdist the
        _, run, report = request.getfixturevalue("diagnosed_folder")  # workers=0 case would run it a second time)
        tmp_path = Path(run.args[run.args.index("--out") + 1])
    else:
        run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _unchanged(run, cmd)[-1] == "batches seen 8"  # 64 images in batches of 16, 2 epochs
    assert report["verdict"] == "data-bound" and report["data_wait_fraction"] >= 0.25
    main = _main(report)
    assert main["built_at"].endswith(f"imagenet_folder.py:{_line_of('imagenet_folder.py', 'DataLoader(')}")
    assert (main["cls"], main["dataset"], main["batch_size"], main["num_workers"]) == (
        "DataLoader",
        "ImageFolder",
        16,
        workers,
    )
    assert (main["sampler"], main["pin_memory"], main["persistent_workers"], main["batches"], main["epochs"]) == (
        "RandomSampler",
        False,
        False,
        8,
        2,
    )
    for op in ("RandomResizedCrop(size=(32, 32)", "RandomHorizontalFlip", "ToTensor", "Normalize"):
        assert op in main["transform"]
    assert report["code_change"] == (
        "- DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)\n"
        "+ gf.accelerate(train_ds, batch_size=args.batch_size, shuffle=True)"
    )
    assert "verdict: data-bound" in run.stdout and (tmp_path / "report.md").exists()
    assert (tmp_path / "timeline.png").stat().st_size > 0


def _write_mnist(root: Path, n: int) -> None:
    """``root/MNIST/raw`` in the real idx format (what torchvision downloads, uncompressed): ``n`` random images."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split in ("train", "t10k"):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (raw / f"{split}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())


def test_the_mnist_examples_kwargs_loader_is_changed_by_its_names_verified_and_the_printed_patch_applies(tmp_path):
    # PyTorch's MNIST example builds DataLoader(dataset1,**train_kwargs): the change names the dict's keys as the run
    # had them. Run from a folder that does not hold the script: the printed patch command applies from any other.
    _write_mnist(tmp_path / "data", 512)
    project, elsewhere, third = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "third"
    for folder in (project, elsewhere, third):
        folder.mkdir()
    shutil.copy(SCRIPTS / "mnist_loop.py", project / "mnist_loop.py")
    cmd = [sys.executable, str(project / "mnist_loop.py"), str(tmp_path / "data")]
    run, report = _diagnose(tmp_path / "out", cmd, (*VERIFY_ONCE, "--no-side"), cwd=elsewhere)
    assert run.returncode == 0, run.stderr[-3000:]
    results = _results(run.stdout)  # the script's lines, then the changed copy's (--verify)
    assert results[: results.index("batches seen 16") + 1] == list(_plain(*cmd))
    assert report["verdict"] == "data-bound"
    main = _main(report)
    # on a CPU the example's train_kwargs hold the batch size alone: no shuffle, as torch's SequentialSampler says
    assert (main["dataset"], main["batch_size"], main["num_workers"], main["sampler"]) == (
        "MNIST",
        64,
        0,
        "SequentialSampler",
    )
    assert "ToTensor()" in main["transform"] and "Normalize(mean=(0.1307,), std=(0.3081,))" in main["transform"]
    assert report["code_change"] == (
        "- torch.utils.data.DataLoader(dataset1,**train_kwargs)\n"
        "+ gf.accelerate(dataset1, batch_size=train_kwargs['batch_size'], shuffle=train_kwargs.get('shuffle', False))"
    )
    v = report["verify"]
    assert "error" not in v and v["status"] == 0 and v["after_exit"] == "finished", v
    assert v["before"]["batches"] == v["after"]["batches"] == 16
    [apply] = re.findall(r"\(apply with: (cd .+ && patch -p1 < .+)\)\n", run.stdout)
    assert apply == report["change"]["apply"]
    done = subprocess.run(apply, shell=True, cwd=third, capture_output=True, text=True)  # noqa: S602 - as printed
    assert done.returncode == 0, done.stdout + done.stderr
    text = (project / "mnist_loop.py").read_text()
    assert "import gpufeed as gf" in text.splitlines() and "gf.accelerate(dataset1, batch_size=train_kwargs[" in text
    ast.parse(text)


def test_a_known_wait_fraction_is_measured_within_ten_points(tmp_path):
    # 2 samples of 50 ms a batch, a step of 100 ms: half the time waiting for data. Sleeps this long keep the truth
    # where a loaded machine puts it: each sleep overruns by the wake-up's delay, twice in a wait and once in a step
    # (4 x 10 ms against 40 ms measured 0.55 of a 0.50 truth on a loaded 2-core machine; here 20 ms overruns make 0.54)
    batch, sample_s, step_s = 2, 0.05, 0.1
    args = ("--batch-size", str(batch), "--sample-s", str(sample_s), "--step-s", str(step_s))
    cmd = _python("slow_transform.py", *args)
    run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 0, run.stderr[-3000:]
    _unchanged(run, cmd)
    truth = batch * sample_s / (batch * sample_s + step_s)
    assert report["verdict"] == "data-bound"
    assert abs(report["data_wait_fraction"] - truth) < 0.10, (report["data_wait_fraction"], truth)
    assert _main(report)["transform"] == f"Sleep({sample_s})"


def test_a_loop_with_instant_data_and_a_long_step_is_compute_bound(tmp_path):
    # steps of 100 ms: the 14 steps measured are 1.4 s, so one stall of a busy machine in a wait (about 90 ms once
    # measured 0.21 of the default 30 ms steps here) stays under the 0.1 asserted; a wait is 0.4 ms when quiet
    cmd = _python("compute_bound.py", "--step-s", "0.1")
    run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _unchanged(run, cmd)[-1] == "batches seen 16"
    assert report["verdict"] == "compute-bound" and report["data_wait_fraction"] < 0.1
    main = _main(report)
    assert (main["dataset"], main["batch_size"], main["drop_last"], main["batches"]) == ("TensorDataset", 32, True, 16)


def test_the_steps_limit_stops_the_script_after_that_many_batches_with_status_0(tmp_path):
    cmd = _python("compute_bound.py")
    run, report = _diagnose(tmp_path, cmd, ("--steps", "5", "--no-side"))
    assert run.returncode == 0, run.stderr[-3000:]
    # stopped at its request for a 6th batch: 5 trained on, as without gpufeed, and no more
    assert _results(run.stdout) == list(_plain(*cmd))[:5]
    assert report["exit"] == "stopped" and _main(report)["batches"] == 5


def test_a_crash_at_step_5_still_reports_what_was_measured_and_keeps_the_status(tmp_path):
    cmd = _python("compute_bound.py", "--crash-at", "5")
    run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 1
    assert "RuntimeError: diverged at step 5" in run.stderr  # the script's traceback still shows
    assert _results(run.stdout) == list(_plain(*_python("compute_bound.py")))[:5]
    assert report["exit"] == "crashed: RuntimeError: diverged at step 5"
    assert report["verdict"] == "compute-bound" and _main(report)["batches"] == 6  # the 6th was fetched, then raised


def test_a_script_without_a_dataloader_says_no_loader_was_found(tmp_path):
    cmd = _python("no_loader.py")
    run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _unchanged(run, cmd)[-1] == "batches seen 8"
    assert report["verdict"] == "no loader found" and report["loaders"] == []
    assert "no loader found" in run.stdout


def test_time_limit_interrupts_the_script_and_reports(tmp_path):
    # --time counts from the first batch: a slow start (torch's import on a loaded machine) is not in the 2 s
    cmd = _python("compute_bound.py", "--epochs", "1000")
    run, report = _diagnose(tmp_path, cmd, ("--time", "2", "--no-side"))
    assert run.returncode == 0, run.stderr[-3000:]  # gpufeed stopped it
    assert "--time 2 s reached (counted from the first batch)" in run.stderr
    assert report["exit"] == "interrupted" and report["verdict"] == "compute-bound"
    assert _results(run.stdout)[:3] == list(_plain(*_python("compute_bound.py")))[:3]


def test_the_time_limit_starts_at_the_first_batch_not_at_the_start(tmp_path):
    import time

    from gpufeed.watch.child import run_child as _run
    from gpufeed.watch.record import FIRST_BATCH

    # a script that takes 1.5 s to start (imports, an index to read), then asks for its first batch, then runs on
    code = f"import time; time.sleep(1.5); open({str(tmp_path / FIRST_BATCH)!r}, 'a').close(); time.sleep(60)"
    t0 = time.perf_counter()
    status = _run([sys.executable, "-c", code], {**ENV, "GPUFEED_WATCH_DIR": str(tmp_path)}, 0.5)
    took = time.perf_counter() - t0
    assert status == 0 and 2.0 <= took < 30, took  # 1.5 s before the first batch, then the 0.5 s limit


def test_a_script_that_never_asks_for_a_batch_is_still_bounded_by_the_time_limit(tmp_path, monkeypatch):
    import time

    from gpufeed.watch import child

    monkeypatch.setattr(child, "START_CAP_S", 1.0)  # 600 s for users: a hang before the loop, a script without loader
    t0 = time.perf_counter()
    status = child.run_child(
        [sys.executable, "-c", "import time; time.sleep(60)"], {**ENV, "GPUFEED_WATCH_DIR": str(tmp_path)}, 0.5
    )
    assert status == 0 and 1.4 <= time.perf_counter() - t0 < 30


def test_ctrl_c_reaches_the_script_and_the_report_is_still_made(tmp_path):
    # As at a terminal: the interrupt goes to the whole process group (gpufeed and the script).
    cmd = _python("compute_bound.py", "--epochs", "1000")
    argv = [sys.executable, "-m", "gpufeed", "diagnose", *QUICK, "--out", str(tmp_path), "--", *cmd]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait for the training to be under way
        if line.startswith("step 3 "):
            break
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]  # the script's own status: killed by SIGINT
    assert "interrupted; waiting for the script" in stderr
    assert "gpufeed diagnose: interrupted during the script's run; nothing was changed in your files" in stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit"] == "interrupted" and _main(report)["batches"] >= 4
    assert "verdict: compute-bound" in stdout


def test_an_accelerate_script_is_data_bound_and_its_prepared_loader_found(tmp_path):
    pytest.importorskip("accelerate")
    cmd = _python("accelerate_loop.py")
    run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _unchanged(run, cmd)[-1] == "batches seen 16"
    assert report["verdict"] == "data-bound"
    main = _main(report)  # the loader Accelerate prepared (the one iterated), built on the line that prepared it
    assert main["built_at"].endswith(f"accelerate_loop.py:{_line_of('accelerate_loop.py', 'accelerator.prepare(')}")
    assert (main["dataset"], main["batch_size"], main["num_workers"], main["batches"]) == ("SlowFeatures", 8, 0, 16)
    # the script's own loader is listed too, never iterated
    [own] = [loader for loader in report["loaders"] if not loader["main"]]
    assert (own["batches"], own["sampler"]) == (0, "RandomSampler")
    assert main["sampler"] == "RandomSampler"  # the order Accelerate's shard serves: the script's sampler
    # no rewrite of accelerator.prepare(...): the DataLoader(...) the script passes to it is the one changed, at its
    # own line, and the note says prepare() passes a gpufeed loader through
    assert report["code_change"] == (
        "- DataLoader(SlowFeatures(64, args.sample_s), batch_size=8, shuffle=True)\n"
        "+ gf.accelerate(SlowFeatures(64, args.sample_s), batch_size=8, shuffle=True)"
    )
    assert report["change"]["built_at"] == own["built_at"]
    assert any("prepare() / the Trainer pass a gpufeed loader through" in n for n in report["change"]["notes"])


@pytest.mark.slow
def test_two_torchrun_ranks_on_gloo_are_both_measured_and_the_slowest_named(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [*torchrun, str(SCRIPTS / "ddp_gloo.py")]
    run, report = _diagnose(tmp_path, cmd)
    assert run.returncode == 0, run.stderr[-3000:]
    plain = list(_plain(*cmd))
    for rank in (0, 1):  # the ranks' lines interleave differently from run to run; each rank's are in order
        mine = [line for line in plain if line.startswith(f"rank {rank} ")]
        assert [line for line in _results(run.stdout) if line.startswith(f"rank {rank} ")] == mine
        assert mine[-1] == f"rank {rank} batches seen 8"  # 64 samples, 2 ranks, batches of 8, 2 epochs
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["slowest_rank"] == 1 and report["verdict"] == "data-bound"
    main = _main(report)
    assert (main["sampler"], main["batch_size"], main["batches"]) == ("DistributedSampler", 8, 16)


def test_the_command_goes_after_a_double_dash_and_options_of_a_configuration_are_refused(capsys):
    from gpufeed.cli.main import main

    assert main(["diagnose", "python", "train.py"]) == 2
    assert "put the command to diagnose after --, as in gpufeed diagnose -- python train.py" in capsys.readouterr().err
    assert main(["diagnose", "--num-workers", "2", "--", "python", "train.py"]) == 2
    assert "--num-workers is an option of a gpufeed train configuration" in capsys.readouterr().err
    assert main(["diagnose", "--time", "3"]) == 2
    assert "--time goes with a command to diagnose" in capsys.readouterr().err
    assert main(["diagnose", "--"]) == 2
    assert "nothing after --" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, said",
    [
        (["--steps", "-3"], "--steps -3 is out of range: the batches to measure must be >= 0"),
        (["--time", "0"], "--time 0 is out of range: the seconds after the first batch must be > 0"),
        (["--side-seconds", "-1"], "--side-seconds -1 is out of range: the budget must be > 0 seconds"),
        (["--no-side", "--side-seconds", "5"], "--no-side and --side-seconds contradict each other"),
    ],
)
def test_an_option_out_of_range_is_named_as_such_before_the_command_runs(tmp_path, capsys, options, said):
    from gpufeed.cli.main import main

    assert main(["diagnose", *options, "--out", str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(9)"]) == 2
    err = capsys.readouterr().err
    assert said in err and "an option of a gpufeed train configuration" not in err
    assert not any(tmp_path.iterdir())  # refused before anything ran or was written


def test_a_script_that_does_not_exist_is_said_to_have_never_started(tmp_path, capsys, monkeypatch):
    from gpufeed.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["diagnose", "--out", str(tmp_path / "out"), "--", sys.executable, "trian.py", "--lr", "0.1"]) == 2
    err = capsys.readouterr().err
    assert f"the script 'trian.py' does not exist (looked for from {tmp_path})" in err and "never started" in err
    assert "no loader found" not in err and not (tmp_path / "out").exists()


def test_a_command_that_runs_no_python_keeps_its_status_and_says_nothing_was_measured(tmp_path, capsys):
    from gpufeed.cli.main import main

    assert main(["diagnose", "--out", str(tmp_path), "--", "false"]) == 1
    assert "nothing was measured" in capsys.readouterr().err and not (tmp_path / "report.json").exists()
    assert main(["diagnose", "--out", str(tmp_path), "--", str(tmp_path / "no-such-program")]) == 127
    assert "cannot run" in capsys.readouterr().err


def _predicted(run: subprocess.CompletedProcess, report: dict) -> dict:
    """The report predicts the loop with gf.accelerate, its one-time cost and what it stores (text and JSON)."""
    p = report["prediction"]
    assert p is not None and p["fix"] == "accelerate", (report["side"], run.stdout[-3000:])
    assert p["new_step_s"] > 0 and p["speedup"] > 0 and p["one_time_s"] > 0 and p["memory_bytes"] > 0
    assert re.search(r"\n  with it: +\d+\.\d+ ms a step .*: \d+\.\d+x", run.stdout)
    assert re.search(r"\n  once: +\d+\.\d s before the first batch", run.stdout)
    assert re.search(r"\n  stores: +\d+\.\d+ [KMG]iB in memory", run.stdout)
    return p


def test_an_accelerate_prepared_image_loader_is_measured_predicted_and_its_change_verified(tmp_path, folder):
    # Accelerate's prepare() gives a loader with batch_size=None and a batch sampler: it is measured at the batch
    # sampler's size (8) and order, and the change at the script's own DataLoader(...) runs through prepare()
    pytest.importorskip("accelerate")
    cmd = _python("accelerate_prepare.py", str(folder))
    run, report = _diagnose(tmp_path, cmd, (*VERIFY_ONCE, "--side-seconds", "6"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert report["side"]["batch_size"] == 8 and "accelerate" in report["side"], report["side"]
    _predicted(run, report)
    assert report["code_change"] == (
        "- DataLoader(train_dataset, shuffle=True, batch_size=batch_size, num_workers=args.workers)\n"
        "+ gf.accelerate(train_dataset, batch_size=batch_size, shuffle=True)"
    )
    v = report["verify"]
    assert "error" not in v and v["status"] == 0 and v["after_exit"] == "finished", v
    assert v["before"]["batches"] == v["after"]["batches"] == 16  # 64 images in batches of 8, 2 epochs
    assert v["after"]["loader"].startswith("DeviceLoader at accelerate_prepare.py:")


def test_timms_train_py_with_its_two_loader_dicts_is_changed_by_their_names_and_verified(tmp_path, folder):
    # timm's train.py: create_loader(dataset_train, input_size=..., **common_loader_kwargs, **train_loader_kwargs)
    pytest.importorskip("timm")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SCRIPTS / "timm_train.py", project / "timm_train.py")
    cmd = [sys.executable, "timm_train.py", str(folder), "--no-prefetcher"]
    env = {"GPUFEED_COMPILE": "0"}  # ColorJitter's fused kernel compiles for a minute on a loaded 2-core machine
    run, report = _diagnose(tmp_path / "out", cmd, (*VERIFY_ONCE, "--no-side"), cwd=project, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    main = _main(report)
    assert main["built_at"] == f"timm_train.py:{_line_of('timm_train.py', 'loader_train = create_loader(')}"
    assert (main["dataset"], main["batch_size"], main["built_by"]) == (
        "ImageDataset",
        16,
        "timm.data.loader.create_loader",
    )
    assert report["code_change"].splitlines()[-1] == (
        "+ gf.accelerate(dataset_train, batch_size=train_loader_kwargs['batch_size'], "
        "shuffle=train_loader_kwargs['is_training'], drop_last=train_loader_kwargs['is_training'], "
        'transform=timm.data.create_transform(data_config["input_size"], '
        "is_training=train_loader_kwargs['is_training'], "
        "no_aug=train_loader_kwargs['no_aug'], train_crop_mode=None, scale=train_loader_kwargs['scale'], "
        "ratio=train_loader_kwargs['ratio'], hflip=train_loader_kwargs['hflip'], vflip=train_loader_kwargs['vflip'], "
        "color_jitter=train_loader_kwargs['color_jitter'], color_jitter_prob=None, grayscale_prob=None, "
        "gaussian_blur_prob=None, auto_augment=None, interpolation=train_loader_kwargs['interpolation'], "
        "mean=common_loader_kwargs['mean'], std=common_loader_kwargs['std'], re_prob=train_loader_kwargs['re_prob'], "
        "re_mode=train_loader_kwargs['re_mode'], re_count=train_loader_kwargs['re_count']))"
    )
    assert any("(its ToTensor and Normalize too)" in n for n in report["change"]["notes"])  # use_prefetcher=False
    v = report["verify"]
    assert "error" not in v and v["status"] == 0 and v["after_exit"] == "finished", v
    assert v["before"]["batches"] == v["after"]["batches"] == 8  # drop_last as is_training: 64 / 16, 2 epochs
    assert v["after"]["loader"].startswith("DeviceLoader at timm_train.py:")
    done = subprocess.run(report["change"]["apply"], shell=True, cwd=tmp_path, capture_output=True, text=True)  # noqa: S602
    assert done.returncode == 0, done.stdout + done.stderr
    text = (project / "timm_train.py").read_text()
    assert "import timm.data" in text.splitlines() and "import gpufeed as gf" in text.splitlines()
    ast.parse(text)


def test_torchvisions_classification_reference_with_its_preset_objects_is_accelerated_and_verified(tmp_path, folder):
    # references/classification: ImageFolder(traindir, presets.ClassificationPresetTrain(...)), an object holding
    # self.transforms = T.Compose([...]) (v2, the tensor backend here) whose __call__ applies it
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        (data / split).symlink_to(folder, target_is_directory=True)
    script = SCRIPTS / "classification" / "train.py"
    cmd = [sys.executable, str(script), "--data-path", str(data), "--use-v2", "--backend", "tensor"]
    run, report = _diagnose(tmp_path / "out", cmd, (*VERIFY_ONCE, "--side-seconds", "6"))
    assert run.returncode == 0, run.stderr[-3000:]
    main = _main(report)
    assert main["transform"].startswith("ClassificationPresetTrain holding transforms=Compose( PILToTensor()")
    assert "refused" not in report["side"] and "RandomResizedCrop" in report["side"]["accelerate"]["plan"]
    _predicted(run, report)
    added = report["code_change"].splitlines()[-1]
    assert added == "+ gf.accelerate(dataset, batch_size=args.batch_size, shuffle=True)"
    v = report["verify"]
    assert "error" not in v and v["status"] == 0 and v["after_exit"] == "finished", v
    assert v["before"]["batches"] == v["after"]["batches"] == 8  # 64 images in batches of 16, 2 epochs
    assert v["after"]["loader"].startswith("DeviceLoader at train.py:")


@pytest.fixture(scope="module")
def hf_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``save_to_disk`` dataset (:func:`fakes.hf_image_dataset`: 96 images, two classes)."""
    pytest.importorskip("datasets")
    return hf_image_dataset(tmp_path_factory.mktemp("hf-images") / "data")


def test_a_hugging_face_trainer_is_measured_predicted_and_given_gf_accelerates_batches_verified(tmp_path, hf_images):
    # Trainer.get_train_dataloader builds the loader inside trainer.train() and Accelerate prepares it (batch_size
    # None, a batch sampler): measured at 8, and the change is a line before trainer.train()
    pytest.importorskip("transformers")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SCRIPTS / "hf_trainer.py", project / "hf_trainer.py")
    cmd = [sys.executable, "hf_trainer.py", str(hf_images), "--output-dir", str(tmp_path / "trainer-out")]
    run, report = _diagnose(tmp_path / "out", cmd, (*VERIFY_ONCE, "--side-seconds", "6"), cwd=project)
    assert run.returncode == 0, run.stderr[-3000:]
    results = _results(run.stdout)
    plain = _plain(sys.executable, str(project / "hf_trainer.py"), *cmd[2:])
    assert results[: results.index("batches seen 16") + 1] == list(plain)  # max_steps=16, as without gpufeed
    main = _main(report)
    assert (main["batch_size"], main["built_by"]) == (8, "transformers.trainer.Trainer.train")
    assert report["side"]["batch_size"] == 8 and "accelerate" in report["side"], report["side"]
    _predicted(run, report)
    line = _line_of("hf_trainer.py", "trainer.train()")
    assert report["change"]["built_at"] == f"hf_trainer.py:{line}"
    assert report["code_change"] == (
        "+ trainer.get_train_dataloader = lambda: gf.accelerate(trainer.train_dataset, "
        "batch_size=trainer.args.train_batch_size, shuffle=True, drop_last=trainer.args.dataloader_drop_last, "
        "seed=trainer.args.seed, transform=_train_transforms, batch_keys=('pixel_values', 'labels'))\n"
        "  trainer.train()"
    )
    v = report["verify"]
    assert "error" not in v and v["status"] == 0 and v["after_exit"] == "finished", v
    # 16 steps: Accelerate's shard reads one batch ahead (to know the epoch's end), gpufeed's loader does not
    assert (v["before"]["batches"], v["after"]["batches"]) == (17, 16)
    assert v["after"]["loader"].startswith("DeviceLoader at hf_trainer.py:")
    done = subprocess.run(report["change"]["apply"], shell=True, cwd=tmp_path, capture_output=True, text=True)  # noqa: S602
    assert done.returncode == 0, done.stdout + done.stderr
    text = (project / "hf_trainer.py").read_text().splitlines()
    assert text[line - 1 + 1].strip().startswith("trainer.get_train_dataloader = lambda: gf.accelerate(")  # +1: import
