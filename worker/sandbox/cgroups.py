"""Per-run cgroups (v2 or v1) for the sandbox: a memory limit with OOM accounting, a pids limit and,
for a judge slot pinned to a CPU, a cpuset (the kernel keeps the run there, sched_setaffinity or not).

The kernel's accounting decides MLE: an OOM kill inside the run's cgroup.
When no writable cgroup hierarchy exists the sandbox falls back to
RLIMIT_AS (see sandbox.py), and says so in its log.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
import uuid
from pathlib import Path

log = logging.getLogger("worker.cgroups")
ROOT = Path("/sys/fs/cgroup")
# Every run's cgroup is made below this parent (per controller on v1). A worker may name its own
# ([sandbox] cgroup_parent), so that a limit set on one parent touches only that worker's runs.
DEFAULT_PARENT = "judge-sandbox"
PARENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def parent_dirs(version: str, parent: str = DEFAULT_PARENT) -> list[Path]:
    """The parent cgroup directories of every run (one on v2, one per controller on v1)."""
    if version == "v2":
        return [ROOT / parent]
    return [ROOT / controller / parent for controller in ("memory", "pids")]


def detect() -> str | None:
    """'v2', 'v1' or None."""
    if (ROOT / "cgroup.controllers").exists():
        controllers = (ROOT / "cgroup.controllers").read_text().split()
        if {"memory", "pids"} <= set(controllers) and _writable(ROOT):
            return "v2"
        return None
    if _writable(ROOT / "memory") and _writable(ROOT / "pids"):
        return "v1"
    return None


def cpuset_available(version: str | None) -> bool:
    """Can runs be confined to CPUs by a cpuset cgroup here?"""
    if version == "v2":
        return "cpuset" in (ROOT / "cgroup.controllers").read_text().split()
    return version == "v1" and _writable(ROOT / "cpuset")


def _v1_cpuset_parent(parent: str) -> Path:
    """The v1 cpuset parent, made with every CPU and memory node of the root (a v1 cpuset accepts
    no task before both are set)."""
    directory = ROOT / "cpuset" / parent
    directory.mkdir(exist_ok=True)
    for key in ("cpuset.cpus", "cpuset.mems"):
        if not (directory / key).read_text().strip():
            (directory / key).write_text((ROOT / "cpuset" / key).read_text().strip())
    return directory


class RunCgroup:
    """One cgroup (per controller on v1) for one sandboxed run."""

    def __init__(self, version: str, memory_bytes: int, max_pids: int, parent: str = DEFAULT_PARENT,
                 cpus: tuple[int, ...] = ()):
        self.version = version
        name = f"run-{uuid.uuid4().hex[:12]}"
        parents = parent_dirs(version, parent)
        if version == "v2":
            if not parents[0].exists():
                parents[0].mkdir(exist_ok=True)
                (ROOT / "cgroup.subtree_control").write_text("+memory +pids")
                (parents[0] / "cgroup.subtree_control").write_text("+memory +pids")
            if cpus and "cpuset" not in (parents[0] / "cgroup.subtree_control").read_text().split():
                (ROOT / "cgroup.subtree_control").write_text("+cpuset")
                (parents[0] / "cgroup.subtree_control").write_text("+cpuset")
        else:
            for directory in parents:
                directory.mkdir(exist_ok=True)
            if cpus:
                parents.append(_v1_cpuset_parent(parent))
        self.dirs = [directory / name for directory in parents]
        try:
            for directory in self.dirs:
                directory.mkdir()
            self._set_limits(memory_bytes, max_pids)
            if cpus:
                self._pin(cpus)
        except OSError:
            self.remove()  # nothing half-made stays behind
            raise

    def _pin(self, cpus: tuple[int, ...]) -> None:
        listed = ",".join(str(c) for c in cpus)
        if self.version == "v2":
            (self.dirs[0] / "cpuset.cpus").write_text(listed)
        else:
            cpuset = self.dirs[2]
            (cpuset / "cpuset.mems").write_text((cpuset.parent / "cpuset.mems").read_text().strip())
            (cpuset / "cpuset.cpus").write_text(listed)

    def _set_limits(self, memory_bytes: int, max_pids: int) -> None:
        if self.version == "v2":
            d = self.dirs[0]
            (d / "memory.max").write_text(str(memory_bytes))
            try:
                (d / "memory.swap.max").write_text("0")
            except OSError:
                pass
            (d / "pids.max").write_text(str(max_pids))
        else:
            mem, pids = self.dirs[:2]
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            try:
                (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            except OSError:
                pass
            (pids / "pids.max").write_text(str(max_pids))

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this cgroup so far."""
        if self.version == "v2":
            events = (self.dirs[0] / "memory.events").read_text()
        else:
            events = (self.dirs[0] / "memory.oom_control").read_text()
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def oom_killed(self) -> bool:
        return self.oom_kills() > 0

    def reset_peak(self) -> None:
        """Start the peak over (before each test of a box), where the kernel allows it (v1; v2 from 6.12)."""
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        try:
            (self.dirs[0] / name).write_text("0" if self.version == "v1" else "reset")
        except OSError:
            pass

    def peak_kb(self) -> int | None:
        """Peak memory charged to the run (the kernel's accounting), or None where the kernel has no counter."""
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.dirs[0] / name).read_text()) // 1024
        except (OSError, ValueError):
            return None

    def kill_all(self) -> None:
        for _ in range(50):
            pids = set()
            for f in self.procs_files:
                try:
                    pids.update(int(p) for p in Path(f).read_text().split())
                except OSError:
                    pass
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for directory in self.dirs:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                log.warning("could not remove cgroup", extra={"cgroup": str(directory)})
