"""A real sandbox outage for fault-injection tests: the machine cannot start sandboxed programs.

With cgroups (the normal case) the parent cgroup of every run admits one process, so bwrap cannot
fork its namespaces (EAGAIN, as when a machine runs out of processes); without cgroups, sleepers
under the sandbox uid use up its RLIMIT_NPROC budget, so setpriv cannot even exec bwrap.

The outage hits one sandbox identity: a uid and a cgroup parent of the test's own (PrivateSandbox),
never the defaults every other worker on the machine uses. So these tests run beside the rest of the
suite and beside the cutover lab's workers without breaking their sandboxes.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from worker.sandbox import cgroups
from worker.sandbox.runner import Sandbox


@dataclass(frozen=True)
class PrivateSandbox:
    """A sandbox identity no other test and no lab worker uses: its own uid (no account needed,
    setpriv takes numbers) and its own cgroup parent."""
    uid: int
    cgroup_parent: str

    def sandbox(self) -> Sandbox:
        return Sandbox(uid=self.uid, gid=self.uid, cgroup_parent=self.cgroup_parent)

    def worker_config(self) -> dict:
        """The worker config's [sandbox] table for the same identity."""
        return {"uid": self.uid, "gid": self.uid, "cgroup_parent": self.cgroup_parent}

    def processes(self) -> list[str]:
        """Every process of this uid on the machine."""
        out = subprocess.run(["pgrep", "-u", str(self.uid)], capture_output=True, text=True).stdout
        return out.split()


class SandboxOutage:
    def __init__(self, identity: PrivateSandbox):
        self.identity = identity
        self.version = cgroups.detect()
        self._restore: tuple | None = None
        self._sleepers: list[subprocess.Popen] = []

    def begin(self) -> "SandboxOutage":
        if self.version:
            # The parent exists from here on (a run's cgroup made and removed under it).
            cgroups.RunCgroup(self.version, 1 << 26, 8, self.identity.cgroup_parent).remove()
            parent = cgroups.parent_dirs(self.version, self.identity.cgroup_parent)[-1]  # pids on v1
            path = parent / "pids.max"
            self._restore = (path, path.read_text().strip())
            path.write_text("1")
        else:
            uid = self.identity.uid
            self._sleepers = [subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}",
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
