"""The dispatcher: parked acquire requests and the one loop that matches them with work.

Parked requests live only in memory (principle 1: losing them loses nothing;
a worker whose request vanished just asks again). The loop wakes on a NOTIFY
(work became pending), on a newly parked request, or on a short tick. Each
round: look at the queue -> match (home workers first, fair round-robin among
equals, language-capable) -> conditional acquire -> wake the parked request,
and only then marks the round complete (the readiness signal).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time

import psycopg

from . import db, faults, leases, sdnotify
from .metrics import METRICS
from .tickets import ParkingLot, Ticket

log = logging.getLogger("arbiter.dispatcher")
LEGACY_RECHECK_SECS = 5.0
# How long a leaving request waits for the acquire transaction a round is running for it.
LEAVE_WAIT_SECS = 5.0


class Dispatcher:
    def __init__(self, settings, health: db.DbHealth, is_leader, notifier: sdnotify.Notifier | None = None):
        self.settings = settings
        self.notifier = notifier or sdnotify.Notifier({})
        self.health = health
        self.is_leader = is_leader
        self.lot = ParkingLot(settings.max_parked, settings.max_parked_per_worker)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dispatcher", daemon=True)
        self._listen: psycopg.Connection | None = None
        self._work: psycopg.Connection | None = None
        self.legacy_compat = False
        self.last_round_completed: float | None = None
        self.rounds = 0
        self._legacy_checked_at: float | None = None  # monotonic; the schema is looked at again now and then

    # -- called from request threads (the ticket transitions are in tickets.py) -----
    def park(self, ticket: Ticket) -> None:
        self.lot.park(ticket)
        self.wake()

    def unpark(self, ticket: Ticket, wait_if_matching: float = LEAVE_WAIT_SECS) -> leases.Lease | None:
        """The request is leaving (answered or timed out): its lease if it got one."""
        return self.lot.leave(ticket, wait_if_matching)

    async def unpark_async(self, ticket: Ticket, wait_if_matching: float = LEAVE_WAIT_SECS) -> leases.Lease | None:
        """``unpark`` for a request's coroutine: waiting for a running match holds no thread."""
        done, lease = self.lot.begin_leave(ticket)
        if done:
            return lease
        await ticket.event.wait_async(wait_if_matching)
        return self.lot.end_leave(ticket)

    def close_parking(self) -> None:
        """The arbiter is stopping: every parked request is answered now and nothing parks again."""
        self.lot.close()

    def cancel_all(self) -> None:
        """Leadership lost: every parked request is answered (it will retry elsewhere or later)."""
        self.lot.withdraw_all()

    def parked_snapshot(self) -> list[Ticket]:
        return self.lot.parked()

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        for conn in (self._listen, self._work):
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
        self._listen = self._work = None

    def on_leadership_gained(self) -> None:
        self._legacy_checked_at = None
        self.wake()

    # -- the loop ----------------------------------------------------------------
    def _connect(self) -> None:
        if self._work is None:
            self._work = db.connect(self.settings)
        if self._listen is None:
            self._listen = db.connect(self.settings)
            self._listen.execute("LISTEN submission_pending")
            # Anything that became pending while we were not listening is found by this round's look
            # at the queue, so a NOTIFY missed during a disconnect strands nothing.
            log.info("listening for submission_pending")

    def _wait_for_wake(self) -> None:
        fds = [self._wake_r]
        if self._listen is not None:
            fds.append(self._listen.fileno())
        try:
            readable, _, _ = select.select(fds, [], [], self.settings.dispatch_tick_secs)
        except (OSError, ValueError):
            readable = []
        if self._wake_r in readable:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if self._listen is not None and len(readable) > (1 if self._wake_r in readable else 0):
            # Drain notifications; their content does not matter, the round looks at the queue itself.
            for _ in self._listen.notifies(timeout=0):
                METRICS.inc("arbiter_notifications_total")

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._connect()
                self._wait_for_wake()
                if self._stop.is_set():
                    break
                faults.wedge_point()
                self.round()
                self._loop_alive()
                backoff = 0.5
            except db.UNAVAILABLE as exc:
                self.health.mark_down(exc)
                # The loop itself is fine; a database outage is no reason for systemd to restart us.
                self._loop_alive()
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except psycopg.errors.UndefinedTable:
                # The legacy tables went away under us (stage 4 applied): look at the schema again now.
                log.info("legacy dispatch tables gone; re-reading the schema")
                self._legacy_checked_at = None
                self._close()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("dispatch round failed")
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _loop_alive(self) -> None:
        if self.notifier.enabled:
            role = "leader" if self.is_leader() else "standby"
            db_state = "db up" if self.health.up else "db unreachable"
            self.notifier.feed_watchdog(f"{role}, {db_state}, {len(self.parked_snapshot())} parked")

    def _fairness_order(self, tickets: list[Ticket]) -> list[Ticket]:
        """Home first; within a kind, whoever got a lease longest ago (from the workers table) goes first."""
        ids = sorted({t.worker.worker_id for t in tickets})
        last = dict(self._work.execute(leases.Q.worker_fairness_order, {"worker_ids": ids}).fetchall())
        epoch = 0.0

        def key(t: Ticket):
            at = last.get(t.worker.worker_id)
            return (0 if t.worker.kind == "home" else 1, at.timestamp() if at else epoch, t.parked_at)

        return sorted(tickets, key=key)

    def round(self) -> None:
        """One dispatch round. Marks the round complete only after the real path ran."""
        conn = self._work
        if self.is_leader():
            now = time.monotonic()
            if self._legacy_checked_at is None or now - self._legacy_checked_at > LEGACY_RECHECK_SECS:
                # Stage 4 and its rollback happen while arbiters run: follow the schema, not a start-up snapshot.
                present = leases.legacy_tables_present(conn)
                if self._legacy_checked_at is None or present != self.legacy_compat:
                    log.info("dispatch mode", extra={"legacy_compat": present})
                self.legacy_compat = present
                self._legacy_checked_at = now
            tickets = self.parked_snapshot()
            claimable = leases.claimable_work(conn) if tickets else leases.ClaimableWork([])
            if tickets and self.legacy_compat:
                conn.execute(leases.Q.legacy_mark_idle, {
                    "worker_ids": [t.worker.worker_id for t in tickets],
                    "kinds": [t.worker.kind for t in tickets]})
            if tickets and claimable:
                legacy = leases.LegacyRules(
                    tuple(sorted({t.worker.worker_id for t in tickets})),
                    self.settings.legacy_fresh_secs, self.settings.legacy_yield_secs) if self.legacy_compat else None
                for ticket in self._fairness_order(tickets):
                    if not claimable.languages_for(ticket.worker.worker_id, ticket.languages):
                        continue
                    try:
                        lease = self._match(conn, ticket, legacy)
                    except leases.LegacyTurn:
                        # A legacy worker's turn: the work stays pending for it (for legacy.yield_secs at most).
                        METRICS.inc("arbiter_legacy_turns_total", kind=ticket.worker.kind)
                        continue
                    if lease is None:
                        claimable.exhausted(ticket.worker.worker_id, ticket.languages)
                    if not claimable:
                        break
        self.health.mark_up()
        self.last_round_completed = time.monotonic()
        self.rounds += 1
        METRICS.inc("arbiter_dispatch_rounds_total")

    def _match(self, conn: psycopg.Connection, ticket: Ticket, legacy: leases.LegacyRules | None) -> leases.Lease | None:
        if not self.lot.begin_match(ticket):
            return None  # its request left since the snapshot
        lease = None
        try:
            lease = leases.acquire(
                conn,
                worker_id=ticket.worker.worker_id,
                kind=ticket.worker.kind,
                request_id=ticket.request_id,
                languages=list(ticket.languages),
                unconfirmed_secs=self.settings.unconfirmed_secs,
                legacy=legacy,
                before_commit=faults.before_commit_hook(),
            )
            if lease is not None:
                faults.after_commit()
                METRICS.inc("arbiter_leases_granted_total", kind=ticket.worker.kind)
                log.info("lease granted", extra={"submission_id": lease.submission_id,
                                                 "worker_id": ticket.worker.worker_id, "lease_gen": lease.lease_gen})
        except psycopg.errors.UniqueViolation:
            # The same request_id was served concurrently (e.g. by another arbiter): hand out that lease.
            found = leases.find_grant(conn, ticket.worker.worker_id, ticket.request_id)
            lease = found[1] if found and found[0] is leases.GrantState.LIVE else None
        except psycopg.errors.LockNotAvailable:
            log.warning("legacy global lock busy; will retry next round")
        finally:
            self.lot.finish_match(ticket, lease)
        return lease
