"""Runs one untrusted command in isolation: bubblewrap + an unprivileged uid + rlimits + a cgroup.

Isolation: new user, PID, network, IPC and UTS namespaces (no network at all), a read-only view
of the system directories the toolchains need, the run's box directory (read-write only while
compiling), a private tmpfs /tmp, no /home, no /etc beyond the dynamic loader cache, and
--die-with-parent. Limits: CPU time (RLIMIT_CPU), output size (RLIMIT_FSIZE), open files, no
core dumps, process count (cgroup pids.max, or RLIMIT_NPROC when no cgroup is writable), memory
(cgroup memory limit, or RLIMIT_AS), and a wall-clock timer in the parent that starts when the
sandbox reports it starts the program (setting up the sandbox is not the program's time). A sandbox
that fails to start the program, or takes START_TIMEOUT_SECS to, raises SandboxFailure: the
machine's failure is never a verdict. Inside, the launcher (launcher.c) runs the program as its
child and reports its own CPU time and peak RSS: nothing of the launch chain, no page cache.
"""

from __future__ import annotations

import hashlib
import os
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

from worker.sandbox import cgroups
from worker.sandbox.base import (
    DEFAULT_LAUNCHER_DIR,
    ETC_RO,
    LAUNCHER_IN_SANDBOX,
    LAUNCHER_SOURCE,
    START_TIMEOUT_SECS,
    STDERR_TAIL_BYTES,
    SYSTEM_RO,
    WATCH_SECS,
    Limits,
    OutputPump,
    RunResult,
    SandboxFailure,
    SandboxUnavailable,
    TailPump,
    program_rlimits,
)
from worker.sandbox.box import Box


class Sandbox:
    def __init__(self, uid: int = 65534, gid: int = 65534, bwrap: str | None = None,
                 cgroup_parent: str = cgroups.DEFAULT_PARENT, launcher_dir: Path = DEFAULT_LAUNCHER_DIR,
                 cpus: tuple[int, ...] = ()):
        self.uid = uid
        # A judge slot's CPU(s): every run stays on them (a cpuset cgroup where the kernel offers one,
        # else the CPU affinity the launcher sets, which the program could widen: timing, not isolation).
        self.cpus = tuple(cpus)
        self.gid = gid
        self.cgroup_parent = cgroup_parent
        self.bwrap = bwrap or shutil.which("bwrap")
        if self.bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        self.cgroup_version = cgroups.detect()
        self.cpuset = bool(self.cpus) and cgroups.cpuset_available(self.cgroup_version)
        self.launcher = build_launcher(launcher_dir)

    def self_test(self, scratch: Path) -> None:
        """Refuse to start if isolation does not work on this machine."""
        scratch.mkdir(parents=True, exist_ok=True)
        for parent in [scratch, *scratch.parents]:
            mode = parent.stat().st_mode
            if parent != scratch and not mode & 0o001:
                raise SandboxUnavailable(f"{parent} (mode {oct(mode & 0o777)}) cannot be traversed by the sandbox "
                                         f"uid {self.uid}: put work_dir below directories with o+x")
        os.chown(scratch, self.uid, self.gid)
        out, err = scratch.parent / "selftest.out", scratch.parent / "selftest.err"
        failure = None
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            try:
                result = self.run(["/bin/sh", "-c", "id -u"], box=scratch, stdin=subprocess.DEVNULL, stdout=stdout,
                                  stderr=stderr, limits=Limits(cpu_ms=2000, wall_ms=10000, memory_kb=262144))
            except SandboxFailure as exc:
                failure = exc
        text, problem = out.read_text().strip(), err.read_text(errors="replace").strip()[:300]
        out.unlink()
        err.unlink()
        if failure is not None:
            raise SandboxUnavailable(f"sandbox self-test failed: {failure}: {problem}")
        if result.exit_code != 0 or text != str(self.uid):
            raise SandboxUnavailable(f"sandbox self-test failed (exit {result.exit_code}, uid {text!r}): {problem}; "
                                     "check that bubblewrap works and unprivileged user namespaces are enabled")

    def box(self, box: Path, limits: Limits, log_path: Path):
        """A box for the tests of one submission (worker/sandbox/box.py): set up once, one fork per test."""
        return Box(self, box, limits, log_path)

    def _bwrap_args(self, box: Path, writable_box: bool) -> list[str]:
        # --as-pid-1: the launcher is PID 1 of the namespace (no bwrap init in between); the program is
        # its child, and the launcher reports the program's own CPU time and peak RSS.
        args = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1",
                "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp",
                "--ro-bind", str(self.launcher), LAUNCHER_IN_SANDBOX]
        for path in SYSTEM_RO:
            if os.path.lexists(path):
                args += (["--symlink", os.readlink(path), path] if os.path.islink(path)
                         else ["--ro-bind", path, path])
        for path in ETC_RO:
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        args += ["--bind" if writable_box else "--ro-bind", str(box), "/box", "--chdir", "/box",
                 "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--unsetenv", "PYTHONPATH",
                 # Only /tmp, /dev/shm (and a compile's /box) stay writable: a box wipes just those
                 # between tests, so nothing may be left anywhere else (bwrap's root and /dev are tmpfs).
                 "--remount-ro", "/dev", "--remount-ro", "/"]
        return args

    def run_cgroup(self, memory_kb: int, max_processes: int, what: str) -> cgroups.RunCgroup | None:
        """The cgroup of one run or box (None without cgroups): ``memory_kb`` plus room for bwrap's own
        pages (MLE is decided from the peak, not by this limit), ``max_processes``, this slot's CPUs."""
        if not self.cgroup_version:
            return None
        try:
            return cgroups.RunCgroup(self.cgroup_version, (memory_kb + 16384) * 1024, max_processes,
                                     self.cgroup_parent, cpus=self.cpus if self.cpuset else ())
        except OSError as exc:
            raise SandboxFailure(f"cannot set up the {what}'s cgroup: {exc}") from exc

    def enter_argv(self, report_fd: int, group: cgroups.RunCgroup | None, rlimits: list[str]) -> list[str]:
        """The launcher's first step (launcher.c, --enter), up to the bwrap arguments: join the
        cgroups, pin the CPUs (without a cpuset), set ``rlimits``, switch to the sandbox uid."""
        enter = [str(self.launcher), "--enter", "--uid", str(self.uid), "--gid", str(self.gid),
                 "--report-fd", str(report_fd)]
        for procs in group.procs_files if group is not None else ():
            enter += ["--cgroup-procs", procs]
        if self.cpus and not self.cpuset:
            enter += ["--cpus", ",".join(map(str, self.cpus))]
        for limit in rlimits:
            enter += ["--rlimit", limit]
        return enter

    def run(self, argv: list[str], *, box: Path, stdin, stdout, stderr, limits: Limits,
            writable_box: bool = False, cancelled: threading.Event | None = None) -> RunResult:
        """Run argv in the sandbox. ``stdout`` may be a Path: the output is then pumped through a pipe
        by this process (so its page cache is not charged to the run's memory) and cut at the limit.
        ``stderr`` may be a Path too: pumped the same way, only its last STDERR_TAIL_BYTES kept (in the
        file and in ``RunResult.stderr_tail``), past ``limits.stderr_kb`` the run is OLE."""
        group = self.run_cgroup(limits.memory_kb, limits.max_processes, "run")
        rlimits = program_rlimits(limits, with_cgroup=group is not None)
        # The launcher, the last step inside the finished sandbox, reports on this pipe (as fd 9) that it
        # starts the program, and how the program ended: no start report means the sandbox failed
        # (SandboxFailure), whatever the exit status says.
        started_r, started_w = os.pipe()
        # The launcher's first step (launcher.c, --enter) rather than preexec_fn: no Python runs between
        # fork and exec in this threaded process. It joins the cgroups before anything can fork, so
        # nothing escapes them, then limits, drops to the sandbox uid and execs bwrap.
        inner = [*self.enter_argv(started_w, group, rlimits), "--", *self._bwrap_args(box, writable_box), "--",
                 LAUNCHER_IN_SANDBOX, "--", *argv]
        launched = time.monotonic()
        program_started_at: float | None = None
        wall_timeout = False
        pumps: list = []  # stdout's and stderr's, where given as a Path
        err_pump = None
        try:
            try:
                proc = subprocess.Popen(inner, stdin=stdin,
                                        stdout=subprocess.PIPE if isinstance(stdout, Path) else stdout,
                                        stderr=subprocess.PIPE if isinstance(stderr, Path) else stderr,
                                        close_fds=True, pass_fds=(started_w,), start_new_session=True,
                                        env={"PATH": "/usr/bin:/bin"})
            except OSError as exc:  # fork or exec of the first step failed: out of processes or memory
                raise SandboxFailure(f"cannot start the sandbox: {exc}") from exc
            finally:
                os.close(started_w)
            if isinstance(stdout, Path):
                pumps.append(OutputPump(proc.stdout, stdout, limits.output_kb * 1024))
            if isinstance(stderr, Path):
                err_pump = TailPump(proc.stderr, stderr, limits.stderr_kb * 1024, STDERR_TAIL_BYTES)
                pumps.append(err_pump)
            # The wall-clock limit is the program's own: it runs from the sandbox's report that it starts
            # the program, not from the launch (namespaces can take seconds to set up on a busy machine,
            # which is not the program's doing). Until then the deadline is START_TIMEOUT_SECS.
            os.set_blocking(started_r, False)
            report = _LauncherReport(started_r)
            deadline = launched + START_TIMEOUT_SECS
            # Woken at once by the chain's exit (its pidfd) or the launcher's report, not by polling:
            # a sleep between looks added half its length to every run on average.
            exited = os.pidfd_open(proc.pid)
            try:
                while True:
                    watched = [exited] if program_started_at is not None or report.eof else [exited, started_r]
                    watched += [p.fd for p in pumps if not p.closed]
                    select.select(watched, [], [], max(0.0, min(deadline - time.monotonic(), WATCH_SECS)))
                    for p in pumps:
                        p.pump()
                    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        break
                    if program_started_at is None and report.read().started:
                        program_started_at = time.monotonic()
                        deadline = program_started_at + limits.wall_ms / 1000
                    overflow = any(p.exceeded for p in pumps)
                    stop = cancelled is not None and cancelled.is_set()
                    if time.monotonic() > deadline or overflow or stop:
                        wall_timeout = program_started_at is not None and not (overflow or stop)
                        try:
                            os.killpg(proc.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                        if group is not None:
                            group.kill_all()
                        pid, status, usage = os.wait4(proc.pid, 0)
                        break
            finally:
                os.close(exited)
            ended = time.monotonic()
            report.read()  # every writer has exited: the rest of the report, if any
            if program_started_at is None and report.started:  # started and ended between looks
                program_started_at = ended
            program_started = program_started_at is not None
            wall_ms = int((ended - (program_started_at or launched)) * 1000)
            for p in pumps:
                p.finish(ended + 10)
            oom = group.oom_killed() if group is not None else False
            peak_kb = group.peak_kb() if group is not None else None
        finally:
            os.close(started_r)
            for p in pumps:
                p.abandon()  # after an error mid-run: no descriptor left open (a no-op after finish)
            if group is not None:
                group.remove()
        code = os.waitstatus_to_exitcode(status)
        if not program_started and not (cancelled is not None and cancelled.is_set()):
            killed = ended - launched >= START_TIMEOUT_SECS
            # The chain's own words (launcher.c, bwrap) are on the run's stderr: the failure carries
            # them, so that the worker's log says why (exec refused, a limit not set, a mount failed).
            said = _last_words(stderr, err_pump)
            raise SandboxFailure(f"the sandbox did not start the program (exit status {code}"
                                 f"{f', killed after {START_TIMEOUT_SECS:.0f}s' if killed else ''}): "
                                 + (said or "its own message is in the run's stderr"))
        if report.done is not None:
            # The program's own end and figures, from the launcher: nothing of the launch chain, no
            # page cache (the cgroup's peak counts the input the program read; its RSS does not).
            status, cpu_us, memory_kb = report.done
            code = os.waitstatus_to_exitcode(status)
            sig = -code if code < 0 else None
            cpu_ms = cpu_us // 1000
        else:
            # Killed before the launcher could report (a time-out, an OOM kill of the launcher): the
            # figures of the whole chain, the best there is; the verdict does not rest on them.
            sig = -code if code < 0 else None
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) > 128:
                sig = os.WEXITSTATUS(status) - 128  # bwrap's report of its child's death by signal N
            cpu_ms = int((usage.ru_utime + usage.ru_stime) * 1000)
            # ru_maxrss of our child starts at this (forking) process's own size; the cgroup's peak does not.
            memory_kb = peak_kb if peak_kb is not None else usage.ru_maxrss
        return RunResult(
            exit_code=None if sig else code,
            signal=sig,
            cpu_ms=cpu_ms,
            wall_ms=wall_ms,
            memory_kb=memory_kb,
            oom_killed=oom,
            wall_timeout=wall_timeout,
            output_exceeded=sig == signal.SIGXFSZ or any(p.exceeded for p in pumps),
            stderr_tail=err_pump.tail_text() if err_pump is not None else "",
        )


class _LauncherReport:
    """What the launcher wrote on its pipe (non-blocking): "started", then "done <wait status> <user
    CPU us> <system CPU us> <peak RSS KiB>" once the program has ended."""

    def __init__(self, fd: int):
        self.fd = fd
        self.text = b""
        self.started = False
        self.eof = False  # every writer closed the pipe
        self.done: tuple[int, int, int] | None = None  # (wait status, CPU us, peak RSS KiB)

    def read(self) -> _LauncherReport:
        while True:
            try:
                chunk = os.read(self.fd, 256)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self.text += chunk[: 1024 - len(self.text)]
        lines = self.text.split(b"\n")
        self.started = lines[0] == b"started" and len(lines) > 1
        for line in lines[1:]:
            fields = line.split()
            if len(fields) == 5 and fields[0] == b"done" and all(f.lstrip(b"-").isdigit() for f in fields[1:]):
                status, user_us, system_us, rss_kb = (int(f) for f in fields[1:])
                self.done = (status, user_us + system_us, rss_kb)
        return self


def limits_for_compile() -> Limits:
    return Limits(cpu_ms=20000, wall_ms=30000, memory_kb=1048576, output_kb=65536, max_processes=32,
                  max_open_files=256)



def build_launcher(directory: Path) -> Path:
    """The launcher binary for this source (built static with gcc, once; by digest, so an upgrade
    builds anew and two workers share one). A launcher that cannot be built is SandboxUnavailable."""
    source = LAUNCHER_SOURCE.read_bytes()
    target = directory / f"judge-launcher-{hashlib.sha256(source).hexdigest()[:16]}"
    if target.exists():
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SandboxUnavailable("gcc is not installed: the sandbox launcher is built with it")
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        partial = directory / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
        built = subprocess.run([gcc, "-static", "-O2", "-o", str(partial), str(LAUNCHER_SOURCE)],
                               capture_output=True, text=True, timeout=120)
        if built.returncode != 0:
            raise SandboxUnavailable(f"cannot build the sandbox launcher: {built.stderr.strip()[-300:]}")
        partial.chmod(0o755)
        os.replace(partial, target)  # atomic: a concurrent build finds either nothing or a whole file
    except OSError as exc:
        raise SandboxUnavailable(f"cannot build the sandbox launcher in {directory}: {exc}") from exc
    return target


def _last_words(stderr, err_pump, limit: int = 300) -> str:
    """The end of what the run wrote on stderr, on one line: from the pump, or from a regular file the
    run was given (a pipe or DEVNULL has nothing to read back)."""
    if err_pump is not None:
        text = err_pump.tail_text()
    else:
        try:
            # Opened again for reading: the run's file may be write-only (a compile log).
            with open(f"/proc/self/fd/{stderr.fileno()}", "rb") as again:
                if not stat.S_ISREG(os.fstat(again.fileno()).st_mode):
                    return ""
                again.seek(max(0, os.fstat(again.fileno()).st_size - 4 * limit))
                text = again.read().decode(errors="replace")
        except (AttributeError, OSError, ValueError):
            return ""
    return " ".join(text.split())[-limit:]
