"""``gpufeed diagnose --verify -- CMD`` on scripts shaped as users write them (tests/watch/scripts/): the ImageNet and
DCGAN examples of PyTorch's examples repository, a loader built by timm's ``create_loader``, a Lightning
``DataModule``. Each runs from a user's project folder (a copy of the script beside its data); the report's change
is applied to a copy and run, both runs compared, the diff applies with ``patch -p1``, and the user's folder is left
as it was."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import hf_image_dataset, image_folder, snapshot

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT = 300  # a hang must fail, not stall the suite
ENV_THREADS = {"OMP_NUM_THREADS": "1"}  # two cores shared by the tests: one thread per process


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: the scripts and ``data/train`` (64 PNGs of 160 to 232 pixels a side, two classes) and
    ``data/val`` (16)."""
    root = tmp_path_factory.mktemp("project")
    for name in ("imagenet_example.py", "dcgan_folder.py", "timm_loader.py", "lightning_datamodule.py"):
        shutil.copy(SCRIPTS / name, root / name)
    image_folder(root / "data" / "train", [(160 + 8 * (i % 10), 168 + 8 * (i % 7)) for i in range(64)])
    image_folder(root / "data" / "val", [(176, 184)] * 16, seed=1)
    return root


def _diagnose(
    project: Path, out: Path, options: tuple[str, ...], *cmd: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """``gpufeed diagnose OPTIONS --out OUT -- python CMD`` run from ``project``; the project must be unchanged."""
    before = snapshot(project)
    argv = [sys.executable, "-m", "gpufeed", "diagnose", *options, "--out", str(out), "--", sys.executable, *cmd]
    env = {**_env(), "GPUFEED_CACHE_DIR": str(out / "cache-home")}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=project)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert snapshot(project) == before  # nothing written into the user's folder, by either run
    return run, json.loads((out / "report.json").read_text())


def _env() -> dict[str, str]:
    """The environment of the CLI: one thread per process, and the gpufeed under test first on PYTHONPATH (the
    commands run from the project's folder, where a relative ``PYTHONPATH=src`` would find another gpufeed)."""
    import os

    import gpufeed

    paths = [str(Path(gpufeed.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, **ENV_THREADS, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _verified(report: dict, batches: int, runs: int = 1) -> dict:
    """The verification ran the changed copy to its end with gpufeed's loader, as many batches as before, in
    ``runs`` runs (1: the changed copy once against the diagnosis run), each listed with its side."""
    v = report["verify"]
    assert "error" not in v, v
    assert v["status"] == 0 and v["after_exit"] == "finished"
    assert v["before"]["batches"] == v["after"]["batches"] == batches
    assert v["before"]["loader"].startswith("DataLoader at ") and v["after"]["loader"].startswith("DeviceLoader at ")
    assert v["after"]["step_s"] > 0 and 0 <= v["after"]["wait_fraction"] <= 1
    assert v["cache_bytes"] > 0  # the changed run cached the folder's pixels, in the scratch folder
    sides = ["original", "changed", "changed", "original", "original", "changed"][:runs] if runs > 1 else ["changed"]
    assert [(r["run"], r["side"]) for r in v["runs"]] == list(enumerate(sides, 1))
    assert all(r["batches"] == batches and r["exit"] == "finished" for r in v["runs"])
    assert v["planned"] == runs and v["stopped"] is None and v["interrupted"] is None
    return v


def _applies(project: Path, out: Path, tmp_path: Path, script: str) -> str:
    """``patch -p1 < OUT/fix.diff`` in a copy of the project: the changed script, which parses."""
    copy = tmp_path / "applied"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns("data"))
    done = subprocess.run(["patch", "-p1", "-i", str(out / "fix.diff")], cwd=copy, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (copy / script).read_text()
    ast.parse(text)
    assert "import gpufeed as gf" in text.splitlines()
    return text


def _line_of(script: str, text: str) -> int:
    return next(i for i, line in enumerate((SCRIPTS / script).read_text().splitlines(), 1) if text in line)


def test_the_imagenet_example_gets_its_change_with_sampler_none_verified_against_the_prediction(tmp_path, project):
    out = tmp_path / "out"
    options = ("--verify", "--verify-runs", "4", "--side-seconds", "6")
    run, report = _diagnose(project, out, options, "imagenet_example.py", "data", "-j", "0")
    [main] = [ld for ld in report["loaders"] if ld["main"]]
    assert main["built_at"] == f"imagenet_example.py:{_line_of('imagenet_example.py', 'train_loader = ')}"
    # sampler=train_sampler was None in this run (no --world-size): DataLoader shuffled, and so does the change
    assert report["code_change"].splitlines()[0] == "- torch.utils.data.DataLoader("
    assert report["code_change"].splitlines()[-1] == (
        "+ gf.accelerate(train_dataset, batch_size=args.batch_size, shuffle=True)"
    )
    assert "sampler= was RandomSampler in this run: shuffle=True says the same order" in report["change"]["notes"]
    p = report["prediction"]
    # never above what the wait allows (whether above 1 is the machine's to say: the side measurement and the
    # script's own run are timed apart, and a loaded machine has moved between them)
    assert p["fix"] == "accelerate" and p["speedup"] == pytest.approx(p["step_s"] / p["new_step_s"])
    assert p["speedup"] <= p["bound"] and p["new_wait_s"] > 0
    assert p["steps_per_epoch"] == 4 and p["one_time_s"] > 0 and p["memory_bytes"] > 0
    v = _verified(report, batches=8, runs=4)  # 64 images in batches of 16, 2 epochs; A B B A
    assert v["predicted"] == p and v["before_from"] == "the original runs"
    # each side's median and range over its 2 runs, the gain's range over the 2 pairs, the prediction judged
    steps = {side: sorted(r["step_s"] for r in v["runs"] if r["side"] == side) for side in ("original", "changed")}
    for side, times in steps.items():
        spread = v["spread"][side]
        assert (spread["n"], spread["low"], spread["high"]) == (2, times[0], times[1]) and spread["known"]
        assert spread["median"] == pytest.approx(sum(times) / 2)
    assert v["before"]["step_s"] == v["spread"]["original"]["median"]
    gain = v["spread"]["gain"]
    assert gain["pairs"] == 2 and gain["low"] <= gain["high"]
    assert gain["median"] == pytest.approx(v["spread"]["original"]["median"] / v["spread"]["changed"]["median"])
    agreement = v["agreement"]
    assert agreement["verdict"] in ("agrees", "disagrees", "inconclusive") and agreement["spread_known"]
    assert agreement["predicted_s"] == p["new_step_s"] and agreement["tolerance"] >= 0.10
    # the one-time cost as the changed runs paid it, timed inside them: importing gf.accelerate and its call
    once = v["after"]["one_time"]
    assert once["import_s"] > 0 and once["accelerate_s"] > 0 and v["after"]["one_time_s"] == sum(once.values())
    assert "  one-time cost: " in run.stdout
    assert "verified on this script" in run.stdout and "rest of the step" in run.stdout
    assert "4 runs, the original (A) and the changed copy (B) interleaved: A B B A" in run.stdout
    assert "measured gain: " in run.stdout and " over 2 pairs" in run.stdout
    table = run.stdout.split("  run  script")[1].splitlines()[1:5]
    assert [line.split()[:2] for line in table] == [["1", "original"], ["2", "changed"], ["3", "changed"],
                                                     ["4", "original"]]  # fmt: skip
    worth = next(line for line in run.stdout.splitlines() if line.startswith("worth doing: "))
    assert "verified on this script: " in worth and " over 2 pairs; " in worth
    kept = sorted(p.name for p in (out / "records-verify").iterdir())  # each run's raw records are kept
    assert kept == ["run-1-original", "run-2-changed", "run-3-changed", "run-4-original"]
    text = _applies(project, out, tmp_path, "imagenet_example.py")
    assert "gf.accelerate(train_dataset, batch_size=args.batch_size, shuffle=True)" in text
    assert "val_loader = torch.utils.data.DataLoader(" in text  # the evaluation loader is left as it was


def test_with_two_workers_the_same_change_drops_them_and_pinned_memory(tmp_path, project):
    out = tmp_path / "out"
    options = ("--verify", "--verify-runs", "1", "--no-side")
    _, report = _diagnose(project, out, options, "imagenet_example.py", "data", "-j", "2")
    [main] = [ld for ld in report["loaders"] if ld["main"]]
    assert (main["num_workers"], main["pin_memory"], main["sampler"]) == (2, True, "RandomSampler")
    assert report["code_change"].splitlines()[-1] == (
        "+ gf.accelerate(train_dataset, batch_size=args.batch_size, shuffle=True)"
    )
    assert report["prediction"] is None  # --no-side: nothing to predict from, the verification still runs
    _verified(report, batches=8)
    _applies(project, out, tmp_path, "imagenet_example.py")


def test_the_dcgan_example_at_module_level_is_changed_and_verified(tmp_path, project):
    out = tmp_path / "out"
    cmd = ("dcgan_folder.py", "--dataroot", "data/train", "--workers", "0")
    run, report = _diagnose(project, out, ("--verify", "--verify-runs", "2", "--no-side"), *cmd)
    assert report["code_change"] == (
        "- torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True, num_workers=int(opt.workers))\n"
        "+ gf.accelerate(dataset, batch_size=opt.batchSize, shuffle=True)"
    )
    v = _verified(report, batches=8, runs=2)  # one pair: A B
    assert v["predicted"] is None and "no prediction to compare with" in run.stdout
    assert v["spread"]["gain"]["pairs"] == 1 and not v["spread"]["changed"]["known"] and v["agreement"] is None
    assert "one pair was run (--verify-runs 2): the spread is unknown" in run.stdout
    _applies(project, out, tmp_path, "dcgan_folder.py")


def test_timms_create_loader_is_changed_at_the_scripts_call_and_verified(tmp_path, project):
    pytest.importorskip("timm")
    out = tmp_path / "out"
    run, report = _diagnose(
        project, out, ("--verify", "--verify-runs", "1", "--no-side"), "timm_loader.py", "data/train"
    )
    [main] = [ld for ld in report["loaders"] if ld["main"]]
    assert main["built_at"] == f"timm_loader.py:{_line_of('timm_loader.py', 'loader_train = create_loader(')}"
    assert report["code_change"].splitlines()[-1] == (
        "+ gf.accelerate(dataset_train, batch_size=args.batch_size, shuffle=True, drop_last=True, "
        "transform=timm.data.create_transform((3, args.size, args.size), is_training=True, scale=(0.08, 1.0), "
        'hflip=0.5, interpolation="bilinear", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))'
    )
    assert any("(its ToTensor and Normalize too)" in n for n in report["change"]["notes"])  # use_prefetcher=False
    _verified(report, batches=8)  # drop_last=True as create_loader's is_training: 64 / 16, 2 epochs
    text = _applies(project, out, tmp_path, "timm_loader.py")
    assert "import timm.data" in text.splitlines()


def test_a_lightning_datamodules_train_dataloader_is_changed_and_verified(tmp_path, project):
    pytest.importorskip("lightning")
    out = tmp_path / "out"
    options = ("--verify", "--verify-runs", "1", "--no-side")
    _, report = _diagnose(project, out, options, "lightning_datamodule.py", "data/train")
    assert report["verdict"] == "data-bound"
    [main] = [ld for ld in report["loaders"] if ld["main"]]
    line = _line_of("lightning_datamodule.py", "return DataLoader(")
    assert main["built_at"] == f"lightning_datamodule.py:{line}" and main["dataset"] == "ImageFolder"
    assert report["code_change"] == (
        "- DataLoader(self.train_set, batch_size=16, shuffle=True, num_workers=self.workers)\n"
        "+ gf.accelerate(self.train_set, batch_size=16, shuffle=True)"
    )
    _verified(report, batches=8)  # the Trainer iterated gpufeed's loader for both epochs
    _applies(project, out, tmp_path, "lightning_datamodule.py")


@pytest.fixture(scope="module")
def hf_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: hf_set_transform.py and ``data`` (:func:`fakes.hf_image_dataset`: 96 images, two classes)."""
    pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("hf-project")
    shutil.copy(SCRIPTS / "hf_set_transform.py", root / "hf_set_transform.py")
    hf_image_dataset(root / "data")
    return root


def test_a_hugging_face_set_transform_loop_gets_the_recipe_as_transform_and_keeps_its_dict_batches(
    tmp_path, hf_project
):
    out = tmp_path / "out"
    options = ("--verify", "--verify-runs", "1", "--side-seconds", "6")
    run, report = _diagnose(hf_project, out, options, "hf_set_transform.py", "data")
    [main] = [ld for ld in report["loaders"] if ld["main"]]
    assert main["dataset"] == "Dataset" and main["transform"].startswith(
        "preprocess (set by set_transform/with_transform), applying Compose( RandomResizedCrop(size=(32, 32)"
    )
    assert report["code_change"] == (
        "- DataLoader(ds, batch_size=32, shuffle=True, collate_fn=collate_fn, num_workers=args.workers)\n"
        "+ gf.accelerate(ds, batch_size=32, shuffle=True, transform=train_tf, batch_keys=('pixel_values', 'labels'))"
    )
    side = report["side"]
    assert "refused" not in side and "replaced by the recipe given" in side["accelerate"]["plan"]
    v = _verified(report, batches=9)  # 96 rows in batches of 32, 3 epochs; the loop read the same dict keys
    assert v["predicted"] == report["prediction"]
    text = _applies(hf_project, out, tmp_path, "hf_set_transform.py")
    assert "ds.set_transform(preprocess)" in text  # left as it was: transform= replaces it


# A loop that blocks at a marked point until it is interrupted: in the verification's first run (MARK_AT=verify),
# or in the side measurement (MARK_AT=side: the dataset's items past the loop's 5 batches of 4 are the side
# measurement's). The marker file is the test's signal that the point is reached: no sleep stands for it.
INTERRUPTIBLE = """
import os, time
import torch
from torch.utils.data import DataLoader, Dataset

MARK, AT = os.environ["MARK"], os.environ["MARK_AT"]
served = 0

class Items(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        global served
        served += 1
        if AT == "side" and served > 20:
            open(MARK, "a").close()
            time.sleep(0.05)
        return torch.zeros(3, 8, 8), i % 2

loader = DataLoader(Items(), batch_size=4, shuffle=True)
for step, (x, y) in enumerate(loader):
    if AT == "verify" and step == 2 and os.environ.get("GPUFEED_VERIFY_RUN") == "1":
        open(MARK, "a").close()
        while True:
            time.sleep(0.05)
"""


@pytest.mark.parametrize(
    ("at", "options", "what"),
    [
        ("verify", ("--verify", "--verify-runs", "2", "--no-side"), "the verification, run 1 of 2 (the original"),
        ("side", ("--side-seconds", "60"), "the side measurement (the script's steps were measured)"),
    ],
)
def test_ctrl_c_during_the_verification_or_the_side_measurement_exits_130_and_says_what_it_stopped(
    tmp_path, at, options, what
):
    import os
    import signal
    import time

    project, out, mark = tmp_path / "project", tmp_path / "out", tmp_path / "mark"
    project.mkdir()
    (project / "train.py").write_text(INTERRUPTIBLE)
    before = snapshot(project)
    argv = [sys.executable, "-m", "gpufeed", "diagnose", "--steps", "5", *options, "--out", str(out), "--",
            sys.executable, "train.py"]  # fmt: skip
    env = {**_env(), "MARK": str(mark), "MARK_AT": at, "GPUFEED_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while not mark.exists():  # the marked point, or the CLI ended without reaching it
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the marked point was never reached"
        time.sleep(0.05)
    if at == "verify":  # as at a terminal: gpufeed and the script both get it (the old code went on: status 0)
        os.killpg(proc.pid, signal.SIGINT)
    else:  # gpufeed alone, as when it runs without a terminal: it passes it on
        os.kill(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, (stdout[-3000:], stderr[-3000:])
    assert f"gpufeed diagnose: interrupted during {what}" in stderr
    assert "nothing was changed in your files" in stderr
    assert snapshot(project) == before
    report = json.loads((out / "report.json").read_text())  # what was measured is still reported
    assert report["verdict"] in ("data-bound", "compute-bound")
    if at == "verify":
        assert report["verify"]["interrupted"] == "run 1 of 2 (the original script)"
        assert report["verify"]["error"] == "no run was made (interrupted before the first)"
        assert "verified: not run: no run was made" in stdout
    else:
        assert report["side"] is None and report["verify"] is None


@pytest.mark.parametrize(
    "options, said",
    [
        (["--verify", "--verify-runs", "3"], "--verify-runs 3 is out of range: give an even number of runs"),
        (["--verify", "--verify-runs", "0"], "--verify-runs 0 is out of range"),
        (["--verify", "--verify-seconds", "0"], "--verify-seconds 0 is out of range: the verification's budget"),
        (["--verify-runs", "4"], "--verify-runs 4 goes with --verify: gpufeed diagnose --verify --verify-runs"),
        (["--verify-seconds", "60"], "--verify-seconds 60 goes with --verify"),
    ],
)
def test_a_verification_option_out_of_range_or_without_verify_is_refused_before_the_command_runs(
    tmp_path, capsys, options, said
):
    from gpufeed.cli.main import main

    assert main(["diagnose", *options, "--out", str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(9)"]) == 2
    assert said in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything ran or was written
    assert main(["diagnose", *options[-2:]]) == 2  # a configuration of gpufeed train has no verification
    assert f"{options[-2]} goes with a command to diagnose" in capsys.readouterr().err


def _run_figures(number, side, step, others=0.0, workers=0):
    return {"run": number, "side": side, "status": 0, "seconds": 4.0, "exit": "stopped", "step_s": step,
            "workers": workers if side == "original" else 0,
            "rest_s": step / 2, "wait_fraction": 0.5, "img_s": 32 / step, "first_batch_s": 2.0, "batches": 100,
            "loader": "DataLoader at train.py:9", "one_time_s": None, "one_time": {},
            "machine": {"percent": 90.0, "load": 2 + 2 * others, "cores": 2.0, "others": others},
            "fixed": side == "changed"}  # fmt: skip


def test_the_verification_names_the_busy_runs_and_the_wide_spread_they_made():
    from gpufeed.watch.verify import summarise
    from gpufeed.watch.verify_text import verify_text

    steps = [(1, "original", 0.030, 0.0), (2, "changed", 0.024, 0.6), (3, "changed", 0.018, 0.45),
             (4, "original", 0.031, 0.05)]  # fmt: skip
    v = summarise([_run_figures(*s) for s in steps], None, {"new_step_s": 0.019, "speedup": 1.6, "rest_s": 0.01})
    v.update(command=["train.py"], planned=4, budget_s=600.0, stopped=None, interrupted=None)
    assert v["busy"] == [2, 3] and v["spread"]["changed"]["relative"] == pytest.approx(0.006 / 0.021)
    assert v["spread"]["gain"] == pytest.approx({"median": 0.0305 / 0.021, "low": 0.030 / 0.024,
                                                 "high": 0.031 / 0.018, "pairs": 2})  # fmt: skip
    # the busy runs widened the range until it holds the original's time too: the runs cannot tell
    assert v["agreement"]["verdict"] == "inconclusive" and v["agreement"]["tolerance"] == pytest.approx(0.006 / 0.021)
    text = "\n".join(verify_text(v))
    assert "the machine was busy: other processes used up to 1.2 of 2 cores during runs 2 and 3 (load up to 3.2); " \
           "the spread is wide (29%)" in text  # fmt: skip
    assert "inconclusive: 19.00 ms a step predicted lies within the changed runs' 18.00 ms to 24.00 ms" in text


def test_a_verification_stopped_by_a_failed_run_or_a_ctrl_c_lists_the_runs_it_made():
    from gpufeed.watch.verify import summarise
    from gpufeed.watch.verify_text import verify_text

    done = [_run_figures(1, "original", 0.03), _run_figures(2, "changed", 0.02)]
    failed = {"run": 3, "side": "changed", "status": 1, "seconds": 2.0, "error": "the changed script wrote no record"}
    v = summarise([*done, failed], None, None)
    assert v["error"] == "run 3 (changed): the changed script wrote no record" and len(v["runs"]) == 3
    lines = verify_text(v)
    assert lines[0] == "verified: not completed: run 3 (changed): the changed script wrote no record"
    assert [line.split()[:2] for line in lines[2:4]] == [["1", "original"], ["2", "changed"]]
    stopped = summarise(done, None, None)  # a Ctrl-C during run 3: the first pair is reported, its spread unknown
    stopped.update(command=["train.py"], planned=6, budget_s=600.0, stopped=None, interrupted="run 3 of 6 (x)")
    text = "\n".join(verify_text(stopped))
    assert "interrupted (Ctrl-C) during run 3 of 6 (x): 2 of 6 runs measured" in text
    assert "2 run(s) were made: the spread is unknown" in text and stopped["spread"]["gain"]["pairs"] == 1


def test_a_changed_copy_that_never_read_gf_accelerates_loader_is_not_verified():
    # a change that did not reach the loop (a Trainer rebuilt by the added line): the runs compare one loader with
    # itself, and their noise is no gain (seen: "1.71x, agrees with the prediction")
    from gpufeed.watch.verify import summarise
    from gpufeed.watch.verify_text import verify_text

    steps = [(1, "original", 0.030), (2, "changed", 0.018), (3, "changed", 0.020), (4, "original", 0.031)]
    runs = [_run_figures(*s) for s in steps]
    runs[2]["fixed"] = False
    v = summarise(runs, None, {"new_step_s": 0.019, "speedup": 1.6, "rest_s": 0.01})
    assert v["error"] == (
        "run 3 (changed) read DataLoader at train.py:9, no loader of gf.accelerate: the change did not reach the "
        "loop, so the runs compare the script's loader with itself"
    )
    assert "spread" not in v and "agreement" not in v and len(v["runs"]) == 4
    lines = verify_text(v)
    assert lines[0] == f"verified: the change did not take effect: {v['error']}"
    assert [line.split()[:2] for line in lines[2:6]] == [[str(n), side] for n, side, _ in steps]


@pytest.mark.parametrize(
    ("workers", "why"), [(0, ""), (2, " (the script's 2 loader workers no longer compete with it)")]
)
def test_a_rest_of_the_step_that_shrank_is_put_down_to_the_workers_only_where_the_script_had_some(workers, why):
    from gpufeed.watch.verify import summarise
    from gpufeed.watch.verify_text import verify_text

    steps = [(1, "original", 0.030), (2, "changed", 0.010), (3, "changed", 0.0101), (4, "original", 0.0302)]
    v = summarise([_run_figures(*s, workers=workers) for s in steps], None, {"new_step_s": 0.025, "speedup": 1.2,
                                                                            "rest_s": 0.015})  # fmt: skip
    v.update(command=["train.py"], planned=4, budget_s=600.0, stopped=None, interrupted=None)
    assert v["agreement"]["verdict"] == "disagrees" and v["before"]["workers"] == workers
    [line] = [x for x in verify_text(v) if x.startswith("  disagrees")]
    assert line.endswith(f"the rest of the step went from 15.05 ms to 5.03 ms, which the prediction holds fixed{why}")
