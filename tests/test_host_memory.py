"""The host memory budget: what the kernel says is available (MemAvailable, the cgroup's room), never MemFree, and
the plan says which figure it used."""

import pytest
import torch

from gpufeed.device import host_available
from gpufeed.pipeline.plan import budget

GIB = 2**30
# A machine after reading files: little free, most of it page cache the kernel gives back on demand.
MEMINFO = """MemTotal:       24683652 kB
MemFree:          109568 kB
MemAvailable:   23488512 kB
Buffers:          120000 kB
Cached:         22000000 kB
"""


@pytest.fixture
def proc(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "cgroup").write_text("0::/\n")
    (tmp_path / "fs").mkdir()
    return tmp_path


def _available(proc, self_cgroup=None):
    return host_available(proc / "meminfo", proc / "fs", self_cgroup or proc / "cgroup")


def test_mem_available_is_the_figure_not_mem_free(proc):
    nbytes, what = _available(proc)
    assert nbytes == 23488512 * 1024 and what == "MemAvailable 22.40 GiB"


def test_a_cgroup_v2_limit_below_mem_available_is_the_figure(proc):
    (proc / "fs" / "memory.max").write_text(f"{8 * GIB}\n")
    (proc / "fs" / "memory.current").write_text(f"{3 * GIB}\n")
    (proc / "fs" / "memory.stat").write_text(f"anon {2 * GIB}\ninactive_file {GIB}\n")  # reclaimable cache
    nbytes, what = _available(proc)
    assert nbytes == 6 * GIB  # 8 GiB limit - (3 GiB used - 1 GiB inactive cache)
    assert what == "the room left under the cgroup memory limit of 8.00 GiB, 6.00 GiB"


def test_a_cgroup_v2_without_a_limit_leaves_mem_available(proc):
    (proc / "fs" / "memory.max").write_text("max\n")
    (proc / "fs" / "memory.current").write_text(f"{3 * GIB}\n")
    assert _available(proc)[0] == 23488512 * 1024


def test_a_cgroup_v1_limit_in_the_process_s_own_cgroup_is_read(proc):
    own = proc / "fs" / "memory" / "job" / "42"
    own.mkdir(parents=True)
    (own / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    (own / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (proc / "cgroup").write_text("5:cpu,cpuacct:/\n4:memory:/job/42\n1:name=systemd:/\n")
    assert _available(proc)[0] == 3 * GIB
    (own / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert _available(proc)[0] == 23488512 * 1024


def test_a_limit_on_a_parent_cgroup_binds_when_the_own_one_has_none(proc):
    # systemd: MemoryMax= on the slice, the service's own cgroup at "max"
    slice_, own = proc / "fs" / "user.slice", proc / "fs" / "user.slice" / "job.scope"
    own.mkdir(parents=True)
    (own / "memory.max").write_text("max\n")
    (own / "memory.current").write_text(f"{GIB}\n")
    (slice_ / "memory.max").write_text(f"{5 * GIB}\n")
    (slice_ / "memory.current").write_text(f"{2 * GIB}\n")
    (proc / "cgroup").write_text("0::/user.slice/job.scope\n")
    assert _available(proc)[0] == 3 * GIB
    (own / "memory.max").write_text(f"{10 * GIB}\n")  # a looser own limit: the parent's is still the tighter
    assert _available(proc)[0] == 3 * GIB


def test_without_proc_meminfo_psutil_s_available_is_used(proc, monkeypatch):
    import psutil

    class Memory:
        available = 5 * GIB

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory())
    assert host_available(proc / "missing", proc / "fs", proc / "cgroup") == (
        5 * GIB,
        "available memory (psutil) 5.00 GiB",
    )


def test_the_plan_note_says_which_figure_the_cpu_budget_is_half_of(monkeypatch):
    monkeypatch.setattr("gpufeed.pipeline.plan.host_available", lambda: (22 * GIB, "MemAvailable 22.00 GiB"))
    tier, why = budget(torch.device("cpu"), None).tier(7 * GIB)
    assert tier == "device" and why == "7.00 GiB fits the cpu budget of 11.00 GiB (half of MemAvailable 22.00 GiB)"
    tier, why = budget(torch.device("cpu"), None).tier(12 * GIB)
    assert tier == "mmap" and "exceeds the device budget of 11.00 GiB (half of MemAvailable 22.00 GiB)" in why
    assert budget(torch.device("cpu"), 0).tier(GIB)[1] == "1.00 GiB exceeds the device budget of 0.0 MiB " + (
        "(memory_budget) (host memory on the CPU); memory-mapped file"
    )
