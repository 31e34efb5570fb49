"""judge-worker: the daemon supervisor runs (``judge-worker --config FILE``).

Start-up: check the config and every slot's sandbox, then run the judge slots (worker/slot.py:
``slots`` of them, each pinned to its CPU, one thread each, also when there is one): deliver
whatever the outbox holds, then get an assignment -> keep its lease alive -> judge -> outbox ->
deliver. The outbox and the test-data cache are the host's, shared by its slots. The main thread
only watches for a stop (worker/stop_signals.py) and for its slots to end.
SIGTERM (or SIGINT), whenever it comes: every slot finishes the submission it is judging (its result
goes through the outbox), takes no new work (parked long-poll acquires are cut short), and the
worker exits 0. A lease whose heartbeat answers 410 is abandoned at once and nothing is reported for it.

A sandbox that fails to start a program is this machine's failure, never a verdict: the submission
is judged again (a transient shortage passes); if the sandbox keeps failing, an arbiter lease is
handed back so that another worker judges it (a legacy claim, which nothing would ever reclaim,
gets system_error), and that slot takes no new work until its sandbox self-test passes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from arbiter.protocol import logs
from arbiter.protocol.delivery import Delivery, DeliveryOutcome
from worker import config as config_mod
from worker.backoff import Backoff
from worker.delivery.outbox import Outbox
from worker.judging.datastore import DataStore
from worker.sandbox.runner import Sandbox, SandboxUnavailable
from worker.slot import JudgeSlot
from worker.stop_signals import StopSignals

log = logging.getLogger("worker")


def make_transport(cfg, slot: int | None = None):
    if cfg.transport == "arbiter":
        from worker.delivery.transport_arbiter import ArbiterTransport

        return ArbiterTransport(cfg, slot)
    from worker.delivery.transport_direct import DirectTransport

    return DirectTransport(cfg)


class Worker:
    """One worker host: its judge slots and what they share (outbox, test-data cache, stop signal)."""

    def __init__(self, cfg, sandbox: Sandbox | None = None):
        self.cfg = cfg
        self.stopping = threading.Event()
        self.outbox = Outbox(cfg.outbox_dir)
        self._delivering = threading.Lock()  # one delivery pass at a time, oldest entry first
        self._judged_lock = threading.Lock()
        self.judged = 0
        self.slots = [JudgeSlot(self, i, (cfg.slot_cpus[i],) if cfg.slot_cpus else (), sandbox)
                      for i in range(cfg.slots)]
        self.data_store = None
        if cfg.transport == "arbiter":
            # Test data the lease names and this worker lacks is fetched from the arbiter (the shipped
            # directory serves as a pre-warmed cache); the legacy transport has no arbiter to ask.
            # One cache for the host, with a client of its own: a slot's client may be parked in a
            # long-poll (and is cut short on SIGTERM) while another slot fetches.
            self.data_store = DataStore(cfg.data_dir, make_transport(cfg).client, prewarmed_dir=cfg.testdata_dir,
                                        max_bytes=cfg.data_cache_max_mb << 20)
            for slot in self.slots:
                slot.judge.data_store = self.data_store
        self._fallback = None  # the other transport, for outbox entries written under it

    def make_transport(self, slot: int | None):
        return make_transport(self.cfg, slot)

    def count_judged(self) -> None:
        with self._judged_lock:
            self.judged += 1

    # -- outbox ---------------------------------------------------------------------
    def _transport_for(self, entry):
        own = self.slots[0].transport
        if entry.transport == own.name:
            return own
        if entry.transport == "direct" and self.cfg.dsn or entry.transport == "arbiter" and self.cfg.arbiter_urls:
            if self._fallback is None:
                from worker.delivery.transport_arbiter import ArbiterTransport
                from worker.delivery.transport_direct import DirectTransport

                self._fallback = DirectTransport(self.cfg) if entry.transport == "direct" else ArbiterTransport(self.cfg)
            return self._fallback
        return own

    def deliver_outbox(self, give_up_on_stop: bool = True) -> None:
        """Deliver every entry, oldest first; each retried with backoff until 200 or 410. Slots deliver
        one at a time: a slot that finds another delivering waits, then delivers what is left."""
        with self._delivering:
            self._deliver_all(give_up_on_stop)

    def _deliver_all(self, give_up_on_stop: bool) -> None:
        for path, entry in self.outbox.pending():
            backoff = Backoff(self.cfg.backoff_initial_secs, self.cfg.backoff_max_secs)
            while True:
                outcome, entry = self._deliver_one(path, entry)
                if outcome.done:
                    self.outbox.clear(path)
                    break
                if outcome.kind is Delivery.REJECTED:
                    self.outbox.reject(path, outcome.why)
                    break
                if give_up_on_stop and self.stopping.is_set():
                    log.info("stopping with results still in the outbox; they are delivered on the next start")
                    return
                self.stopping.wait(backoff.next_delay(outcome.retry_after))

    def _deliver_one(self, path, entry):
        """One delivery of ``entry`` (stored at ``path``): (outcome, the entry as it now stands).

        A 413 (the arbiter's body limit below this worker's detail budget) is answered by sending the
        same verdict, time, memory and failed test with the rest of the detail left out: the entry is
        rewritten so first (a crash keeps the shrunk one), then sent again at once. A verdict is never
        dropped for its detail's size."""
        outcome = self._transport_for(entry).deliver(entry)
        if outcome.kind is Delivery.TOO_LARGE and "detail_dropped" not in entry.detail:
            entry = entry.with_minimal_detail("the arbiter refused the full detail as too large (HTTP 413)")
            self.outbox.rewrite(path, entry)
            log.warning("result over the arbiter's body limit; sending it without its detail",
                        extra={"submission_id": entry.submission_id, "verdict": entry.verdict})
            outcome = self._transport_for(entry).deliver(entry)
        if outcome.kind is Delivery.TOO_LARGE:  # even without its detail: the limit is misconfigured
            return DeliveryOutcome(Delivery.REJECTED, "HTTP 413 even with a minimal detail"), entry
        if outcome.done:
            log.info("result delivered" if outcome.kind is Delivery.DELIVERED else "result refused as stale (410)",
                     extra={"submission_id": entry.submission_id, "verdict": entry.verdict,
                            "lease_gen": entry.lease_gen})
        return outcome, entry

    def resend_rejected(self, out=sys.stdout) -> int:
        """The operator's command (judge-worker --resend-rejected), once the cause is fixed: each entry in
        rejected/ is sent again; one delivered (or stale: 410) leaves rejected/, one still refused
        stays there. One line each. Exit code 0 when rejected/ is empty afterwards, else 1."""
        left = 0
        for path, entry in self.outbox.rejected():
            if entry is None:
                print(f"{path.name}: unreadable; left in rejected/", file=out)
                left += 1
                continue
            outcome, entry = self._deliver_one(path, entry)
            what = f"{path.name}: submission {entry.submission_id} {entry.verdict}"
            if outcome.done:
                self.outbox.clear(path)
                print(f"{what}: {'delivered' if outcome.kind is Delivery.DELIVERED else 'stale (410): nothing to deliver'}",
                      file=out)
            else:
                print(f"{what}: {outcome.why or outcome.kind.value}; left in rejected/", file=out)
                left += 1
        return 0 if left == 0 else 1

    # -- the slots ------------------------------------------------------------------
    def stop(self) -> None:
        """Take no new work, and cut every parked long-poll short (it would otherwise hold the stop,
        and every restart, for up to long_poll_secs). What is being judged is finished."""
        self.stopping.set()
        for slot in self.slots:
            slot.interrupt()

    def _run_slot(self, slot: JudgeSlot) -> None:
        # What the outbox held at start is delivered before any slot asks for work (one slot delivers,
        # the others wait for it); a stop meanwhile leaves it for the next start.
        try:
            self.deliver_outbox()
        except Exception:  # noqa: BLE001 - a bug here must not end the slot's thread: its loop delivers again
            log.exception("delivering the outbox at start failed", extra=slot.tag)
        slot.run()

    def run(self, stop_signals: StopSignals | None = None, watch_secs: float = 0.5) -> int:
        """Runs the slots until they stop; a stop signal (if given) stops them. Returns the exit code."""
        for slot in self.slots:
            slot.self_test()
        log.info("worker started", extra={"worker_id": self.cfg.worker_id, "kind": self.cfg.kind,
                                          "transport": self.cfg.transport, "slots": self.cfg.slots,
                                          "slot_cpus": list(self.cfg.slot_cpus),
                                          "cgroups": self.slots[0].sandbox.cgroup_version})
        threads = [threading.Thread(target=self._run_slot, args=(slot,), name=f"slot-{slot.index}", daemon=True)
                   for slot in self.slots]
        for thread in threads:
            thread.start()
        while alive := [thread for thread in threads if thread.is_alive()]:
            if stop_signals is None:  # in process: whoever runs it calls stop()
                alive[0].join()
                continue
            received = stop_signals.wait(watch_secs)
            if received is not None and not self.stopping.is_set():
                log.info("stop requested", extra={"signal": received.name})
                self.stop()
        log.info("worker stopped", extra={"judged": self.judged})
        return 0


def list_rejected(outbox: Outbox, out=sys.stdout) -> int:
    """judge-worker --rejected: one line per entry kept in rejected/ (exit 0; 1 when there are any).
    Reads the outbox only: no slot, sandbox or transport is made for it."""
    found = outbox.rejected()
    for path, entry in found:
        if entry is None:
            print(f"{path.name}: unreadable", file=out)
        else:
            print(f"{path.name}: submission {entry.submission_id} {entry.verdict} "
                  f"(lease gen {entry.lease_gen}, via {entry.transport})", file=out)
    print(f"{len(found)} rejected result(s) in {outbox.rejected_dir}", file=out)
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="judge-worker", description="Judge worker daemon")
    parser.add_argument("--config", required=True, help="TOML config file")
    parser.add_argument("--check-config", action="store_true", help="validate the config and the sandbox, then exit")
    parser.add_argument("--rejected", action="store_true",
                        help="list the results the arbiter refused for good (outbox/rejected/), then exit")
    parser.add_argument("--resend-rejected", action="store_true",
                        help="send every refused result again (once its cause is fixed), then exit")
    args = parser.parse_args(argv)
    logs.configure()
    try:
        cfg = config_mod.load(args.config)
        for directory in (cfg.outbox_dir, cfg.work_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if args.rejected:
            return list_rejected(Outbox(cfg.outbox_dir))
        worker = Worker(cfg)
        if args.resend_rejected:
            return worker.resend_rejected()
        if args.check_config:
            for slot in worker.slots:
                slot.self_test()
            print(f"config ok: {cfg.worker_id} ({cfg.kind}) via {cfg.transport}, {cfg.slots} slot(s)")
            return 0
    except config_mod.ConfigError as exc:
        print(f"judge-worker: config error: {exc}", file=sys.stderr)
        return 2
    except SandboxUnavailable as exc:
        print(f"judge-worker: sandbox unavailable: {exc}", file=sys.stderr)
        return 3

    # Before the self-tests: a stop that comes while they run is seen as soon as the slots start.
    return worker.run(StopSignals())


if __name__ == "__main__":
    sys.exit(main())
