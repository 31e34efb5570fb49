"""What a one-off sandboxed run (runner.py) and a test in a box (box.py) share: the limits, the
result, the sandbox's errors, the program's rlimits as the launcher takes them, and the pumps that
read a program's output pipes. Neither of the two imports the other's internals."""

from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass
from pathlib import Path

from worker.errors import WorkerError

SYSTEM_RO = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin"]
ETC_RO = ["/etc/ld.so.cache", "/etc/alternatives"]
# How long the sandbox may take to start the program (namespaces, mounts, the uid switch) before the
# run is this machine's failure. Not part of the program's wall-clock limit, which starts after it.
START_TIMEOUT_SECS = 30.0
# How often a running program is looked at for what wakes nobody: a cancelled judging (its exit,
# the launcher's report and its output wake the watch at once).
WATCH_SECS = 0.02
# How much of a program's stderr is kept (its end): enough for a traceback's last lines in `detail`.
STDERR_TAIL_BYTES = 4096
# The launcher (worker/sandbox/launcher.c): PID 1 inside the sandbox, it runs the program as its child and
# reports the program's own CPU time and peak RSS. Built once per machine (by the source's digest)
# into this directory; the sandbox uid must be able to read and run it.
DEFAULT_LAUNCHER_DIR = Path("/var/cache/judge-worker")
LAUNCHER_SOURCE = Path(__file__).with_name("launcher.c")
LAUNCHER_IN_SANDBOX = "/judge-launcher"


def storable_text(data: bytes) -> str:
    """A program's or a compiler's bytes as text PostgreSQL can store in `detail`: invalid UTF-8 and
    NUL (a hostile source can make either appear) replaced."""
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")


class SandboxUnavailable(WorkerError, RuntimeError):
    """The machine cannot isolate a run (no bwrap, no user namespaces...). Never run unsandboxed."""


class SandboxFailure(WorkerError, RuntimeError):
    """This run's sandbox never started the program (bwrap, setpriv, prlimit or the cgroup failed:
    a process or namespace limit of the machine, a missing tool). A failure of the machine, never
    a verdict on the submission."""


@dataclass(frozen=True)
class Limits:
    cpu_ms: int
    wall_ms: int
    memory_kb: int
    output_kb: int = 65536
    max_processes: int = 64
    max_open_files: int = 64
    # stderr given as a Path is pumped by this process like stdout: past this size the run is OLE.
    stderr_kb: int = 8192


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    cpu_ms: int
    wall_ms: int
    memory_kb: int
    oom_killed: bool
    wall_timeout: bool
    output_exceeded: bool  # stdout past output_kb, or stderr past stderr_kb
    stderr_tail: str = ""  # the last STDERR_TAIL_BYTES of stderr, when stderr was given as a Path


def program_rlimits(limits: Limits, with_cgroup: bool) -> list[str]:
    """The program's rlimits, as the launcher takes them (NAME=VALUE; soft = hard): for a one-off run
    (``--rlimit``) and for a test in a box (its run message)."""
    cpu_s = max(1, -(-limits.cpu_ms // 1000))
    # Soft = hard: as PID 1 of its namespace the program would not die of SIGXCPU; the hard limit kills.
    rlimits = [f"cpu={cpu_s + 1}", f"fsize={limits.output_kb * 1024}", f"nofile={limits.max_open_files}", "core=0"]
    if not with_cgroup:
        # RLIMIT_NPROC counts every process of the sandbox uid on the machine, not this run's: other
        # runs (another worker, a fork bomb being killed) use it up and then bwrap cannot even
        # fork. Only without a pids cgroup is it the limit of last resort.
        rlimits += [f"as={limits.memory_kb * 1024}", f"nproc={limits.max_processes}"]
    return rlimits


class Pump:
    """Reads one of the program's output pipes in the run's own watch loop (no thread: a thread's
    start and join cost a millisecond of every run). ``pump`` takes what is there without blocking;
    past ``limit`` bytes the overflow is flagged and the pipe closed (the program's next write fails)."""

    def __init__(self, pipe, limit: int):
        self.pipe = pipe
        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        self.limit = limit
        self.total = 0
        self.exceeded = False
        self.closed = False

    def pump(self) -> None:
        while not self.closed:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                self._close()
                return
            self.total += len(chunk)
            self.take(chunk)
            if self.total > self.limit:
                self.exceeded = True
                self._close()

    def _close(self) -> None:
        self.closed = True
        self.pipe.close()

    def abandon(self) -> None:
        if not self.closed:
            self._close()
        out = getattr(self, "out", None)
        if out is not None:
            out.close()

    def drain(self, deadline: float) -> None:
        """After the run: what the program wrote last, up to the end of the pipe (every writer is
        gone by then; the deadline only guards against a pipe something still holds)."""
        while not self.closed and time.monotonic() < deadline:
            select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            self.pump()
        if not self.closed:
            self._close()

    def take(self, chunk: bytes) -> None:
        raise NotImplementedError


class OutputPump(Pump):
    """The program's stdout into a file, up to ``limit`` bytes."""

    def __init__(self, pipe, path: Path, limit: int):
        super().__init__(pipe, limit)
        self.out = open(path, "wb")
        self.written = 0

    def take(self, chunk: bytes) -> None:
        room = self.limit - self.written
        if room > 0:
            self.out.write(chunk[:room])
            self.written += min(room, len(chunk))

    def finish(self, deadline: float) -> None:
        self.drain(deadline)
        self.out.close()


class TailPump(Pump):
    """The program's stderr, keeping only its last ``tail`` bytes (written to ``path`` at the end)."""

    def __init__(self, pipe, path: Path, limit: int, tail: int):
        super().__init__(pipe, limit)
        self.path = path
        self.tail = tail
        self.kept = bytearray()

    def take(self, chunk: bytes) -> None:
        self.kept += chunk
        del self.kept[:-self.tail]

    def finish(self, deadline: float) -> None:
        self.drain(deadline)
        self.path.write_bytes(bytes(self.kept))

    def tail_text(self) -> str:
        return storable_text(bytes(self.kept))
