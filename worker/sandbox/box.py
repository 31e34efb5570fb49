"""A submission's sandbox, set up once and used for each of its tests (the worker side of
``judge-launcher --box``, see launcher.c).

Setting up a run's isolation (bwrap's user, PID, network, IPC and UTS namespaces, its mounts, the
uid switch, the cgroup) is most of what a sandboxed run costs over a bare fork/exec. A box does it
once per submission; each test is then one message to the box's PID 1, which forks the program with
the test's stdin/stdout/stderr (passed as descriptors), reaps everything it made, reports the test's
own CPU time and peak RSS, and wipes what a test could leave for the next (/tmp, /dev/shm, System V
IPC, keys) before it says "clean". The isolation is the same as a one-off run's (same bwrap
arguments, same uid, same cgroup limits); what differs is only that the namespaces are reused.

A test that overruns its wall clock, overflows its output or is cancelled ends the whole box (the
kill is the same as a one-off run's); so does a box whose wipe failed. The next test starts a new
box. A box that cannot start, or stops without reporting a test, is a SandboxFailure: never a verdict.
"""

from __future__ import annotations

import enum
import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from worker.errors import WorkerError
from worker.sandbox import cgroups
from worker.sandbox.base import (
    LAUNCHER_IN_SANDBOX,
    START_TIMEOUT_SECS,
    STDERR_TAIL_BYTES,
    WATCH_SECS,
    Limits,
    OutputPump,
    RunResult,
    SandboxFailure,
    TailPump,
    program_rlimits,
)

if TYPE_CHECKING:  # the runner makes boxes; a box only calls back into the sandbox it belongs to
    from worker.sandbox.runner import Sandbox

# How long a box may take to end after its socket is closed, before it is killed.
CLOSE_TIMEOUT_SECS = 2.0


class BoxState(enum.Enum):
    DOWN = "down"          # no box process: the next test starts one
    READY = "ready"        # the box waits for a test, its writable places empty
    RUNNING = "running"    # a test was sent; its "done" and "clean" are awaited
    CLOSED = "closed"      # the judging is over: no more tests


class BoxStateError(WorkerError, RuntimeError):
    pass


# The lifecycle's arrows: (from, transition) -> to.
TRANSITIONS = {
    (BoxState.DOWN, "started"): BoxState.READY,
    (BoxState.READY, "send_test"): BoxState.RUNNING,
    (BoxState.RUNNING, "cleaned"): BoxState.READY,
    (BoxState.RUNNING, "lost"): BoxState.DOWN,
    (BoxState.READY, "lost"): BoxState.DOWN,
    (BoxState.DOWN, "close"): BoxState.CLOSED,
    (BoxState.READY, "close"): BoxState.CLOSED,
    (BoxState.RUNNING, "close"): BoxState.CLOSED,
}


def next_state(state: BoxState, transition: str) -> BoxState:
    try:
        return TRANSITIONS[(state, transition)]
    except KeyError:
        raise BoxStateError(f"a box cannot {transition} when {state.value}") from None


class _Messages:
    """The box's reports on the socket (non-blocking): "ready", "started", "done ...", "clean",
    "unclean", "error ..."; EOF once the box has ended."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.eof = False

    def take(self) -> list[str]:
        messages = []
        while not self.eof:
            try:
                data = self.sock.recv(1024, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            messages.append(data.decode("ascii", "replace"))
        return messages


class Box:
    """Use as a context manager: ``with sandbox.box(box_dir, limits) as box: box.run(...)``."""

    def __init__(self, sandbox: Sandbox, box: Path, limits: Limits, log_path: Path):
        self.sandbox = sandbox
        self.box = box
        self.limits = limits
        self.log_path = log_path
        self.state = BoxState.DOWN
        self.starts = 0  # how many boxes this judging has started (one unless a test ended one)
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._messages: _Messages | None = None
        self._exited: int | None = None  # the box chain's pidfd
        self._group: cgroups.RunCgroup | None = None
        self._reported_cpu_us = 0  # the CPU time of the tests this box reported (for a test it could not)
        self._ended_cpu_us: int | None = None  # the last ended box chain's whole CPU time
        self._ended_peak_kb = 0  # and its cgroup's peak since the last test began
        self._oom_kills_before = 0  # the cgroup's OOM kills when the current test began
        self._ended_oom = False  # the ended box's cgroup OOM-killed something during the last test

    def __enter__(self) -> Box:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _move(self, transition: str) -> None:
        self.state = next_state(self.state, transition)

    # --- the box's process ------------------------------------------------------------------------
    def _start(self) -> None:
        sandbox, limits = self.sandbox, self.limits
        # One more process than the tests may have: the box's PID 1. The tests' own rlimits come
        # with each run message.
        self._group = sandbox.run_cgroup(limits.memory_kb, limits.max_processes + 1, "box")
        host_end, box_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [*sandbox.enter_argv(box_end.fileno(), self._group, ["core=0"]), "--",
                *sandbox._bwrap_args(self.box, writable_box=False), "--", LAUNCHER_IN_SANDBOX, "--box"]
        try:
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                                              pass_fds=(box_end.fileno(),), start_new_session=True,
                                              env={"PATH": "/usr/bin:/bin"})
        except OSError as exc:
            host_end.close()
            self._drop_group()
            raise SandboxFailure(f"cannot start the box: {exc}") from exc
        finally:
            box_end.close()
        self._sock = host_end
        self._messages = _Messages(host_end)
        self._exited = os.pidfd_open(self._proc.pid)
        self._reported_cpu_us = 0
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_SECS
        while True:
            select.select([host_end, self._exited], [], [], max(0.0, deadline - time.monotonic()))
            messages = self._messages.take()
            if messages[:1] == ["ready"]:
                self._move("started")
                return
            if messages or self._messages.eof or time.monotonic() > deadline:
                self._end()
                raise SandboxFailure(f"the box did not start ({', '.join(messages) or 'no report'}): "
                                     f"{self._log_tail()}")

    def _gone(self) -> bool:
        ready, _, _ = select.select([self._exited], [], [], 0)
        return bool(ready)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-300:].decode("utf-8", "replace").strip() or "no message"
        except OSError:
            return "no message"

    def _end(self) -> None:
        """Kill the box's processes and reap its chain (its CPU time and peak kept for a last report)."""
        self._ended_cpu_us = None
        self._ended_peak_kb = (self._group.peak_kb() or 0) if self._group is not None else 0
        self._ended_oom = self._group is not None and self._group.oom_kills() > self._oom_kills_before
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self._group is not None:
                self._group.kill_all()
            _, _, usage = os.wait4(self._proc.pid, 0)
            self._proc.returncode = 0  # reaped here: Popen must not wait for it again
            self._ended_cpu_us = int((usage.ru_utime + usage.ru_stime) * 1_000_000)
            self._proc = None
        self._close_handles()
        self._drop_group()

    def _close_handles(self) -> None:
        if self._exited is not None:
            os.close(self._exited)
            self._exited = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _drop_group(self) -> None:
        if self._group is not None:
            self._group.remove()
            self._group = None

    def close(self) -> None:
        if self.state is BoxState.CLOSED:
            return
        if self._proc is not None and self.state is BoxState.READY:
            # Closing the socket ends a waiting box by itself: its PID 1 exits, and the namespace with it.
            self._sock.close()
            self._sock = None
            ready, _, _ = select.select([self._exited], [], [], CLOSE_TIMEOUT_SECS)
            if ready:
                os.waitpid(self._proc.pid, 0)
                self._proc.returncode = 0
                self._proc = None
        self._end()
        self._move("close")

    # --- one test ---------------------------------------------------------------------------------
    def run(self, argv: list[str], *, stdin, stdout: Path, stderr: Path, limits: Limits,
            cancelled: threading.Event | None = None) -> RunResult:
        """One test in the box: as Sandbox.run with stdout and stderr given as Paths."""
        if (limits.memory_kb, limits.max_processes) != (self.limits.memory_kb, self.limits.max_processes):
            raise ValueError("a box's memory and process limits are set when it starts")
        if self.state is BoxState.READY and self._gone():
            self._lose()  # ended between tests (killed from outside): a new box, not a failed test
        if self.state is BoxState.DOWN:
            self._start()
        fields = ["run", *program_rlimits(limits, with_cgroup=self._group is not None), "--", *argv]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pumps = [OutputPump(os.fdopen(out_r, "rb", buffering=0), stdout, limits.output_kb * 1024),
                 TailPump(os.fdopen(err_r, "rb", buffering=0), stderr, limits.stderr_kb * 1024, STDERR_TAIL_BYTES)]
        err_pump = pumps[1]
        self._oom_kills_before = self._group.oom_kills() if self._group is not None else 0
        if self._group is not None:
            self._group.reset_peak()
        sent_at = time.monotonic()
        try:
            try:
                socket.send_fds(self._sock, [b"\0".join(f.encode() for f in fields)],
                                [stdin.fileno(), out_w, err_w])
            except OSError as exc:
                self._lose()
                raise SandboxFailure(f"the box did not take the test: {exc}") from exc
            finally:
                os.close(out_w)  # the program's copies are the only ones: EOF when it ends
                os.close(err_w)
            self._move("send_test")
            return self._watch(pumps, err_pump, limits, cancelled, sent_at)
        finally:
            for p in pumps:
                p.abandon()

    def _lose(self) -> None:
        self._end()
        self._move("lost")

    def _watch(self, pumps, err_pump, limits: Limits, cancelled, sent_at: float) -> RunResult:
        started_at = None
        done = None
        deadline = sent_at + START_TIMEOUT_SECS
        wall_timeout = killed = False
        error = None
        while self.state is BoxState.RUNNING:
            watched = [self._sock, self._exited] + [p.fd for p in pumps if not p.closed]
            select.select(watched, [], [], max(0.0, min(deadline - time.monotonic(), WATCH_SECS)))
            for p in pumps:
                p.pump()
            for message in self._messages.take():
                if message == "started" and started_at is None:
                    started_at = time.monotonic()
                    deadline = started_at + limits.wall_ms / 1000
                elif message.startswith("done ") and started_at is not None:
                    fields = message.split()
                    if len(fields) == 5 and all(f.lstrip("-").isdigit() for f in fields[1:]):
                        status, user_us, system_us, rss_kb = (int(f) for f in fields[1:])
                        done = (time.monotonic(), status, user_us + system_us, rss_kb)
                        self._reported_cpu_us += user_us + system_us
                elif message == "clean" and done is not None:
                    self._move("cleaned")
                elif message == "unclean" and done is not None:
                    self._lose()  # what a test left could not be wiped: the next test gets a new box
                elif message.startswith("error"):
                    error = message
            if self.state is not BoxState.RUNNING:
                break
            if error is not None or self._messages.eof:
                self._lose()
                break
            overflow = any(p.exceeded for p in pumps)
            stop = cancelled is not None and cancelled.is_set()
            if done is not None and time.monotonic() > done[0] + START_TIMEOUT_SECS:
                self._lose()  # the wipe after the test never finished: the next test gets a new box
                break
            if done is None and (time.monotonic() > deadline or overflow or stop):
                wall_timeout = started_at is not None and not (overflow or stop)
                killed = True
                self._lose()
                break
        ended = done[0] if done is not None else time.monotonic()
        for p in pumps:
            p.finish(time.monotonic() + 10)
        stopped = cancelled is not None and cancelled.is_set()
        if started_at is None and not stopped:
            raise SandboxFailure(f"the box did not start the test ({error or 'it ended'}): {self._log_tail()}")
        if self._group is not None:  # the box lives on
            oom = self._group.oom_kills() > self._oom_kills_before
        else:
            oom = self._ended_oom
        wall_ms = int((ended - (started_at or sent_at)) * 1000)
        if done is not None:
            _, status, cpu_us, memory_kb = done
            code = os.waitstatus_to_exitcode(status)
        else:
            # Killed before the box could report (by this watch: a time-out, an overflow, a cancel; or
            # by the kernel's OOM killer): the best figures there are, the chain's CPU less what its
            # earlier tests used, the cgroup's peak; the verdict does not rest on them.
            if not (killed or stopped or self._ended_oom):
                raise SandboxFailure(f"the box ended during a test without reporting it ({error or 'no report'}): "
                                     f"{self._log_tail()}")
            cpu_us = max(0, (self._ended_cpu_us or 0) - self._reported_cpu_us)
            memory_kb = self._ended_peak_kb
            code = -signal.SIGKILL
        sig = -code if code < 0 else None
        return RunResult(
            exit_code=None if sig else code,
            signal=sig,
            cpu_ms=cpu_us // 1000,
            wall_ms=wall_ms,
            memory_kb=memory_kb,
            oom_killed=oom,
            wall_timeout=wall_timeout,
            output_exceeded=sig == signal.SIGXFSZ or any(p.exceeded for p in pumps),
            stderr_tail=err_pump.tail_text(),
        )
