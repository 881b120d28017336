"""benchmarks/busy_machine.py rehearsed at tiny sizes, so that it cannot rot between the runs recorded in RESULTS.md.
Its figures at these sizes mean nothing and are not checked: only that every kind ran in every condition, side by
side with its DataLoader, and what the record holds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_quick_rehearsal_records_every_kind_in_every_condition(tmp_path):
    # the kinds without a rehearsal elsewhere (hf32's and the stream's loaders rehearse in tests/test_gpu_check.py)
    kinds = ["device32", "folder224", "fallback"]
    script = [sys.executable, str(ROOT / "benchmarks" / "busy_machine.py"), "--quick", "--out", str(tmp_path)]
    run = subprocess.run([*script, "--kinds", ",".join(kinds)], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "busy_machine.json").read_text())
    assert list(summary["kinds"]) == kinds
    env = summary["environment"]
    assert env["busy_processes"] == 2 and len(env["load_at_start"]) == 3 and "usable" in env["cores"]
    for name, kind in summary["kinds"].items():
        (r,) = kind["rounds"]
        assert list(r) == ["quiet", "busy", "quota"], name
        assert r["busy"]["how"].startswith("2 x python -c 'while True: pass'")
        assert r["quiet"]["how"] == "nothing started"
        assert r["quota"]["how"].startswith(("cgroup cpu.max 100000 100000", "cgroup cpu.cfs_quota_us 100000", "sched"))
        for condition in r.values():
            assert set(condition["median_s"]) >= {"gpufeed", "baseline"} and condition["ratio"] > 0
            assert {"load_1min", "others_cores", "own_cores", "usable_cores"} <= set(condition)
        assert r["quota"]["usable_cores"] == 1  # gpufeed saw the quota (or the one CPU) while it ran
        assert set(kind["kept"]) == {"busy", "quota"} and "goal_kept_met" in kind
    assert "goal_10x_busy_met" in summary["kinds"]["device32"]
    assert set(summary["kinds"]["device32"]["ratio GPUFEED_THREADS=torch"]) == {"quiet", "busy", "quota"}
