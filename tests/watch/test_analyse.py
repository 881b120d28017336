"""report(): the verdict, the loaders, the ranks and the fix from synthetic records whose timings are known."""

import json

import pytest

from gpufeed.diagnose import DATA_BOUND_FRACTION
from gpufeed.watch.analyse import NO_LOADER, TOO_FEW, report
from gpufeed.watch.record import LoaderRecord, ProcessRecord

SOURCE = "DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=2)"


def _loader(waits, steps, *, id=0, built_at="train.py:20", source=SOURCE, batch=32, workers=2, start=1.0):
    """A loader whose batch k waited ``waits[k]`` and was followed by a step of ``steps[k]`` seconds."""
    requested, t = [], start
    for w, s in zip(waits, steps, strict=True):
        requested.append(t)
        t += w + s
    return LoaderRecord(
        id, "DataLoader", built_at, source, "CIFAR10", "Compose(RandomCrop(size=(32, 32)), ToTensor())", batch,
        workers, False, False, 2 if workers else None, "RandomSampler", False, epochs=1, requested=requested,
        waits=list(waits), samples=[batch] * len(waits),
    )  # fmt: skip


def _uniform(n, wait, step, first_wait=2.0, **kw):
    return _loader([first_wait] + [wait] * (n - 1), [step] * n, **kw)


def _process(loaders, *, rank=0, world=1, device="cpu", exit="stopped", cpu=(), gpu=(), side=None, cores=2,
             machine=()):  # fmt: skip
    return ProcessRecord(rank, world, 1000 + rank, ["train.py", "--epochs", "1"], device, 0.0, 60.0, exit, loaders,
                         list(cpu), cores, list(gpu), side, machine=list(machine))  # fmt: skip


ACCELERATED = {
    "samples": 384,
    "batch_size": 32,
    "device": "cpu",
    "notes": [],
    "accelerate": {"plan": "storage:  in memory\nbatched:  RandomCrop", "img_s": 9000.0, "build_s": 0.4},
    "script_loader": {"img_s": 1500.0, "settings": {"batch_size": 32, "num_workers": 2}},
    "seconds": 3.0,
}
REFUSED = {
    "samples": 384,
    "batch_size": 32,
    "device": "cpu",
    "notes": [],
    "refused": {"error": "UnsupportedTransformError", "reason": "Lambda() is opaque"},
    "script_loader": {"img_s": 1500.0, "settings": {"batch_size": 32, "num_workers": 2}},
    "tuned": {"kwargs": {"num_workers": 2, "pin_memory": False}, "img_s": 2400.0, "speedup": 1.6, "budget_s": 15},
    "seconds": 9.0,
}


def test_a_loop_waiting_three_quarters_of_the_time_is_data_bound_at_that_fraction():
    r = report([_process([_uniform(40, wait=0.03, step=0.01)])])
    assert r.verdict == "data-bound"
    # the first batch's 2 s start-up is left out: counted, the fraction would be (2 + 38 * 0.03) / (2 + 38 * 0.04)
    assert r.data_wait_fraction == pytest.approx(0.75, abs=1e-9)
    assert r.diagnosis.steps == 38 and r.diagnosis.wall_s == pytest.approx(38 * 0.04)
    text = str(r)
    assert "verdict: data-bound" in text and "75.0% of wall time" in text
    assert "first batch (2.00 s waiting, the loader's start-up included)" in text


def test_a_loop_that_barely_waits_is_compute_bound_with_nothing_to_fix():
    r = report([_process([_uniform(30, wait=0.001, step=0.05)])])
    assert r.verdict == "compute-bound" and r.data_wait_fraction == pytest.approx(0.001 / 0.051)
    text = str(r)
    assert r.diagnosis.findings == [] and "no findings" not in text  # the worth line says it, with its figure
    worth = 1 / (1 - r.data_wait_fraction)
    assert text.splitlines()[-1] == (
        f"worth doing: the data side is worth at most {worth:.2f}x to this loop (it waits 2% of the time): the step "
        "itself is the cost"
    )
    assert "code change" not in str(r)


def test_the_verdict_flips_at_gf_diagnoses_threshold():
    step = 0.04
    just_under = DATA_BOUND_FRACTION * step / (1 - DATA_BOUND_FRACTION) * 0.98
    assert report([_process([_uniform(20, wait=just_under, step=step)])]).verdict == "compute-bound"
    assert report([_process([_uniform(20, wait=just_under / 0.98 * 1.02, step=step)])]).verdict == "data-bound"


def test_a_gpu_busy_under_60_percent_while_the_steps_ran_is_launch_bound():
    ld = _uniform(30, wait=0.001, step=0.05)  # the measured steps run from t = 3.05 to 4.478
    idle = [(3.1 + 0.2 * i, 30.0, 900.0) for i in range(7)]
    before = [(0.5, 100.0, 500.0)]  # outside the measured steps: not counted
    r = report([_process([ld], device="cuda:0", gpu=before + idle)])
    assert r.verdict == "launch-bound" and r.diagnosis.gpu_busy_fraction == pytest.approx(0.30)
    assert len(r.diagnosis.gpu_timeline) == 7
    busy = [(t, 95.0, m) for t, _, m in idle]
    assert report([_process([ld], device="cuda:0", gpu=busy)]).verdict == "compute-bound"


def test_without_gpu_samples_launch_bound_is_not_guessed_and_the_report_says_so():
    r = report([_process([_uniform(30, wait=0.001, step=0.05)], device="cuda:0")])
    assert r.verdict == "compute-bound" and r.diagnosis.gpu_busy_fraction is None
    assert any("launch-bound cannot be told apart" in n for n in r.notes)


def test_on_the_cpu_the_contention_check_is_said_not_made_and_the_cpu_use_is_given():
    ld = _uniform(30, wait=0.001, step=0.05)
    cpu = [(3.1 + 0.2 * i, 100.0, 95.0) for i in range(7)]  # 1.95 of 2 cores while the steps ran
    r = report([_process([ld], cpu=cpu)])
    assert r.cpu == {"main_percent": 100.0, "workers_percent": 95.0, "cores": 2.0, "saturated": 1.0}
    assert [f.kind for f in r.diagnosis.findings] == ["cpu-saturated"]
    assert any(n.startswith("CPU contention was not checked") for n in r.notes)
    assert "2 usable cores saturated" in str(r)
    calm = report([_process([ld], cpu=[(t, 60.0, 20.0) for t, _, _ in cpu])])
    assert calm.cpu["saturated"] == 0.0 and calm.diagnosis.findings == []


def test_the_main_loader_is_the_one_iterated_most_and_every_loader_is_listed():
    val = _uniform(10, wait=0.001, step=0.002, id=1, built_at="train.py:31", source="DataLoader(val_ds, 64)")
    train = _uniform(50, wait=0.03, step=0.01, id=0, start=100.0)
    never = _loader([], [], id=2, built_at="train.py:40")
    r = report([_process([val, train, never])])
    assert [s.name for s in r.loaders] == ["train.py:20", "train.py:31", "train.py:40"]
    assert [s.main for s in r.loaders] == [True, False, False]
    assert [s.batches for s in r.loaders] == [50, 10, 0]
    assert r.loaders[0].img_s == pytest.approx(32 / 0.04)
    assert r.loaders[1].wait_fraction == pytest.approx(1 / 3) and r.loaders[2].wait_fraction is None
    assert r.verdict == "data-bound"
    text = str(r)
    assert "* train.py:20" in text and "  train.py:31" in text
    assert "the main loader, as found (train.py:20, DataLoader):" in text
    assert "batch_size=32 num_workers=2 pin_memory=False" in text and "sampler=RandomSampler" in text


def test_two_ranks_one_slow_the_slow_rank_gives_the_verdict_and_is_named():
    fast = _process([_uniform(30, wait=0.002, step=0.05)], rank=0, world=2)
    slow = _process([_uniform(30, wait=0.04, step=0.02)], rank=1, world=2)
    r = report([slow, fast])
    assert r.world_size == 2 and r.slowest_rank == 1
    assert r.verdict == "data-bound" and r.data_wait_fraction == pytest.approx(0.04 / 0.06)
    assert [(x.rank, x.batches) for x in r.ranks] == [(0, 30), (1, 30)]
    assert r.ranks[0].wait_fraction == pytest.approx(0.002 / 0.052)
    assert r.ranks[1].wait_s == pytest.approx(28 * 0.04)
    assert r.loaders[0].batches == 60  # the same loader (creation order, call site) on both ranks
    assert "slowest rank: 1" in str(r)


def test_a_crashed_script_says_so_first_and_reports_what_was_measured():
    rec = _process([_uniform(5, wait=0.03, step=0.01)], exit="crashed: ValueError: step 5 went wrong")
    r = report([rec])
    first = str(r).splitlines()[1]
    assert first.startswith("!! the script crashed (ValueError: step 5 went wrong)")
    assert r.exit.startswith("crashed") and r.verdict == "data-bound" and r.diagnosis.steps == 3


def test_an_interrupted_rank_is_reported_over_a_stopped_one():
    recs = [
        _process([_uniform(5, 0.03, 0.01)], rank=0, world=2, exit="stopped"),
        _process([_uniform(5, 0.03, 0.01)], rank=1, world=2, exit="interrupted"),
    ]
    assert report(recs).exit == "interrupted" and "!! the script was interrupted" in str(report(recs))


def test_a_script_that_iterates_no_loader_gets_a_clear_report():
    r = report([_process([], exit="finished")])
    assert r.verdict == NO_LOADER and r.diagnosis is None and r.data_wait_fraction is None
    assert "no DataLoader was iterated" in str(r)
    built = report([_process([_loader([], [], built_at="train.py:7")], exit="finished")])
    assert built.verdict == NO_LOADER and "built but never iterated: train.py:7" in str(built)


def test_two_batches_are_too_few_for_a_verdict():
    r = report([_process([_uniform(2, 0.03, 0.01)], exit="crashed: RuntimeError: x")])
    assert r.verdict == TOO_FEW and r.diagnosis is None
    assert any("a verdict needs 3" in n for n in r.notes)


def test_a_data_bound_report_gives_the_measured_fix_and_the_code_change():
    r = report([_process([_uniform(30, 0.03, 0.01)], side=ACCELERATED)])
    assert r.code_change == (
        "- DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=2)\n"
        "+ gf.accelerate(train_ds, batch_size=32, shuffle=True)"
    )
    text = str(r)
    assert "the loader alone: gf.accelerate 9000 img/s" in text
    assert "the script's DataLoader settings 1500 img/s" in text
    assert "storage:  in memory" in text  # the plan
    assert "    + gf.accelerate(train_ds, batch_size=32, shuffle=True)" in text
    assert [f.kind for f in r.diagnosis.findings] == ["accelerate"]
    # the loop, not the loader: a step of 10 ms + 30 ms waiting becomes 10 ms + 32 / 9000 s making the batch
    p = r.prediction
    assert p["fix"] == "accelerate" and p["new_step_s"] == pytest.approx(0.01 + 32 / 9000)
    assert p["speedup"] == pytest.approx(0.04 / (0.01 + 32 / 9000)) and p["bound"] == pytest.approx(4.0)
    assert p["one_time_s"] == pytest.approx(0.4) and p["payback_steps"] == pytest.approx(0.4 / (0.03 - 32 / 9000))
    assert "13.56 ms a step (3.56 ms making the batch): 2.95x; at most 4.00x if the data cost nothing" in text
    assert text.splitlines()[-2].startswith("worth doing: the code change to gf.accelerate: predicted 2.95x")
    assert text.splitlines()[-1] == "  check it on this script: gpufeed diagnose --verify -- train.py --epochs 1"


def test_a_refused_pipeline_gives_the_reason_and_the_tuned_settings_and_no_diff():
    r = report([_process([_uniform(30, 0.03, 0.01)], side=REFUSED)])
    assert r.code_change is None and "refused" in r.no_change_reason
    text = str(r)
    assert "gf.accelerate refused it: UnsupportedTransformError: Lambda() is opaque" in text
    assert "DataLoader(dataset, batch_size=32, num_workers=2, pin_memory=False)" in text
    assert "2400 img/s with these settings against 1500 img/s with the script's" in text
    # the workers load while the step runs: a wait of 32 / 2400 s - 10 ms remains
    assert r.prediction["fix"] == "tuned" and r.prediction["new_step_s"] == pytest.approx(32 / 2400)
    assert "worth doing: the tuned DataLoader settings: predicted 3.00x" in text


def test_tuned_settings_no_better_than_the_scripts_own_are_not_offered():
    same = {**REFUSED, "tuned": {**REFUSED["tuned"], "img_s": 1520.0}}  # within 5% of the script's 1500
    r = report([_process([_uniform(30, 0.03, 0.01)], side=same)])
    assert r.prediction is None
    finding = r.diagnosis.findings[0]
    assert finding.kind == "data-bound" and "no DataLoader setting measured better" in finding.fix
    assert "worth doing: a faster loader is worth at most 4.00x to this loop (it waits 75% of the time)" in str(r)


def test_a_data_bound_report_without_the_side_measurement_says_it_was_not_measured():
    r = report([_process([_uniform(30, 0.03, 0.01)])])
    (finding,) = r.diagnosis.findings
    assert finding.kind == "data-bound" and "not measured" in finding.expected_gain
    assert "not measured: accelerate may still refuse" in str(r)


def test_save_writes_the_markdown_the_json_and_the_timeline(tmp_path):
    r = report([_process([_uniform(30, 0.03, 0.01)], side=ACCELERATED, gpu=[(3.5, 50.0, 100.0)])])
    r.save(tmp_path)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["verdict"] == "data-bound" and saved["diagnosis"]["steps"] == 28
    assert saved["loaders"][0]["main"] is True and saved["side"]["accelerate"]["img_s"] == 9000.0
    assert str(r) in (tmp_path / "report.md").read_text()
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_of_a_report_with_no_loader_still_writes_all_three_files(tmp_path):
    report([_process([])]).save(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == NO_LOADER
    assert (tmp_path / "timeline.png").stat().st_size > 0 and (tmp_path / "report.md").is_file()


def test_records_read_back_from_json_give_the_same_report(tmp_path):
    rec = _process([_uniform(30, 0.03, 0.01)], cpu=[(3.5, 100.0, 50.0)], gpu=[(3.5, 40.0, 10.0)], device="cuda:0")
    again = ProcessRecord.from_json(rec.to_json())
    assert str(report([again])) == str(report([rec]))


@pytest.mark.parametrize(
    ("cores", "machine_percent", "main", "workers", "others"),
    [
        (2, 100.0, 100.0, 0.0, 0.5),  # saturated: the script one core, other processes the other
        (4, 75.0, 100.0, 100.0, 0.25),  # the script 2 of 4 cores, others 1
        (8, 100.0, 150.0, 250.0, 0.5),  # the script 4 of 8 (main 1.5, workers 2.5), others 4
        (2, 40.0, 100.0, 0.0, 0.0),  # the script's own share is over the machine's sample: none left for others
    ],
)
def test_other_processes_share_of_the_cores_takes_the_scripts_percent_of_one_core_as_a_share_of_all(
    monkeypatch, cores, machine_percent, main, workers, others
):
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    ld = _uniform(30, wait=0.001, step=0.05)  # the measured steps run from t = 3.05 to 4.478
    cpu = [(3.1 + 0.2 * i, main, workers) for i in range(7)]
    machine = [(3.1 + 0.2 * i, machine_percent, cores + 1.0) for i in range(7)]
    r = report([_process([ld], cpu=cpu, cores=cores, machine=machine)])
    assert r.machine["others"] == pytest.approx(others, abs=1e-12) and r.machine["cores"] == cores
    if machine_percent == 100.0:  # busy (every core in use): the finding names the others' share
        [busy] = [f for f in r.diagnosis.findings if f.kind == "machine-busy"]
        assert f"other processes than the script {others:.0%} of the cores" in busy.message
