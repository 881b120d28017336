"""When the machine's contention, not the data, sets the speed: the machine's load from constructed counter readings,
the findings diagnose makes of it, and the cores loader.plan names."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from gpufeed import diagnose
from gpufeed.device import Cores, cpu_busy_seconds, cpu_throttling
from gpufeed.findings import CHECKS, Evidence, MachineLoad, Reading, machine_load
from gpufeed.loading.plan import Plan

TWO = Cores(usable=2, affinity=2, machine=2)
QUOTA = Cores(1, 2, 2, 1.0, "/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us (100000) / cpu.cfs_period_us (100000)", "/x")


def _findings(load: MachineLoad | None) -> dict[str, object]:
    ev = Evidence(torch.device("cpu"), [0.01] * 4, [0.01] * 4, 0.08, 0.5, "data-bound", machine=load)
    return {f.kind: f for check in CHECKS if (f := check(None, ev)) is not None}


def test_other_processes_cpu_is_the_machine_s_busy_time_less_this_process_tree_s():
    # 2 s: every CPU busy 3 s in all (psutil's cpu_times), this process and its workers 1 s of it
    load = machine_load(Reading(10.0, 500.0, 40.0), Reading(12.0, 503.0, 41.0), load=9.5, cores=TWO)
    assert (load.wall_s, load.others, load.own, load.load) == (2.0, 1.0, 0.5, 9.5)
    assert load.busy and not load.throttled and load.throttled_share is None
    assert str(load) == (
        "other processes used 1.00 of the machine's 2 cores and this one 0.50 (1-minute load 9.5; 2 usable)"
    )
    quiet = machine_load(Reading(0.0, 0.0, 0.0), Reading(2.0, 2.6, 2.0), load=1.0, cores=TWO)
    assert quiet.others == pytest.approx(0.3) and not quiet.busy  # the rest of the machine's 0.3 core: a shell, a log


def test_a_busy_machine_is_a_finding_with_its_numbers_and_the_free_cores():
    f = _findings(machine_load(Reading(0.0, 0.0, 0.0), Reading(4.0, 6.8, 1.6), load=12.3, cores=TWO))["busy-machine"]
    assert f.message.startswith(  # type: ignore[attr-defined]
        "other processes used 1.3 of the machine's 2 cores while the loop ran (1-minute load 12.3, 2 usable cores; "
        "this process and its workers 0.4)"
    )
    assert "torch.set_num_threads(1)" in f.fix  # type: ignore[attr-defined]
    assert f.expected_gain == "the loop may run up to 2.9x faster alone"  # type: ignore[attr-defined]  # 2 / 0.7
    swamped = machine_load(Reading(0.0, 0.0, 0.0), Reading(1.0, 2.0, 0.0), load=14.0, cores=TWO)
    assert "other processes took every usable core" in _findings(swamped)["busy-machine"].expected_gain  # type: ignore[attr-defined]
    assert _findings(None) == {} or "busy-machine" not in _findings(None)


def test_a_quiet_machine_and_a_larger_one_s_small_share_are_not_findings():
    eight = Cores(8, 8, 8)
    small = machine_load(Reading(0.0, 0.0, 0.0), Reading(1.0, 2.8, 1.0), load=3.0, cores=eight)
    assert small.others == pytest.approx(1.8) and not small.busy  # under a quarter of 8 cores
    assert "busy-machine" not in _findings(small)


def test_the_cgroup_quota_s_throttling_is_a_finding():
    load = machine_load(
        Reading(0.0, 0.0, 0.0, throttled=(10, 0.5)), Reading(2.0, 1.0, 1.0, throttled=(30, 1.0)), 1.0, QUOTA
    )
    assert (load.throttled_periods, load.throttled_share) == (20, 0.25) and load.throttled and not load.busy
    f = _findings(load)["cpu-quota"]
    assert f.message.startswith(  # type: ignore[attr-defined]
        "the cgroup CPU quota of 1.00 cores (/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us (100000) / cpu.cfs_period_us "
        "(100000)) held this process back for 25% of the loop's time (20 periods throttled)"
    )
    assert "<= 1" in f.fix  # type: ignore[attr-defined]


def test_cpu_stat_is_read_in_both_cgroup_versions(tmp_path):
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cpu.stat").write_text("usage_usec 9\nnr_periods 40\nnr_throttled 12\nthrottled_usec 250000\n")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "cpu.stat").write_text("nr_periods 23\nnr_throttled 20\nthrottled_time 974298158\n")
    assert cpu_throttling(tmp_path / "v2") == (12, 0.25)
    assert cpu_throttling(tmp_path / "v1") == (20, 0.974298158)
    assert cpu_throttling(tmp_path / "none") is None


def test_diagnose_reports_the_machine_it_measured_on(monkeypatch):
    class Busy:
        def read(self) -> MachineLoad:
            return MachineLoad(1.0, 1.5, 0.4, 11.0, TWO)

    monkeypatch.setattr(sys.modules["gpufeed.diagnose"], "MachineMeter", Busy)
    report = diagnose([torch.zeros(2)] * 4, lambda batch: None, steps=3, device="cpu")
    kinds = [f.kind for f in report.findings]
    assert "busy-machine" in kinds and "other processes used 1.5 of the machine's 2 cores" in str(report)
    assert report.cpu_percent == pytest.approx(40.0)  # this process's and its workers' own 0.4 core, from the meter


def test_the_plan_names_the_usable_cores_and_why(monkeypatch):
    monkeypatch.setattr("gpufeed.loading.plan.process_cores", lambda: QUOTA)
    plan = Plan((), ("RandomCrop(32)",), "device", (10, 3, 32, 32), "uint8", 30720, "arrays", device="cpu")
    line = next(line for line in str(plan).splitlines() if line.startswith("cores:"))
    assert line.startswith(
        "cores:    1 usable: the cgroup CPU quota of 1.00 cores (/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us (100000) / "
        "cpu.cfs_period_us (100000)) rounded up; 2 of the machine's 2 CPUs in this process's affinity mask; the "
        "batched ops on the CPU run on 1 thread or torch's setting"
    )
    fallback = Plan((), (), "fallback", (10,), "uint8", 0, "none", device="cpu", workers=1, cores=str(TWO))
    assert "cores:    2 usable: 2 of the machine's 2 CPUs in this process's affinity mask, no cgroup CPU quota\n" in (
        str(fallback) + "\n"
    )


def test_other_processes_that_fit_beside_the_cores_this_one_may_use_are_no_contention():
    # a container of 2 cores' quota on a 64-CPU server, other jobs busy on 30 of the rest: nothing took its cores
    quota = Cores(usable=2, affinity=64, machine=64, quota=2.0)
    spread = machine_load(Reading(0.0, 0.0, 0.0), Reading(1.0, 31.8, 1.8), load=30.0, cores=quota)
    assert spread.others == pytest.approx(30.0) and not spread.busy and "busy-machine" not in _findings(spread)
    # the server full: 63 cores of others' work no longer fit on the 62 it leaves them (every CPU busy)
    full = machine_load(Reading(0.0, 0.0, 0.0), Reading(1.0, 64.0, 1.0), load=70.0, cores=quota)
    assert full.busy
    f = _findings(full)["busy-machine"]
    assert f.expected_gain == "the loop may run up to 2.0x faster alone"  # type: ignore[attr-defined]  # 2 / (2 - 1)


def test_the_busy_time_counted_is_the_affinity_mask_s_cpus(tmp_path):
    # a job pinned to CPUs 0 and 1 (taskset, --cpuset-cpus): the others' work on CPUs 2 and 3 is not beside it
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")
    stat.write_text(
        f"cpu  {9 * ticks} 0 0 0 0 0 0 0 0 0\n"
        f"cpu0 {ticks} 0 {ticks} 500 7 0 0 0 0 0\n"  # user, nice, system, idle, iowait, irq, softirq, steal
        f"cpu1 0 {ticks} 0 400 0 0 0 {ticks} 0 0\n"
        f"cpu2 {3 * ticks} 0 0 0 0 0 0 0 0 0\n"
        f"cpu3 {2 * ticks} 0 0 0 0 0 0 0 0 0\n"
        "intr 1 2 3\n"
    )
    assert cpu_busy_seconds({0, 1}, stat) == pytest.approx(4.0)
    assert cpu_busy_seconds(None, stat) == pytest.approx(9.0)
    assert cpu_busy_seconds({0}, tmp_path / "none") is None
