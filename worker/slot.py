"""One judge slot of a worker: its own transport, sandbox (pinned to its CPU), work directory and
judge, and the loop get an assignment -> keep its lease alive -> judge -> outbox.

A worker host runs ``slots`` of these side by side (worker/main.py); they share the host's outbox,
test-data cache and stop signal. Every lease is fenced exactly as with one slot: each slot holds its
own leases, tokens and heartbeats, and the arbiter records which slot a lease went to.

A slot's life is an explicit state machine (SlotState); every change is a named transition:

    ask        STARTING | IDLE | STEPPING_ASIDE | BROKEN -> ASKING   a long-poll acquire is out
    judge      ASKING            -> JUDGING          it holds a lease (or a legacy claim)
    idle       ASKING | JUDGING  -> IDLE             nothing came, or the judging is over and in the outbox
    step_aside JUDGING           -> STEPPING_ASIDE   it handed back what it cannot judge; waits a while
    break_     JUDGING | BROKEN  -> BROKEN           its sandbox keeps failing: no work until the self-test passes
    recover    BROKEN            -> IDLE             the self-test passes again
    stop       any               -> STOPPED          the worker is stopping; the slot takes no more work
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import TYPE_CHECKING, Protocol

from arbiter.protocol.vocabulary import VerdictCode
from worker import faults
from worker.backoff import Backoff
from worker.errors import WorkerError
from worker.judging.judge import CannotJudgeHere, Judge, JudgeCancelled, Verdict
from worker.sandbox.runner import Sandbox, SandboxFailure, SandboxUnavailable

if TYPE_CHECKING:
    from worker.config import WorkerConfig
    from worker.delivery.outbox import Outbox

log = logging.getLogger("worker")

# Stepping aside after a hand-back: 1, 2, 4 ... 30 s (±20 %), back to 1 s after a judging.
STEP_ASIDE_INITIAL_SECS = 1.0
STEP_ASIDE_MAX_SECS = 30.0


class SlotState(enum.Enum):
    STARTING = "starting"
    ASKING = "asking"
    JUDGING = "judging"
    IDLE = "idle"
    STEPPING_ASIDE = "stepping_aside"
    BROKEN = "broken"
    STOPPED = "stopped"


S = SlotState
TRANSITIONS: dict[str, tuple[frozenset[SlotState], SlotState]] = {
    "ask": (frozenset({S.STARTING, S.IDLE, S.STEPPING_ASIDE, S.BROKEN}), S.ASKING),
    "judge": (frozenset({S.ASKING}), S.JUDGING),
    "idle": (frozenset({S.ASKING, S.JUDGING}), S.IDLE),
    "step_aside": (frozenset({S.JUDGING}), S.STEPPING_ASIDE),
    "break_": (frozenset({S.JUDGING, S.BROKEN}), S.BROKEN),
    "recover": (frozenset({S.BROKEN}), S.IDLE),
    "stop": (frozenset(SlotState), S.STOPPED),
}


class IllegalTransition(WorkerError, RuntimeError):
    pass


class SlotLifecycle:
    """The state of one slot and its transitions (thread-safe: the status reader is another thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.state = SlotState.STARTING

    def go(self, transition: str) -> SlotState:
        allowed, target = TRANSITIONS[transition]
        with self._lock:
            if self.state not in allowed:
                raise IllegalTransition(f"{transition}: not from {self.state.value}")
            self.state = target
            return target


class SlotOwner(Protocol):
    """What a slot needs of the worker that runs it (worker.main.Worker): its config, the stop, the
    shared outbox and its one deliverer, a transport of its own, and a count of judged submissions."""

    cfg: WorkerConfig
    stopping: threading.Event
    outbox: Outbox

    def make_transport(self, slot: int | None): ...

    def deliver_outbox(self, give_up_on_stop: bool = True) -> None: ...

    def count_judged(self) -> None: ...


class JudgeSlot:
    def __init__(self, worker: SlotOwner, index: int, cpus: tuple[int, ...], sandbox: Sandbox | None = None):
        cfg = worker.cfg
        self.worker = worker
        self.cfg = cfg
        self.index = index
        self.lifecycle = SlotLifecycle()
        # One slot keeps the paths a worker always had; several get one work directory each.
        self.work_dir = cfg.work_dir if cfg.slots == 1 else cfg.work_dir / f"slot-{index}"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.sandbox = sandbox or Sandbox(uid=cfg.sandbox.uid, gid=cfg.sandbox.gid,
                                          cgroup_parent=cfg.sandbox.cgroup_parent,
                                          launcher_dir=cfg.work_dir / "launcher", cpus=cpus)
        self.judge = Judge(self.sandbox, cfg.testdata_dir, self.work_dir, output_limit_kb=cfg.sandbox.output_limit_kb,
                           wall_factor=cfg.sandbox.wall_factor, max_processes=cfg.sandbox.max_processes,
                           stderr_limit_kb=cfg.sandbox.stderr_limit_kb)
        self.transport = worker.make_transport(None if cfg.slots == 1 else index)
        # Every log line of a slot names it (when there are several).
        self.tag = {} if cfg.slots == 1 else {"slot": index}
        self.sandbox_failed = False  # take no work until the self-test passes again
        self.sandbox_retry_delays = (1.0, 3.0)  # judging again after a sandbox failure
        self._self_test_backoff = Backoff(cfg.backoff_initial_secs, 60.0)
        # After handing back a submission it cannot judge (stale or missing test data, a checker of
        # another digest), the slot steps aside for a while before it asks again: a parked worker
        # that has what it takes gets the submission meanwhile, and a worker that lacks it cannot
        # use up the submission's releases (max_releases) in a fraction of a second.
        self._step_aside = Backoff(STEP_ASIDE_INITIAL_SECS, STEP_ASIDE_MAX_SECS)

    @property
    def state(self) -> SlotState:
        return self.lifecycle.state

    def _log(self, level: int, message: str, **extra) -> None:
        log.log(level, message, extra={**self.tag, **extra})

    def self_test(self) -> None:
        self.sandbox.self_test(self.work_dir / "selftest")

    def sandbox_works(self) -> bool:
        """After a sandbox failure: does the self-test pass again? (Waits with backoff if not.)"""
        try:
            self.self_test()
        except (SandboxUnavailable, OSError) as exc:  # self_test reports a SandboxFailure as unavailable
            delay = self._self_test_backoff.next_delay()
            self._log(logging.ERROR, "sandbox still failing; taking no work", error=str(exc)[:300],
                      retry_in_secs=round(delay, 1))
            self.worker.stopping.wait(delay)
            return False
        self._log(logging.INFO, "sandbox works again; taking work")
        self._self_test_backoff.reset()
        self.sandbox_failed = False
        self.lifecycle.go("recover")
        return True

    def judge_despite_sandbox_hiccups(self, job, lost: threading.Event):
        """Judge; after a SandboxFailure judge again a little later. Raises the last SandboxFailure."""
        for delay in (*self.sandbox_retry_delays, None):
            try:
                return self.judge.judge(job, cancelled=lost)
            except SandboxFailure as exc:
                if delay is None:
                    raise
                self._log(logging.WARNING, "sandbox failed; judging again", submission_id=job.submission_id,
                          error=str(exc)[:600], retry_in_secs=delay)
                if lost.wait(delay):
                    raise JudgeCancelled() from exc

    def _hand_back(self, assignment, keepalive, what: str, reason: str) -> None:
        """An arbiter lease this slot will not judge goes back at once, for another worker (if the
        arbiter cannot be reached, the lease expires and the janitor hands it on)."""
        self._log(logging.ERROR, f"{what}; handing the lease back so that another worker judges it",
                  submission_id=assignment.job.submission_id, reason=reason[:300])
        if keepalive is not None:  # None: its heartbeats have stopped already
            keepalive.stop()
        self.transport.release(assignment, reason)

    def _step_aside_a_while(self) -> None:
        """After a hand-back for a reason of this host's: wait (longer each time) before asking again."""
        self.lifecycle.go("step_aside")
        delay = self._step_aside.next_delay()
        self._log(logging.INFO, "stepping aside before asking for work again", delay_secs=round(delay, 2))
        self.worker.stopping.wait(delay)

    def run_once(self) -> bool:
        """One assignment judged and put in the outbox. False when there was nothing to do."""
        if self.sandbox_failed and not self.sandbox_works():
            return False
        self.lifecycle.go("ask")
        assignment = self.transport.next_assignment(self.worker.stopping)
        if assignment is None:
            self.lifecycle.go("idle")
            faults.between_acquires(self.worker.stopping)
            return False
        self.lifecycle.go("judge")
        job = assignment.job
        faults.after_assignment(self.worker.stopping)
        if self.worker.stopping.is_set() and assignment.lease_token is not None:
            # Stopping: hand the new lease back (pending again at once, no attempt used); if the arbiter
            # cannot be reached, the unconfirmed lease goes back to the queue by itself.
            self._log(logging.INFO, "stopping: handing the new lease back", submission_id=job.submission_id)
            self.transport.release(assignment, "the worker is stopping")
            self.lifecycle.go("idle")
            return True
        # A legacy claim made as the stop arrived is judged like the one in hand: nothing would ever
        # hand it back (the legacy scheme has no expiry), so leaving it would strand it in 'judging'.
        self._log(logging.INFO, "judging", submission_id=job.submission_id, language=job.language,
                  lease_gen=assignment.lease_gen)
        verdict = self._judge(assignment)
        if verdict is None:
            return True
        try:
            self.worker.outbox.put(self.transport.entry_for(assignment, verdict))
        except OSError as exc:
            if assignment.lease_token is None:
                raise  # a legacy claim has nobody to hand it back to: the loop logs it and goes on
            # This host's disk (full, read-only) cannot keep the result: it is not delivered without its
            # durable copy, and the lease goes back for another worker rather than expiring here.
            self._hand_back(assignment, None, "the outbox cannot be written", f"outbox: {exc}")
            self._step_aside_a_while()
            return True
        faults.after_outbox_write()
        if self.state is SlotState.JUDGING:  # a legacy claim's system_error leaves the slot BROKEN
            self.lifecycle.go("idle")
        self.worker.count_judged()
        self._step_aside.reset()
        self._log(logging.INFO, "judged", submission_id=job.submission_id, verdict=verdict.verdict,
                  time_ms=verdict.time_ms, memory_kb=verdict.memory_kb)
        self.worker.deliver_outbox()
        return True

    def _judge(self, assignment) -> Verdict | None:
        """The verdict to report, or None when there is none (the lease was lost or handed back; the
        state machine has moved on accordingly)."""
        keepalive = self.transport.keep_alive(assignment)
        try:
            verdict = self._verdict(assignment, keepalive)
        finally:
            keepalive.stop()
        if verdict is not None and keepalive.lost.is_set():
            self._log(logging.WARNING, "lease lost while judging; result dropped",
                      submission_id=assignment.job.submission_id)
            if self.state is SlotState.JUDGING:
                self.lifecycle.go("idle")
            return None
        return verdict

    def _verdict(self, assignment, keepalive) -> Verdict | None:
        job = assignment.job
        if keepalive.lost.is_set():
            self.lifecycle.go("idle")
            return None
        try:
            return self.judge_despite_sandbox_hiccups(job, keepalive.lost)
        except JudgeCancelled:
            self._log(logging.WARNING, "judging abandoned: lease lost", submission_id=job.submission_id)
            self.lifecycle.go("idle")
            return None
        except SandboxFailure as exc:
            self.sandbox_failed = True
            self.lifecycle.go("break_")
            if assignment.lease_token is not None:
                self._hand_back(assignment, keepalive, "sandbox keeps failing", f"sandbox failure: {exc}")
                return None
            self._log(logging.ERROR, "sandbox keeps failing; reporting system_error",
                      submission_id=job.submission_id, error=str(exc)[:600])
            return Verdict(VerdictCode.system_error, detail={"reason": f"sandbox failure: {exc}"})
        except CannotJudgeHere as exc:
            if assignment.lease_token is not None:
                self._hand_back(assignment, keepalive, "cannot judge this submission here", str(exc))
                self._step_aside_a_while()
                return None
            self._log(logging.ERROR, "cannot judge this submission here; reporting system_error",
                      submission_id=job.submission_id, reason=str(exc)[:300])
            return Verdict(VerdictCode.system_error, detail={"reason": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a judge bug must not lose the lease silently
            log.exception("judge failed", extra={**self.tag, "submission_id": job.submission_id})
            return Verdict(VerdictCode.system_error, detail={"reason": f"judge error: {type(exc).__name__}"})

    def run(self) -> None:
        """The slot's loop until the worker stops (a thread of its own when there are several)."""
        while not self.worker.stopping.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - keep serving; supervisor would restart us anyway
                log.exception("worker loop error", extra=self.tag)
                if self.state in (SlotState.ASKING, SlotState.JUDGING):
                    self.lifecycle.go("idle")
                self.worker.stopping.wait(1.0)
        self.lifecycle.go("stop")
        self.transport.close()

    def interrupt(self) -> None:
        self.transport.interrupt()

