"""The hook in real subprocesses: a script run with watch/site first on its PYTHONPATH, its record read back."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.watch.record import LoaderRecord, ProcessRecord, read_records

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "src" / "gpufeed" / "watch" / "site"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = SCRIPTS / "hook_train.py"
CALL_LINE = next(i for i, t in enumerate(TRAIN.read_text().splitlines(), 1) if t.strip() == "loader = cls(")


def _env(watch_dir: Path | None, extra_path: list[Path] = (), **env: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("GPUFEED_WATCH")}
    paths = [str(SITE)] if watch_dir is not None else []
    out["PYTHONPATH"] = os.pathsep.join(paths + [str(ROOT / "src")] + [str(p) for p in extra_path])
    if watch_dir is not None:
        out["GPUFEED_WATCH_DIR"] = str(watch_dir)
    return out | env


def _run(tmp_path: Path, *args: str, watch: bool = True, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(TRAIN), *args]
    environ = _env(tmp_path if watch else None, **env)
    return subprocess.run(cmd, cwd=SCRIPTS, env=environ, capture_output=True, text=True, timeout=120)


def _record(tmp_path: Path) -> ProcessRecord:
    records = read_records(tmp_path)
    assert len(records) == 1, [r.argv for r in records]
    return records[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_over_a_dataloader_is_recorded_with_its_configuration(tmp_path, workers):
    done = _run(tmp_path, "--workers", str(workers), "--n", "60")
    assert done.returncode == 0, done.stderr
    rec = _record(tmp_path)
    assert (rec.exit, rec.rank, rec.world_size, rec.device, rec.pid > 0) == ("finished", 0, 1, "cpu", True)
    assert rec.argv[1:] == ["--workers", str(workers), "--n", "60"] and rec.notes == []
    [loader] = rec.loaders
    assert loader.built_at == f"hook_train.py:{CALL_LINE}"
    args = ("ds", "batch_size=8", "shuffle=True", "num_workers=a.workers", "**extra")
    assert loader.source == "cls(\n" + "".join(f"        {a},\n" for a in args) + "    )"
    assert (loader.cls, loader.dataset, loader.transform) == ("DataLoader", "Points", "Compose( Scale(factor=2.0) )")
    assert (loader.batch_size, loader.num_workers, loader.pin_memory, loader.persistent_workers) == (8, workers, 0, 0)
    assert (loader.prefetch_factor, loader.sampler, loader.drop_last) == (2 if workers else None, "RandomSampler", 0)
    # 60 samples in batches of 8: 7 of 8 and one of 4, for 2 epochs; one wait and one request per batch
    assert loader.epochs == 2 and loader.samples == ([8] * 7 + [4]) * 2
    assert len(loader.waits) == len(loader.requested) == 16 and all(w >= 0 for w in loader.waits)
    assert loader.requested == sorted(loader.requested) and len(loader.steps()) == 15
    assert loader.device_step_s is None
    assert rec.cores >= 1 and rec.started <= rec.ended


@pytest.mark.parametrize("workers", [0, 2])
def test_the_scripts_results_are_the_same_with_and_without_the_hook(tmp_path, workers):
    watched = _run(tmp_path, "--workers", str(workers))
    plain = _run(tmp_path, "--workers", str(workers), watch=False)
    assert watched.returncode == plain.returncode == 0, watched.stderr + plain.stderr
    assert watched.stdout == plain.stdout and "batches" in plain.stdout and "step 15 loss" in plain.stdout
    assert len(_record(tmp_path).loaders[0].waits) == 16


def test_a_subclass_whose_iter_calls_super_is_counted_once(tmp_path):
    done = _run(tmp_path, "--kind", "subclass", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    [loader] = _record(tmp_path).loaders
    assert (loader.cls, loader.epochs, len(loader.waits), sum(loader.samples)) == ("ShardLoader", 1, 8, 64)


STATEFUL = "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader"


@pytest.mark.parametrize(
    ("args", "cls", "init_of"),
    [
        (("--kind", "own-init"), "OwnLoader", "__main__.OwnLoader"),  # its own __init__ calls super().__init__
        (("--kind", "stateful"), "StatefulDataLoader", STATEFUL),  # never calls DataLoader.__init__
        (("--kind", "stateful", "--workers", "2", "--persistent"), "StatefulDataLoader", STATEFUL),
        (("--workers", "2", "--persistent"), "DataLoader", "torch.utils.data.dataloader.DataLoader"),  # one iterator
    ],
)
def test_every_loader_class_is_found_where_the_script_built_it_with_every_epoch(tmp_path, args, cls, init_of):
    if "stateful" in args:
        pytest.importorskip("torchdata")
    done = _run(tmp_path, *args, "--epochs", "3", "--n", "40")
    assert done.returncode == 0, done.stderr
    rec = _record(tmp_path)
    [loader] = rec.loaders
    assert (loader.cls, loader.init_of, loader.built_at) == (cls, init_of, f"hook_train.py:{CALL_LINE}")
    assert loader.source is not None and loader.source.startswith("cls(\n        ds,")
    assert (loader.epochs, loader.samples, loader.dataset) == (3, [8] * 15, "Points") and rec.notes == []
    assert loader.persistent_workers == ("--persistent" in args)


def test_two_threads_iterating_one_loader_at_once_keep_each_batch_whole_and_the_timeline_in_order(tmp_path):
    # each batch takes 8 x 5 ms in the main process: the two threads' requests overlap
    done = _run(tmp_path, "--threads", "--epochs", "2", "--busy", "0.005")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["samples", "seen", "256"]  # 2 epochs x 2 threads x 64
    [loader] = _record(tmp_path).loaders
    assert loader.epochs == 4 and len(loader.requested) == len(loader.grad) == len(loader.samples) == 32
    assert sorted(loader.samples) == [8] * 32
    t = loader.timeline()
    assert t.requested == sorted(loader.requested) and len(t.steps) == 31 and min(t.steps) >= 0
    span = max(r + w for r, w in zip(loader.requested, loader.waits, strict=True)) - t.requested[0]
    assert sum(t.waits) <= span + 1e-9  # each moment of waiting counted once, however many threads waited


def _sigterm_after_step_3(tmp_path: Path, option: str) -> tuple[subprocess.Popen, str, str]:
    cmd = [sys.executable, str(TRAIN), "--forever", option]
    proc = subprocess.Popen(
        cmd, cwd=SCRIPTS, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step 3 "):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc, out, err


def test_lightnings_graceful_sigterm_installed_after_the_hook_still_decides_the_ending(tmp_path):
    pytest.importorskip("lightning")
    # Lightning's handler composition calls the one it found (the hook's), then its loop ends by itself
    proc, out, err = _sigterm_after_step_3(tmp_path, "--graceful-sigterm")
    assert proc.returncode == 0 and "ended gracefully after SIGTERM" in out, err
    rec = _record(tmp_path)
    assert rec.exit == "interrupted" and len(rec.loaders[0].waits) >= 4


def test_a_scripts_own_handler_that_hands_sigterm_over_gets_the_default_ending(tmp_path):
    # any other handler calling the hook's expects what the hook's predecessor (the default) does: the end
    proc, out, err = _sigterm_after_step_3(tmp_path, "--chained-sigterm")
    assert proc.returncode == -signal.SIGTERM and "SIGTERM: handing over" in out, (proc.returncode, err)
    assert _record(tmp_path).exit == "interrupted"


def test_the_steps_limit_stops_the_script_with_status_0(tmp_path):
    done = _run(tmp_path, "--epochs", "3", GPUFEED_WATCH_STEPS="5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("step 4 loss")  # the 5 batches were trained on, then it stopped
    rec = _record(tmp_path)
    assert (rec.exit, len(rec.loaders[0].waits), rec.side) == ("stopped", 5, None)


def test_a_crash_leaves_a_record_that_says_so(tmp_path):
    done = _run(tmp_path, "--crash-at", "3")
    assert done.returncode == 1 and "RuntimeError: boom at step 3" in done.stderr
    rec = _record(tmp_path)
    assert rec.exit == "crashed: RuntimeError: boom at step 3" and len(rec.loaders[0].waits) == 4


def test_the_scripts_own_exit_status_is_kept(tmp_path):
    done = _run(tmp_path, "--exit-code", "3")
    assert done.returncode == 3, done.stderr
    assert _record(tmp_path).exit == "finished"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_loop_leaves_a_record_and_the_default_ending(tmp_path, signum):
    cmd = [sys.executable, str(TRAIN), "--forever", "--workers", "2"]
    proc = subprocess.Popen(
        cmd, cwd=SCRIPTS, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in proc.stdout:
            if line.startswith("step 5 "):
                break
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signum or (signum == signal.SIGINT and "KeyboardInterrupt" in err), err
    rec = _record(tmp_path)
    assert rec.exit == "interrupted" and len(rec.loaders[0].waits) >= 6


def test_a_users_own_sitecustomize_still_runs(tmp_path):
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    code = "import os, sitecustomize; print(os.environ.get('USER_SITE_RAN'), sitecustomize.__file__)"
    for watch_dir in (tmp_path / "out", None):
        env = _env(watch_dir, extra_path=[user])
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == ["yes", str(user / "sitecustomize.py")], done.stderr


def test_a_script_without_torch_never_imports_it_and_still_writes_a_record(tmp_path):
    code = "import sys; print('torch' in sys.modules, 'gpufeed' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr
    rec = _record(tmp_path)
    assert (rec.loaders, rec.exit, rec.argv) == ([], "finished", ["-c"])


def test_the_sampler_names_the_workers_cpu_apart_and_no_nvml_means_no_gpu(tmp_path):
    done = _run(tmp_path, "--workers", "2", "--epochs", "1", "--busy", "0.05")  # 64 x 50 ms of CPU in 2 workers
    assert done.returncode == 0, done.stderr
    rec = _record(tmp_path)
    assert len(rec.cpu) >= 4 and all(len(s) == 3 for s in rec.cpu)
    assert [t for t, _, _ in rec.cpu] == sorted(t for t, _, _ in rec.cpu)
    # the workers spin, the main process waits for them: their CPU is the children's, not the main process's. A
    # ratio of CPU work, not of shares: the workers spin for 3.2 s of CPU time whatever the load (a spin of wall
    # time did less work on a loaded machine, while the main process's own work stayed: the ratio once fell under 3)
    [loader] = rec.loaders
    start, end = loader.requested[0], loader.requested[-1]  # while the loop ran (not torch's import before it)
    during = [(m, c) for t, m, c in rec.cpu if start <= t <= end]
    assert len(during) >= 2, (rec.cpu, start, end)
    main, children = sum(m for m, _ in during), sum(c for _, c in during)
    assert children > 3 * main and children > 0, (during, rec.cpu)
    if importlib.util.find_spec("pynvml") is None:
        assert rec.gpu == []


def test_a_record_survives_json():
    loader = LoaderRecord(
        0,
        "DataLoader",
        "t.py:3",
        "DataLoader(ds)",
        "Points",
        None,
        8,
        0,
        False,
        False,
        None,
        "SequentialSampler",
        False,
        epochs=1,
        requested=[0.1, 0.2],
        waits=[0.01, 0.02],
        samples=[8, 8],
    )
    rec = ProcessRecord(0, 1, 7, ["t.py"], "cpu", 1.0, 2.0, "finished", [loader], [(0.2, 90.0, 10.0)], 2, [])
    back = ProcessRecord.from_json(rec.to_json())
    assert back == rec and json.loads(rec.to_json())["loaders"][0]["samples"] == [8, 8]
    assert back.loaders[0].steps() == pytest.approx([0.2 - 0.11])


def test_the_timeline_orders_batches_by_request_and_counts_overlapping_waits_once():
    def rec(requested, waits):
        return LoaderRecord(0, "DataLoader", None, None, "D", None, 1, 0, False, False, None, "S", False,
                            requested=requested, waits=waits, samples=[1] * len(waits))  # fmt: skip

    # one iterator: the waits as measured, the steps the gaps between a return and the next request
    t = rec([0.0, 1.0, 3.0], [0.5, 1.0, 0.25]).timeline()
    assert (t.requested, t.waits, t.steps) == ([0.0, 1.0, 3.0], [0.5, 1.0, 0.25], [0.5, 1.0])
    # two threads: B asked at 1 and came back at 2 (appended first), A asked at 0.5 and came back at 3; then C at 4
    t = rec([1.0, 0.5, 4.0], [1.0, 2.5, 0.5]).timeline()
    assert t.requested == [0.5, 1.0, 4.0]
    assert t.waits == [2.5, 0.0, 0.5]  # B's wait lies inside A's: no extra waiting
    assert t.steps == [0.0, 1.0]  # B was asked while A was pending; C one second after A's return


def test_only_training_batches_count_toward_the_stop_and_an_evaluation_pass_is_not_the_main_loader(tmp_path):
    # 4 training batches an epoch, then 12 evaluation batches under no_grad: --steps 6 stops at the 7th training
    # request (in the second epoch), although the evaluation loader served 12 batches by then
    from gpufeed.watch.analyse import report

    script = SCRIPTS / "hook_eval.py"
    env = _env(tmp_path, GPUFEED_WATCH_STEPS="6", GPUFEED_WATCH_SIDE="0")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [w for k in range(6) for w in ("train", str(k))]
    rec = _record(tmp_path)
    train, evaluation = rec.loaders
    assert rec.exit == "stopped" and (train.batches, evaluation.batches) == (6, 12)
    assert train.grad == [True] * 6 and evaluation.grad == [False] * 12
    assert report([rec]).loaders[0].built_at == train.built_at  # the main loader: the training one
