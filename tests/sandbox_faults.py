"""A real sandbox outage for fault-injection tests: the machine cannot start sandboxed programs.

With cgroups (the normal case) the parent cgroup of every run admits one process, so bwrap cannot
fork its namespaces (EAGAIN, as when a machine runs out of processes); without cgroups, sleepers
under the sandbox uid use up its RLIMIT_NPROC budget, so setpriv cannot even exec bwrap.
"""

from __future__ import annotations

import subprocess

from worker import cgroups


class SandboxOutage:
    def __init__(self, uid: int = 65534, gid: int = 65534):
        self.uid, self.gid = uid, gid
        self.version = cgroups.detect()
        self._restore: tuple | None = None
        self._sleepers: list[subprocess.Popen] = []

    def _pids_max(self):
        if self.version == "v2":
            return cgroups.ROOT / cgroups.PARENT / "pids.max"
        return cgroups.ROOT / "pids" / cgroups.PARENT / "pids.max"

    def begin(self) -> "SandboxOutage":
        if self.version:
            cgroups.RunCgroup(self.version, 1 << 26, 8).remove()  # the parent exists from here on
            path = self._pids_max()
            self._restore = (path, path.read_text().strip())
            path.write_text("1")
        else:
            self._sleepers = [subprocess.Popen(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                                                "--clear-groups", "sleep", "600"]) for _ in range(80)]
        return self

    def end(self) -> None:
        if self._restore is not None:
            path, value = self._restore
            path.write_text(value)
            self._restore = None
        for proc in self._sleepers:
            proc.kill()
            proc.wait()
        self._sleepers = []

    def __enter__(self) -> "SandboxOutage":
        return self.begin()

    def __exit__(self, *exc) -> None:
        self.end()
