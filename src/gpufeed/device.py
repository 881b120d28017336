"""Turning a user's ``device=`` into a usable ``torch.device``, with errors that say what to do."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import DeviceError

__all__ = [
    "Cores",
    "cores",
    "cpu_busy_seconds",
    "cpu_throttling",
    "environment",
    "fmt_bytes",
    "host_available",
    "process_cores",
    "resolve_device",
    "sync",
    "usable_cores",
]

# A cgroup v1 "no limit" is a huge number (9223372036854771712), not a word: past this, it is no limit.
_NO_LIMIT = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2's no limit) or unreadable: None


def _mem_available(meminfo: Path) -> int | None:
    """``MemAvailable`` from ``/proc/meminfo``: free memory plus the page cache and slabs the kernel can reclaim.
    ``MemFree`` leaves the cache out: after reading files it fell to 107 MiB on a 24 GiB machine whose
    ``MemAvailable`` stayed near 23 GB."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_paths(root: Path, self_cgroup: Path, controller: str = "memory") -> list[Path]:
    """The folders that may hold a ``controller`` limit (``"memory"``, ``"cpu"``) on this process: its own cgroup
    and every parent up to the mount (a limit set on a parent, e.g. a systemd slice's MemoryMax or CPUQuota, binds
    too), then the mount's root (what a container sees when the cgroup namespace puts it at the root). A cgroup v1
    controller is mounted under its own name or its joined one (``cpu,cpuacct``); folders that do not exist are
    listed all the same (their files read as missing)."""
    found: list[Path] = []
    try:
        for line in self_cgroup.read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if controllers == "":  # cgroup v2
                bases = [root]
            elif controller in controllers.split(","):  # cgroup v1
                bases = list(dict.fromkeys([root / controllers, root / controller]))
            else:
                continue
            parts = [p for p in rel.split("/") if p]
            found += [base.joinpath(*parts[:k]) for base in bases for k in range(len(parts), 0, -1)]
    except (OSError, ValueError):
        pass
    return list(dict.fromkeys([*found, root, root / controller]))


def _cgroup_room(root: Path, self_cgroup: Path) -> tuple[int, int] | None:
    """``(limit - usage, limit)`` of this process's memory cgroup (v2 ``memory.max``/``memory.current``, v1
    ``memory.limit_in_bytes``/``memory.usage_in_bytes``), the inactive page cache counted as free, as the
    kernel reclaims it before the limit bites; the tightest of its own and its parents' limits; ``None`` without
    a limit."""
    rooms: list[tuple[int, int]] = []
    for folder in _cgroup_paths(root, self_cgroup):
        for limit_name, usage_name, cache_name in (
            ("memory.max", "memory.current", "inactive_file"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        ):
            limit, usage = _read_int(folder / limit_name), _read_int(folder / usage_name)
            if limit is None or usage is None or limit >= _NO_LIMIT:
                continue
            cache = 0
            try:
                for line in (folder / "memory.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == cache_name and value.strip().isdigit():
                        cache = int(value)
            except OSError:
                pass
            rooms.append((max(0, limit - max(0, usage - cache)), limit))
    return min(rooms) if rooms else None


@dataclass(frozen=True)
class Cores:
    """The CPU cores this process may use, and why: what gpufeed sizes its threads by (:func:`cores`).

    ``usable`` is the affinity mask's CPUs (``taskset``, a cpuset, a container's ``--cpuset-cpus``), lowered to the
    tightest cgroup CPU quota (a container's ``--cpus``, a Kubernetes CPU limit, systemd's ``CPUQuota``) rounded
    up, as the JDK's container support, Go's GOMAXPROCS (1.25) and loky's ``cpu_count`` round it: 1.5 cores is 2
    threads (Uber's automaxprocs rounds down, to 1). ``machine`` is ``os.cpu_count()``, what torch's default
    intra-op thread count and most libraries see."""

    usable: int
    affinity: int
    machine: int
    quota: float | None = None  # the tightest cgroup CPU quota in cores; None without one
    quota_from: str = ""  # where it was read, e.g. "/sys/fs/cgroup/cpu.max (150000 100000)"
    quota_folder: str = ""  # the cgroup folder that holds it (its cpu.stat counts the throttling)

    def __str__(self) -> str:
        mask = f"{self.affinity} of the machine's {self.machine} CPUs in this process's affinity mask"
        if self.quota is not None and self.usable < self.affinity:
            return (
                f"{self.usable} usable: the cgroup CPU quota of {self.quota:.2f} cores ({self.quota_from}) rounded up; "
                f"{mask}"
            )
        quota = f"a cgroup CPU quota of {self.quota:.2f} cores" if self.quota is not None else "no cgroup CPU quota"
        return f"{self.usable} usable: {mask}, {quota}"


def _quota(folder: Path) -> tuple[float, str, str] | None:
    """The CPU quota set on one cgroup folder, in cores, and where it was read: cgroup v2's ``cpu.max``
    (``"$MAX $PERIOD"``, ``max`` for none) or v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 for none)."""
    try:
        text = (folder / "cpu.max").read_text().strip()
        quota, period = text.split()
        if quota != "max" and int(period) > 0:
            return int(quota) / int(period), f"{folder / 'cpu.max'} ({text})", str(folder)
        return None
    except (OSError, ValueError):
        pass
    quota_us, period_us = _read_int(folder / "cpu.cfs_quota_us"), _read_int(folder / "cpu.cfs_period_us")
    if quota_us is None or not period_us:  # -1 (no limit) is not digits: None
        return None
    where = f"{folder / 'cpu.cfs_quota_us'} ({quota_us}) / cpu.cfs_period_us ({period_us})"
    return quota_us / period_us, where, str(folder)


def cores(
    cgroup_root: str | Path = "/sys/fs/cgroup",
    self_cgroup: str | Path = "/proc/self/cgroup",
    affinity: int | None = None,
) -> Cores:
    """The cores this process may use (:class:`Cores`): its affinity mask, lowered to the tightest cgroup CPU quota
    of its own cgroup and its parents (v2 or v1). The paths and ``affinity`` are arguments so a test can give fake
    ones.

    Example:
        >>> c = cores()
        >>> 1 <= c.usable <= c.affinity <= c.machine
        True
    """
    machine = os.cpu_count() or 1
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    quotas = [q for folder in _cgroup_paths(Path(cgroup_root), Path(self_cgroup), "cpu") if (q := _quota(folder))]
    if not quotas:
        return Cores(max(1, affinity), affinity, machine)
    quota, where, folder = min(quotas)
    usable = max(1, min(affinity, math.ceil(quota - 1e-9)))  # 1.0000001 cores of rounding error is 1 core
    return Cores(usable, affinity, machine, quota, where, folder)


def cpu_throttling(folder: str | Path) -> tuple[int, float] | None:
    """``(periods, seconds)`` the cgroup at ``folder`` (a :attr:`Cores.quota_folder`) was throttled so far, from its
    ``cpu.stat``: v2's ``nr_throttled`` and ``throttled_usec``, v1's ``nr_throttled`` and ``throttled_time`` (ns);
    None where there is none."""
    try:
        stat = dict(line.split()[:2] for line in (Path(folder) / "cpu.stat").read_text().splitlines() if line.strip())
        periods = int(stat["nr_throttled"])
        if "throttled_usec" in stat:
            return periods, int(stat["throttled_usec"]) / 1e6
        return periods, int(stat["throttled_time"]) / 1e9
    except (OSError, ValueError, KeyError):
        return None


def cpu_busy_seconds(cpus: Collection[int] | None = None, stat: str | Path = "/proc/stat") -> float | None:
    """Seconds the CPUs ``cpus`` (their numbers, an affinity mask; None: every CPU) spent busy since boot, every
    process counted (user, nice, system, irq, softirq and steal: what a hypervisor took), from ``/proc/stat``; None
    where it cannot be read (not Linux)."""
    try:
        total = 0
        for line in Path(stat).read_text().splitlines():
            name, _, fields = line.partition(" ")
            if name[:3] == "cpu" and name[3:].isdigit() and (cpus is None or int(name[3:]) in cpus):
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields.split()[:8])
                total += user + nice + system + irq + softirq + steal
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


_CORES: tuple[float, int, Cores] | None = None  # (when read, affinity then, what was read)
_CORES_TTL_S = 1.0  # a quota changed in place (a resized container) is seen within a second


def process_cores(fresh: bool = False) -> Cores:
    """:func:`cores` of this process, read again when its affinity changes or after a second (it is asked per
    batch: reading the cgroup files took 50 us to 1.4 ms), or now with ``fresh`` (a process that has just moved
    itself into another cgroup)."""
    global _CORES
    now = time.monotonic()
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if fresh or _CORES is None or now - _CORES[0] > _CORES_TTL_S or _CORES[1] != affinity:
        _CORES = (now, affinity, cores(affinity=affinity))
    return _CORES[2]


def usable_cores() -> int:
    """CPU cores this process may use: its affinity mask lowered to its cgroup CPU quota (:class:`Cores`), at least
    1."""
    return process_cores().usable


def fmt_bytes(nbytes: int) -> str:
    """``nbytes`` as a person reads it: GiB from 1 GiB up, else MiB (the plan, the cache's messages)."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def host_available(
    meminfo: str | Path = "/proc/meminfo",
    cgroup_root: str | Path = "/sys/fs/cgroup",
    self_cgroup: str | Path = "/proc/self/cgroup",
) -> tuple[int, str]:
    """Host memory this process can still use, in bytes, and which figure that is (for the plan to say).

    The smaller of the kernel's ``MemAvailable`` (psutil's ``available`` where there is no ``/proc``) and the
    room left under this process's cgroup memory limit, if it has one. The paths are arguments so a test can
    give fake files.

    Example:
        >>> nbytes, what = host_available()
        >>> nbytes > 0 and ("MemAvailable" in what or "available" in what or "cgroup" in what)
        True
    """
    available = _mem_available(Path(meminfo))
    what = "MemAvailable"
    if available is None:
        import psutil

        available, what = int(psutil.virtual_memory().available), "available memory (psutil)"
    room = _cgroup_room(Path(cgroup_root), Path(self_cgroup))
    if room is not None and room[0] < available:
        return room[0], f"the room left under the cgroup memory limit of {fmt_bytes(room[1])}, {fmt_bytes(room[0])}"
    return available, f"{what} {fmt_bytes(available)}"


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU): before reading a host clock in a measurement."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Parse and check a device; ``None`` means CUDA when available, else the CPU.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"device={device!r} is not a device torch knows ({e}); use 'cpu' or 'cuda[:N]'") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device={device!r} but torch.cuda.is_available() is False here; use device='cpu'")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
        return torch.device("cuda", index)
    raise DeviceError(f"device={device!r}: gpufeed supports 'cpu' and 'cuda[:N]' devices")


def environment(device: torch.device, **extra: object) -> dict[str, object]:
    """Date, machine and versions: what every recorded figure is stated with (bench, train, benchmarks)."""
    import datetime as dt
    import platform

    import torchvision

    env: dict[str, object] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host_cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "device": str(device),
    }
    try:
        with open("/proc/cpuinfo") as f:
            env["host_cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    env.update(extra)
    return env
