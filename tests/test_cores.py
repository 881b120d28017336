"""gpufeed.device.cores: the cores a process may use, from its affinity mask and its cgroup CPU quota (v2 cpu.max, v1
cfs_quota_us / cfs_period_us; its own cgroup's and its parents'), read from constructed files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.device import cores


def _v2(tmp_path: Path, limits: dict[str, str], own: str = "/job") -> tuple[Path, Path]:
    """A cgroup v2 tree: ``limits`` maps a cgroup's path to its cpu.max text; the process lives in ``own``."""
    root = tmp_path / "fs"
    root.mkdir(parents=True)
    for path, text in limits.items():
        folder = root / path.strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(text + "\n")
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    return root, tmp_path / "cgroup"


@pytest.mark.parametrize(
    ("cpu_max", "usable"),
    [
        ("150000 100000", 2),  # 1.5 cores rounded up, as the JDK, Go and loky round
        ("50000 100000", 1),  # half a core: still one thread
        ("100000 100000", 1),
        ("200000 100000", 2),  # exactly 2: not 3 by a rounding error
        ("250000 100000", 3),
        ("max 100000", 4),  # no limit: the affinity mask
        ("1200000 100000", 4),  # a quota above the mask: the mask
    ],
)
def test_a_cgroup_v2_quota_lowers_the_affinity_mask_rounded_up(tmp_path, cpu_max, usable):
    root, self_cgroup = _v2(tmp_path, {"/job": cpu_max})
    c = cores(root, self_cgroup, affinity=4)
    assert (c.usable, c.affinity) == (usable, 4)
    assert c.quota == (None if cpu_max.startswith("max") else int(cpu_max.split()[0]) / 100_000)


def test_a_parent_s_quota_binds_when_the_own_cgroup_has_none(tmp_path):
    # systemd: CPUQuota= on the slice, the service's own cgroup at "max"; the tightest of the chain counts
    root, self_cgroup = _v2(
        tmp_path, {"/user.slice": "100000 100000", "/user.slice/job.scope": "max 100000"}, own="/user.slice/job.scope"
    )
    c = cores(root, self_cgroup, affinity=8)
    assert (c.usable, c.quota) == (1, 1.0) and "user.slice/cpu.max (100000 100000)" in c.quota_from
    root2, cg2 = _v2(tmp_path / "b", {"/a": "400000 100000", "/a/b": "300000 100000"}, own="/a/b")
    assert cores(root2, cg2, affinity=8).usable == 3


def test_a_container_at_the_mount_s_root_reads_the_root_s_files(tmp_path):
    # a cgroup namespace shows the container's own cgroup as "/": its limit sits in the mount's root folder
    root, self_cgroup = _v2(tmp_path, {}, own="/")
    (root / "cpu.max").write_text("150000 100000\n")
    assert cores(root, self_cgroup, affinity=16).usable == 2


@pytest.mark.parametrize(
    ("quota_us", "period_us", "usable"),
    [("250000", "100000", 3), ("-1", "100000", 6), ("50000", "100000", 1), ("150000", "0", 6)],
)
def test_a_cgroup_v1_cfs_quota_under_a_joined_mount(tmp_path, quota_us, period_us, usable):
    root = tmp_path / "fs"
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text(quota_us + "\n")
    (folder / "cpu.cfs_period_us").write_text(period_us + "\n")
    (tmp_path / "cgroup").write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert cores(root, tmp_path / "cgroup", affinity=6).usable == usable


def test_a_cgroup_v1_cpu_controller_mounted_alone(tmp_path):
    # this machine's layout: "1:cpu:/name" and the controller at /sys/fs/cgroup/cpu
    root = tmp_path / "fs"
    folder = root / "cpu" / "bench"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("100000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cgroup").write_text("2:cpuacct:/\n1:cpu:/bench\n0::/\n")
    c = cores(root, tmp_path / "cgroup", affinity=2)
    assert (c.usable, c.affinity, c.quota) == (1, 2, 1.0)
    assert str(c).startswith("1 usable: the cgroup CPU quota of 1.00 cores (") and "rounded up" in str(c)


def test_an_affinity_of_one_core_without_a_quota(tmp_path):
    root, self_cgroup = _v2(tmp_path, {"/job": "max 100000"})
    c = cores(root, self_cgroup, affinity=1)
    assert (c.usable, c.quota) == (1, None) and "no cgroup CPU quota" in str(c)


def test_missing_or_malformed_files_are_no_limit(tmp_path):
    root, self_cgroup = _v2(tmp_path, {"/job": "garbage"})
    assert cores(root, self_cgroup, affinity=3).usable == 3
    assert cores(tmp_path / "none", tmp_path / "no-cgroup-file", affinity=3).usable == 3


def test_the_process_s_own_reading_is_within_its_affinity():
    from gpufeed.device import process_cores, usable_cores

    c = process_cores()
    assert 1 <= usable_cores() == c.usable <= c.affinity


def test_the_process_s_reading_is_kept_a_second_unless_asked_fresh(monkeypatch):
    # a process that moved itself into another cgroup (benchmarks/busy_machine.py's quota) reads it at once
    import gpufeed.device as device

    readings = iter([device.Cores(2, 2, 2), device.Cores(1, 2, 2, 1.0, "cpu.max (100000 100000)", "/x")])
    monkeypatch.setattr(device, "cores", lambda affinity: next(readings))
    monkeypatch.setattr(device, "_CORES", None)
    assert device.process_cores().usable == 2 and device.process_cores().usable == 2  # the second: kept
    assert device.process_cores(fresh=True).usable == 1 and device.usable_cores() == 1
