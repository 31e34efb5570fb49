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

from arbiter.protocol.vocabulary import LANGUAGES
from arbiter.server import faults, sdnotify
from arbiter.server.loops.tickets import ParkingLot, Ticket, TicketState
from arbiter.server.metrics import METRICS
from arbiter.store import db, leases

log = logging.getLogger("arbiter.dispatcher")
LEGACY_RECHECK_SECS = 5.0
# How long a leaving request waits for the acquire transaction a round is running for it.
LEAVE_WAIT_SECS = 5.0
# After a failed round (the database away) the loop tries again after RETRY_FIRST_SECS, doubling up
# to RETRY_MAX_SECS; leadership gained cuts the wait short (see _pause).
RETRY_FIRST_SECS = 0.5
RETRY_MAX_SECS = 5.0


class Dispatcher:
    def __init__(self, settings, health: db.DbHealth, is_leader, notifier: sdnotify.Notifier | None = None,
                 on_granted=None):
        self.settings = settings
        self.on_granted = on_granted or (lambda: None)  # the janitor's wake: live leases to watch
        self.notifier = notifier or sdnotify.Notifier({})
        self.health = health
        self.is_leader = is_leader
        self.lot = ParkingLot(settings.max_parked, settings.max_parked_per_worker)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stop = threading.Event()
        self._retry_now = threading.Event()  # ends a back-off wait: leadership gained, or stop()
        self._thread = threading.Thread(target=self._run, name="dispatcher", daemon=True)
        self._listen: psycopg.Connection | None = None
        self._work: psycopg.Connection | None = None
        self.legacy_compat = False
        self.pauses_present = False
        self.last_round_completed: float | None = None
        self.rounds = 0
        self._legacy_checked_at: float | None = None  # monotonic; the schema is looked at again now and then
        # Whether the queue may have changed since the last look (a NOTIFY, a newly parked request,
        # a new LISTEN session, leadership, a lease just granted, a lock timeout). An idle round with nothing new
        # runs no statement; a look every dispatch_sweep_secs bounds what a lost NOTIFY could strand.
        self._dirty = True
        self._swept_at: float | None = None
        # worker_id -> DB time (epoch seconds) of its last lease, as this leader knows it.
        self._last_lease: dict[str, float] = {}
        # The pending work as the last look saw it, kept up to date with this leader's grants, and the
        # languages NOTIFYs named since (see _look). None: look at the queue itself next time.
        self._known: leases.ClaimableWork | None = None
        self._hinted: set[str] = set()
        self._pins_stale = True  # a pinned canary may have come (NOTIFY 'pinned') since pins were read
        self._paused: set[str] | None = None  # the paused workers as last read; None: read them

    # -- called from request threads (the ticket transitions are in tickets.py) -----
    def park(self, ticket: Ticket) -> None:
        self.lot.park(ticket)
        self._dirty = True  # (a plain assignment: safe from any thread)
        self.wake()

    async def unpark_async(self, ticket: Ticket, wait_if_matching: float = LEAVE_WAIT_SECS) -> leases.Lease | None:
        """The request is leaving (answered or timed out): its lease if it got one. Waiting for a
        running match holds no thread."""
        done, lease = self.lot.begin_leave(ticket)
        if done:
            return lease
        await ticket.event.wait_async(wait_if_matching)
        return self.lot.end_leave(ticket)

    def close_parking(self) -> None:
        """The arbiter is stopping: every parked request is answered now and nothing parks again."""
        self.lot.close()

    @property
    def stopping(self) -> bool:
        return self.lot.closed

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
        self._retry_now.set()
        self.wake()
        self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        self._known = self._paused = None  # whatever happened while away is looked at anew
        for conn in (self._listen, self._work):
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
        self._listen = self._work = None

    def on_leadership_gained(self) -> None:
        self._legacy_checked_at = None
        self._last_lease = {}  # another leader may have granted meanwhile: read the table again
        self._known = self._paused = None
        self._dirty = True
        self._retry_now.set()
        self.wake()

    # -- the loop ----------------------------------------------------------------
    def _connect(self) -> None:
        if self._work is None:
            self._work = db.connect(self.settings)
        if self._listen is None:
            self._listen = db.connect_session(self.settings)  # LISTEN lives in a session
            self._listen.execute("LISTEN submission_pending")
            # Anything that became pending while we were not listening is found by this round's look
            # at the queue, so a NOTIFY missed during a disconnect strands nothing.
            self._dirty = True
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
            self._dirty = True
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if self._listen is not None and len(readable) > (1 if self._wake_r in readable else 0):
            # Drain notifications: the language of a row that became pending (the trigger's), a
            # pinned canary (submit_canary's), or pauses that changed (pause_worker, resume_worker).
            for notification in self._listen.notifies(timeout=0):
                self._dirty = True
                self._heard(notification.payload)
                METRICS.inc("arbiter_notifications_total")

    def _heard(self, payload: str) -> None:
        if payload == leases.NOTIFY_PINNED:
            self._pins_stale = True
        elif payload == leases.NOTIFY_PAUSES:
            self._paused = None
        elif payload in LANGUAGES:
            self._hinted.add(payload)

    def _pause(self, secs: float) -> None:
        """The wait after a failed round, cut short by stop() and by leadership gained: after a
        database failover the leader lock is taken again on the new primary, and parked workers get
        their leases now, not at the end of a back-off of up to RETRY_MAX_SECS. (Not the wake pipe:
        every newly parked request writes to it, and an outage would turn that into a connect loop.)"""
        self._retry_now.wait(secs)
        self._retry_now.clear()

    def _run(self) -> None:
        backoff = RETRY_FIRST_SECS
        while not self._stop.is_set():
            try:
                self._connect()
                self._wait_for_wake()
                if self._stop.is_set():
                    break
                faults.wedge_point()
                self.round()
                self._loop_alive()
                backoff = RETRY_FIRST_SECS
            except db.UNAVAILABLE as exc:
                self.health.mark_down(exc)
                # The loop itself is fine; a database outage is no reason for systemd to restart us.
                self._loop_alive()
                self._close()
                self._pause(backoff)
                backoff = min(backoff * 2, RETRY_MAX_SECS)
            except psycopg.errors.UndefinedTable:
                # The legacy tables went away under us (stage 4 applied), or the pauses' (its rollback):
                # look at the schema again now.
                log.info("a table of the dispatch went away; re-reading the schema")
                self._legacy_checked_at = None
                self._close()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("dispatch round failed")
                self._close()
                self._pause(backoff)
                backoff = min(backoff * 2, RETRY_MAX_SECS)

    def _loop_alive(self) -> None:
        if self.notifier.enabled:
            role = "leader" if self.is_leader() else "standby"
            db_state = "db up" if self.health.up else "db unreachable"
            self.notifier.feed_watchdog(f"{role}, {db_state}, {len(self.parked_snapshot())} parked")

    def _fairness_order(self, tickets: list[Ticket]) -> list[Ticket]:
        """Home first; within a kind, whoever got a lease longest ago goes first. When each worker
        last got a lease comes from the workers table the first time this leader sees the worker
        (so fairness survives a restart or a new leader), and from its own grants after that."""
        unknown = sorted({t.worker.worker_id for t in tickets} - self._last_lease.keys())
        if unknown:
            rows = dict(self._work.execute(leases.Q.worker_fairness_order, {"worker_ids": unknown}).fetchall())
            for worker_id in unknown:
                at = rows.get(worker_id)
                self._last_lease[worker_id] = at.timestamp() if at else 0.0

        def key(t: Ticket):
            return (0 if t.worker.kind == "home" else 1, self._last_lease[t.worker.worker_id], t.parked_at)

        return sorted(tickets, key=key)

    def _granted(self, worker_id: str, lease: leases.Lease) -> None:
        # The lease's DB time (its expiry less the unconfirmed period), as last_lease_at has it.
        self._last_lease[worker_id] = lease.expires_at.timestamp() - self.settings.unconfirmed_secs

    def round(self) -> None:
        """One dispatch round. Marks the round complete only after the real path ran."""
        conn = self._work
        if self.is_leader():
            now = time.monotonic()
            if self._legacy_checked_at is None or now - self._legacy_checked_at > LEGACY_RECHECK_SECS:
                # Stage 4 and its rollback happen while arbiters run: follow the schema, not a start-up snapshot.
                # The stage-4 schema records paused workers (005_worker_pauses); stages 2-3 have none.
                present, self.pauses_present = leases.dispatch_tables_present(conn)
                if self._legacy_checked_at is None or present != self.legacy_compat:
                    log.info("dispatch mode", extra={"legacy_compat": present})
                self.legacy_compat = present
                self._legacy_checked_at = now
            parked = tickets = self.parked_snapshot()
            claimable = leases.ClaimableWork([])
            if tickets and self._should_look(now):
                # Cleared before the look: a NOTIFY during it makes the next round look again.
                self._dirty = False
                if self.pauses_present:
                    # A paused worker's requests stay parked, granted nothing (judgectl worker pause).
                    # Read again when a pause or a resume says so (NOTIFY 'paused') and at each sweep.
                    if self._paused is None or self._sweep_due(now):
                        self._paused = leases.paused_workers(conn)
                    tickets = [t for t in tickets if t.worker.worker_id not in self._paused]
                if tickets:
                    claimable = self._look(conn, tickets, now)
            if tickets and self.legacy_compat:
                # One row per worker: a worker with several judge slots parks several tickets.
                idle = {t.worker.worker_id: t.worker.kind for t in tickets}
                conn.execute(leases.Q.legacy_mark_idle, {"worker_ids": list(idle), "kinds": list(idle.values())})
            if tickets and claimable:
                if self.legacy_compat:
                    granted = self._match_one_by_one(conn, tickets, claimable)
                else:
                    granted = self._match_in_batches(conn, tickets, claimable)
                if granted:
                    self._dirty = True  # more work and more requests may be left: look again at once
                    self.on_granted()
            # After the match, not before: a request that a batch leased was new (its grant row would
            # have collided with an earlier one's, and the batch gone one by one, each retry getting
            # its earlier lease); only those still parked need the look-up, none in a busy round.
            # (Read without the lot's lock, a hint: begin_match and refuse check under it. A ticket
            # parked during this round woke the next one, which looks it up.)
            unchecked = [t for t in parked if not t.checked and t.state is TicketState.PARKED]
            if unchecked:
                self._check_retries(conn, unchecked)
        self.health.mark_up()
        self.last_round_completed = time.monotonic()
        self.rounds += 1
        METRICS.inc("arbiter_dispatch_rounds_total")

    def _check_retries(self, conn: psycopg.Connection, unchecked: list[Ticket]) -> None:
        """The requests parked since the last round and not leased by it, looked up in lease_grants
        in one statement (instead of one per acquire before it parks): a retried request_id gets its
        earlier lease if it is live, or is refused (410) if not."""
        found = leases.find_grants(conn, [t.key for t in unchecked])
        for ticket in unchecked:
            ticket.checked = True
            earlier = found.get(ticket.key)
            if earlier is None:
                continue
            state, lease = earlier
            if state is leases.GrantState.LIVE:
                if self.lot.begin_match(ticket):
                    ticket.retried = True
                    self.lot.finish_match(ticket, lease)
            else:
                self.lot.refuse(ticket)

    def _look(self, conn: psycopg.Connection, tickets: list[Ticket], now: float) -> leases.ClaimableWork:
        """The queue as this round needs it. claimable_work counts every pending row, a cost that grows
        with the queue (5 ms with 30,000 pending): it is run when the work known from the last one (less
        what was granted since, plus the languages NOTIFYs named since) does not cover every parked
        request, at every sweep, and always in stages 1-3 (legacy workers take work unannounced).
        Otherwise the pinned canaries are read again if a NOTIFY said a pinned one came, and nothing
        if not. A count that proves too high costs one acquire statement that finds less, which marks
        the work exhausted, and the next round looks."""
        known, self._known = self._known, None
        if known is not None:
            for language in self._hinted:
                known.hint(language)
        self._hinted.clear()
        if known is None or self._sweep_due(now) or self.legacy_compat or not known.covers(tickets):
            known = leases.claimable_work(conn)
            self._swept_at, self._pins_stale = now, False
            METRICS.inc("arbiter_dispatch_looks_total", look="full")
        elif self._pins_stale:
            self._pins_stale = False  # before the read: a NOTIFY during it makes the next one read again
            known.with_pins(leases.pinned_work(conn))
            METRICS.inc("arbiter_dispatch_looks_total", look="pins")
        else:
            METRICS.inc("arbiter_dispatch_looks_total", look="known")
        self._known = known
        return known

    def _should_look(self, now: float) -> bool:
        """Look at the queue this round? Always in stages 1-3 (the legacy turn rule is a matter of
        time, and legacy workers change the queue without NOTIFY); otherwise when something may
        have changed, or dispatch_sweep_secs after the last look."""
        return self.legacy_compat or self._dirty or self._sweep_due(now)

    def _sweep_due(self, now: float) -> bool:
        """dispatch_sweep_secs since the last full look at the queue (or none yet): a round then reads
        everything it otherwise keeps from NOTIFYs (the claimable work, the pauses)."""
        return self._swept_at is None or now - self._swept_at >= self.settings.dispatch_sweep_secs

    def _match_one_by_one(self, conn: psycopg.Connection, tickets: list[Ticket], claimable) -> int:
        """Stages 1-3: one acquire transaction per request, each under the legacy global lock and its
        turn rule (a question about one worker at a time). Returns how many got a lease."""
        granted = 0
        legacy = leases.LegacyRules(tuple(sorted({t.worker.worker_id for t in tickets})),
                                    self.settings.legacy_fresh_secs, self.settings.legacy_yield_secs)
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
            else:
                granted += 1
            if not claimable:
                break
        return granted

    def _match_in_batches(self, conn: psycopg.Connection, tickets: list[Ticket], claimable) -> int:
        """Without the legacy scheme: consecutive requests (in fairness order) with the same
        languages are matched by one statement, up to dispatch_batch_size at a time. A request with
        a canary pinned to its worker is matched alone first (acquire_lease looks at pins)."""
        runs: list[list[Ticket]] = []
        granted = 0
        has_pins = claimable.has_pins()
        # How many more requests of each language set there is unpinned work for (as of the look):
        # a thousand parked workers and one submission make a batch of one.
        wanted: dict[tuple[str, ...], int] = {}
        for ticket in self._fairness_order(tickets):
            worker_id, languages = ticket.worker.worker_id, ticket.languages
            if has_pins and claimable.pinned_for(worker_id, languages):
                if self._match(conn, ticket, None) is None:
                    claimable.exhausted(worker_id, languages)
                else:
                    granted += 1
                continue
            if languages not in wanted:
                wanted[languages] = claimable.unpinned_count(languages)
            if wanted[languages] <= 0:
                continue
            wanted[languages] -= 1
            if runs and runs[-1][0].languages == languages and len(runs[-1]) < self.settings.dispatch_batch_size:
                runs[-1].append(ticket)
            else:
                runs.append([ticket])
        for run in runs:
            if not claimable.languages_for(run[0].worker.worker_id, run[0].languages):
                continue  # an earlier run took all of this
            leased, tried = self._match_batch(conn, run)
            granted += leased
            if leased < tried:
                claimable.exhausted(run[0].worker.worker_id, run[0].languages)
        return granted

    def _match_batch(self, conn: psycopg.Connection, run: list[Ticket]) -> tuple[int, int]:
        """MATCHING for every request of the run still parked, one acquire_leases statement, then each
        request's outcome. Returns (how many got a lease, how many were tried): fewer leased than
        tried means the work ran out (those that left meanwhile say nothing about it)."""
        matching = [t for t in run if self.lot.begin_match(t)]
        if not matching:
            return 0, 0
        granted: dict[tuple[str, str], leases.Lease] = {}
        retry_alone = False
        try:
            granted = leases.acquire_many(conn, requests=[t.key for t in matching], slots=[t.slot for t in matching],
                                          languages=list(matching[0].languages),
                                          unconfirmed_secs=self.settings.unconfirmed_secs,
                                          before_commit=faults.before_commit_hook())
            if granted:
                faults.after_commit()
        except psycopg.errors.UniqueViolation:
            # A request_id was served already (by another arbiter, or a retry): nothing was written;
            # match these one at a time, where each such request gets its earlier lease.
            retry_alone = True
        except psycopg.errors.LockNotAvailable:
            self._dirty = True  # the work is still there: the next round looks again
            log.warning("submission rows locked; will retry next round")
        finally:
            for ticket in matching:
                self.lot.finish_match(ticket, granted.get(ticket.key))
        METRICS.inc("arbiter_dispatch_batches_total")
        for ticket in matching:
            lease = granted.get(ticket.key)
            if lease is not None:
                self._announce(ticket, lease)
        if retry_alone:
            return sum(self._match(conn, t, None) is not None for t in matching), len(matching)
        return len(granted), len(matching)

    def _announce(self, ticket: Ticket, lease: leases.Lease) -> None:
        """A lease the database granted to this ticket: the janitor is told, the metrics and the log."""
        self._granted(ticket.worker.worker_id, lease)
        if self._known is not None:
            self._known.took(lease.language)
        METRICS.inc("arbiter_leases_granted_total", kind=ticket.worker.kind)
        if lease.lease_gen == 1 and lease.queue_wait_secs is not None:
            # A first lease: the time from the submission to it is the queue's wait (a rejudged or
            # reclaimed submission's would count its earlier judgings too).
            METRICS.observe("arbiter_queue_wait_seconds", lease.queue_wait_secs, kind=ticket.worker.kind)
        log.info("lease granted", extra={"submission_id": lease.submission_id,
                                         "worker_id": ticket.worker.worker_id, "lease_gen": lease.lease_gen})

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
                slot=ticket.slot,
                languages=list(ticket.languages),
                unconfirmed_secs=self.settings.unconfirmed_secs,
                legacy=legacy,
                before_commit=faults.before_commit_hook(),
            )
            if lease is not None:
                faults.after_commit()
                self._announce(ticket, lease)
        except psycopg.errors.UniqueViolation:
            # The same request_id was served concurrently (e.g. by another arbiter): hand out that lease.
            found = leases.find_grant(conn, ticket.worker.worker_id, ticket.request_id)
            lease = found[1] if found and found[0] is leases.GrantState.LIVE else None
            ticket.retried = lease is not None  # a dead one: parked again, refused after this round
        except psycopg.errors.LockNotAvailable:
            self._dirty = True  # the work is still there: the next round looks again
            log.warning("legacy global lock busy; will retry next round")
        finally:
            self.lot.finish_match(ticket, lease)
        return lease
