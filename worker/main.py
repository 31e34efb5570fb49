"""judge-worker: the daemon supervisor runs (``judge-worker --config FILE``).

Start-up: check the config and the sandbox, deliver whatever the outbox holds,
then loop: get an assignment -> keep its lease alive -> judge -> outbox -> deliver.
SIGTERM: finish the submission being judged (its result goes through the
outbox), take no new work (a parked long-poll acquire is cut short), exit 0. A lease whose heartbeat answers 410 is
abandoned at once and nothing is reported for it.

A sandbox that fails to start a program is this machine's failure, never a
verdict: the submission is judged again (a transient shortage passes); if the
sandbox keeps failing, an arbiter lease is left to expire so that another
worker judges it (a legacy claim, which nothing would ever reclaim, gets
system_error), and no new work is taken until the sandbox self-test passes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from arbiter import logs

from . import config as config_mod
from . import faults
from .backoff import Backoff
from .datastore import DataStore
from .judge import CannotJudgeHere, Judge, JudgeCancelled, Verdict
from .outbox import Outbox
from .sandbox import Sandbox, SandboxFailure, SandboxUnavailable

log = logging.getLogger("worker")

# Stepping aside after a hand-back: 1, 2, 4 ... 30 s (±20 %), back to 1 s after a judging.
STEP_ASIDE_INITIAL_SECS = 1.0
STEP_ASIDE_MAX_SECS = 30.0


def make_transport(cfg):
    if cfg.transport == "arbiter":
        from .transport_arbiter import ArbiterTransport

        return ArbiterTransport(cfg)
    from .transport_direct import DirectTransport

    return DirectTransport(cfg)


class Worker:
    def __init__(self, cfg, sandbox: Sandbox | None = None):
        self.cfg = cfg
        self.stopping = threading.Event()
        self.outbox = Outbox(cfg.outbox_dir)
        self.sandbox = sandbox or Sandbox(uid=cfg.sandbox.uid, gid=cfg.sandbox.gid,
                                          cgroup_parent=cfg.sandbox.cgroup_parent,
                                          launcher_dir=cfg.work_dir / "launcher")
        self.judge = Judge(self.sandbox, cfg.testdata_dir, cfg.work_dir, output_limit_kb=cfg.sandbox.output_limit_kb,
                           wall_factor=cfg.sandbox.wall_factor, max_processes=cfg.sandbox.max_processes,
                           stderr_limit_kb=cfg.sandbox.stderr_limit_kb)
        self.transport = make_transport(cfg)
        if cfg.transport == "arbiter":
            # Test data the lease names and this worker lacks is fetched from the arbiter (the shipped
            # directory serves as a pre-warmed cache); the legacy transport has no arbiter to ask.
            self.judge.data_store = DataStore(cfg.data_dir, self.transport.client, prewarmed_dir=cfg.testdata_dir,
                                              max_bytes=cfg.data_cache_max_mb << 20)
        self._fallback = None  # the other transport, for outbox entries written under it
        self.judged = 0
        self.sandbox_failed = False  # take no work until the self-test passes again
        self.sandbox_retry_delays = (1.0, 3.0)  # judging again after a sandbox failure
        self._self_test_backoff = Backoff(cfg.backoff_initial_secs, 60.0)
        # After handing back a submission it cannot judge (stale or missing test data, a checker of
        # another digest), the worker steps aside for a while before it asks again: a parked worker
        # that has what it takes gets the submission meanwhile, and a worker that lacks it cannot
        # use up the submission's releases (max_releases) in a fraction of a second.
        self._step_aside = Backoff(STEP_ASIDE_INITIAL_SECS, STEP_ASIDE_MAX_SECS)

    # -- outbox ---------------------------------------------------------------------
    def _transport_for(self, entry):
        if entry.transport == self.transport.name:
            return self.transport
        if entry.transport == "direct" and self.cfg.dsn or entry.transport == "arbiter" and self.cfg.arbiter_urls:
            if self._fallback is None:
                from .transport_arbiter import ArbiterTransport
                from .transport_direct import DirectTransport

                self._fallback = DirectTransport(self.cfg) if entry.transport == "direct" else ArbiterTransport(self.cfg)
            return self._fallback
        return self.transport

    def deliver_outbox(self, give_up_on_stop: bool = True) -> None:
        """Deliver every entry, oldest first; each retried with backoff until 200 or 410."""
        for path, entry in self.outbox.pending():
            backoff = Backoff(self.cfg.backoff_initial_secs, self.cfg.backoff_max_secs)
            while True:
                outcome = self._transport_for(entry).deliver(entry)
                if outcome in ("delivered", "gone"):
                    self.outbox.clear(path)
                    log.info("result delivered" if outcome == "delivered" else "result refused as stale (410)",
                             extra={"submission_id": entry.submission_id, "verdict": entry.verdict,
                                    "lease_gen": entry.lease_gen})
                    break
                if outcome.startswith("reject:"):
                    self.outbox.reject(path, outcome[len("reject:"):])
                    break
                if give_up_on_stop and self.stopping.is_set():
                    log.info("stopping with results still in the outbox; they are delivered on the next start")
                    return
                self.stopping.wait(backoff.next_delay())

    # -- the loop ---------------------------------------------------------------------
    def sandbox_works(self) -> bool:
        """After a sandbox failure: does the self-test pass again? (Waits with backoff if not.)"""
        try:
            self.sandbox.self_test(self.cfg.work_dir / "selftest")
        except (SandboxUnavailable, OSError) as exc:  # self_test reports a SandboxFailure as unavailable
            delay = self._self_test_backoff.next_delay()
            log.error("sandbox still failing; taking no work", extra={"error": str(exc)[:300],
                                                                     "retry_in_secs": round(delay, 1)})
            self.stopping.wait(delay)
            return False
        log.info("sandbox works again; taking work")
        self._self_test_backoff.reset()
        self.sandbox_failed = False
        return True

    def judge_despite_sandbox_hiccups(self, job, lost: threading.Event):
        """Judge; after a SandboxFailure judge again a little later. Raises the last SandboxFailure."""
        for delay in (*self.sandbox_retry_delays, None):
            try:
                return self.judge.judge(job, cancelled=lost)
            except SandboxFailure as exc:
                if delay is None:
                    raise
                log.warning("sandbox failed; judging again", extra={"submission_id": job.submission_id,
                                                                    "error": str(exc)[:300], "retry_in_secs": delay})
                if lost.wait(delay):
                    raise JudgeCancelled() from exc

    def _hand_back(self, assignment, keepalive, what: str, reason: str) -> None:
        """An arbiter lease this worker will not judge goes back at once, for another worker (if the
        arbiter cannot be reached, the lease expires and the janitor hands it on)."""
        log.error(f"{what}; handing the lease back so that another worker judges it",
                  extra={"submission_id": assignment.job.submission_id, "reason": reason[:300]})
        keepalive.stop()
        self.transport.release(assignment, reason)

    def run_once(self) -> bool:
        """One assignment judged and delivered. False when there was nothing to do."""
        if self.sandbox_failed and not self.sandbox_works():
            return False
        assignment = self.transport.next_assignment(self.stopping)
        if assignment is None:
            return False
        job = assignment.job
        faults.after_assignment()
        if self.stopping.is_set() and assignment.lease_token is not None:
            # Stopping: hand the new lease back (pending again at once, no attempt used); if the arbiter
            # cannot be reached, the unconfirmed lease goes back to the queue by itself.
            log.info("stopping: handing the new lease back", extra={"submission_id": job.submission_id})
            self.transport.release(assignment, "the worker is stopping")
            return True
        # A legacy claim made as the stop arrived is judged like the one in hand: nothing would ever
        # hand it back (the legacy scheme has no expiry), so leaving it would strand it in 'judging'.
        log.info("judging", extra={"submission_id": job.submission_id, "language": job.language,
                                   "lease_gen": assignment.lease_gen})
        keepalive = self.transport.keep_alive(assignment)
        try:
            if keepalive.lost.is_set():
                return True
            try:
                verdict = self.judge_despite_sandbox_hiccups(job, keepalive.lost)
            except JudgeCancelled:
                log.warning("judging abandoned: lease lost", extra={"submission_id": job.submission_id})
                return True
            except SandboxFailure as exc:
                self.sandbox_failed = True
                if assignment.lease_token is not None:
                    self._hand_back(assignment, keepalive, "sandbox keeps failing", f"sandbox failure: {exc}")
                    return True
                log.error("sandbox keeps failing; reporting system_error", extra={
                    "submission_id": job.submission_id, "error": str(exc)[:300]})
                verdict = Verdict("system_error", detail={"reason": f"sandbox failure: {exc}"})
            except CannotJudgeHere as exc:
                if assignment.lease_token is not None:
                    self._hand_back(assignment, keepalive, "cannot judge this submission here", str(exc))
                    delay = self._step_aside.next_delay()
                    log.info("stepping aside before asking for work again", extra={"delay_secs": round(delay, 2)})
                    self.stopping.wait(delay)
                    return True
                log.error("cannot judge this submission here; reporting system_error",
                          extra={"submission_id": job.submission_id, "reason": str(exc)[:300]})
                verdict = Verdict("system_error", detail={"reason": str(exc)})
            except Exception as exc:  # noqa: BLE001 - a judge bug must not lose the lease silently
                log.exception("judge failed", extra={"submission_id": job.submission_id})
                verdict = Verdict("system_error", detail={"reason": f"judge error: {type(exc).__name__}"})
        finally:
            keepalive.stop()
        if keepalive.lost.is_set():
            log.warning("lease lost while judging; result dropped", extra={"submission_id": job.submission_id})
            return True
        self.outbox.put(self.transport.entry_for(assignment, verdict))
        faults.after_outbox_write()
        self.judged += 1
        self._step_aside.reset()
        log.info("judged", extra={"submission_id": job.submission_id, "verdict": verdict.verdict,
                                  "time_ms": verdict.time_ms, "memory_kb": verdict.memory_kb})
        self.deliver_outbox()
        return True

    def run(self) -> int:
        self.sandbox.self_test(self.cfg.work_dir / "selftest")
        log.info("worker started", extra={"worker_id": self.cfg.worker_id, "kind": self.cfg.kind,
                                          "transport": self.cfg.transport, "cgroups": self.sandbox.cgroup_version})
        self.deliver_outbox()
        while not self.stopping.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - keep serving; supervisor would restart us anyway
                log.exception("worker loop error")
                self.stopping.wait(1.0)
        self.transport.close()
        log.info("worker stopped", extra={"judged": self.judged})
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="judge-worker", description="Judge worker daemon")
    parser.add_argument("--config", required=True, help="TOML config file")
    parser.add_argument("--check-config", action="store_true", help="validate the config and the sandbox, then exit")
    args = parser.parse_args(argv)
    logs.configure()
    try:
        cfg = config_mod.load(args.config)
        for directory in (cfg.outbox_dir, cfg.work_dir):
            directory.mkdir(parents=True, exist_ok=True)
        worker = Worker(cfg)
        if args.check_config:
            worker.sandbox.self_test(cfg.work_dir / "selftest")
            print(f"config ok: {cfg.worker_id} ({cfg.kind}) via {cfg.transport}")
            return 0
    except config_mod.ConfigError as exc:
        print(f"judge-worker: config error: {exc}", file=sys.stderr)
        return 2
    except SandboxUnavailable as exc:
        print(f"judge-worker: sandbox unavailable: {exc}", file=sys.stderr)
        return 3

    def on_term(signum, frame):
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        worker.stopping.set()
        # A parked long-poll would otherwise hold the stop (and every restart) for up to long_poll_secs.
        worker.transport.interrupt()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
