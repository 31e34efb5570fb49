"""Direct transport: the legacy scheme, exactly as it ran before the cutover.

Every poll takes the global lock (the judge_dispatch_state row), applies the
yield rules (production yields while a home worker is idle; home workers take
turns by the round-robin pointer), claims the oldest pending submission with
SKIP LOCKED and reports with a worker_id check only. Outbox entries written
under the arbiter transport (left over after a rollback) are delivered with
the arbiter's own token-checked statement, straight to the database.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from arbiter.protocol.delivery import Delivery, DeliveryOutcome
from arbiter.store import db, leases
from arbiter.store.sqlfiles import legacy_statements
from worker.backoff import Backoff
from worker.delivery.assignment import Assignment
from worker.delivery.outbox import Entry
from worker.judging.judge import Job

log = logging.getLogger("worker.direct")
L = legacy_statements()


class NoKeepAlive:
    lost = threading.Event()

    def stop(self) -> None:
        pass


class DirectTransport:
    name = "direct"

    def __init__(self, config):
        self.config = config
        self.backoff = Backoff(config.backoff_initial_secs, config.backoff_max_secs)
        self._conn: psycopg.Connection | None = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.config.dsn, autocommit=True, connect_timeout=5,
                                         application_name=f"judge-worker-{self.config.worker_id}")
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
        self._conn = None

    def _my_turn(self, conn, rr_last_home: str | None) -> bool:
        idle_homes = [r[0] for r in conn.execute(
            L.idle_home_nodes, {"fresh_secs": self.config.legacy_idle_fresh_secs}).fetchall()]
        me = self.config.worker_id
        if self.config.kind == "production":
            return not [w for w in idle_homes if w != me]
        if me not in idle_homes or len(idle_homes) == 1:
            return True
        after = [w for w in idle_homes if rr_last_home is None or w > rr_last_home]
        return (after[0] if after else idle_homes[0]) == me

    def claim(self) -> Job | None:
        conn = self._connection()
        with conn.transaction():
            rr_last_home = conn.execute(L.take_global_lock).fetchone()[0]
            conn.execute(L.mark_node_idle, {"worker_id": self.config.worker_id, "kind": self.config.kind})
            params = {"worker_id": self.config.worker_id, "languages": list(self.config.languages)}
            with conn.cursor(row_factory=dict_row) as cur:
                # A canary pinned to this worker is nobody else's turn: taken before the turn is asked.
                row = cur.execute(L.claim_pinned_canary, params).fetchone()
                if row is None:
                    if not self._my_turn(conn, rr_last_home):
                        return None
                    row = cur.execute(L.claim_oldest_pending, params).fetchone()
            if row is None:
                return None
            conn.execute(L.note_claim, {"worker_id": self.config.worker_id, "kind": self.config.kind})
        return Job(submission_id=row["submission_id"], problem_id=row["problem_id"], problem_slug=row["problem_slug"],
                   language=row["language"], source=row["source"], time_limit_ms=row["time_limit_ms"],
                   memory_limit_kb=row["memory_limit_kb"], comparer=row["comparer"],
                   checker_sha256=row["checker_sha256"], data_digest=row["data_digest"])

    def next_assignment(self, stopping: threading.Event) -> Assignment | None:
        try:
            job = self.claim()
        except psycopg.errors.UndefinedTable:
            log.error("legacy dispatch tables are gone (stage 4 applied?): the direct transport cannot claim; "
                      "roll back stage 4 or switch this worker to the arbiter")
            self._drop_connection()
            stopping.wait(self.backoff.next_delay())
            return None
        except db.UNAVAILABLE as exc:
            delay = self.backoff.next_delay()
            log.warning("database unreachable; backing off", extra={"delay_secs": round(delay, 2),
                                                                     "error": type(exc).__name__})
            self._drop_connection()
            stopping.wait(delay)
            return None
        self.backoff.reset()
        if job is None:
            stopping.wait(self.config.legacy_poll_secs)
            return None
        return Assignment(job, None, None, self.name)

    def release(self, assignment: Assignment, reason: str) -> None:
        """The legacy scheme has no lease to hand back (its claims never expire): never called for one."""

    def keep_alive(self, assignment: Assignment) -> NoKeepAlive:
        return NoKeepAlive()

    def entry_for(self, assignment: Assignment, verdict) -> Entry:
        return Entry(transport="direct", submission_id=assignment.job.submission_id, verdict=verdict.verdict,
                     time_ms=verdict.time_ms, memory_kb=verdict.memory_kb, detail=verdict.detail,
                     data_digest=verdict.data_digest)

    def deliver(self, entry: Entry) -> DeliveryOutcome:
        try:
            conn = self._connection()
            if entry.transport == "arbiter":
                outcome = leases.record_result(conn, worker_id=self.config.worker_id,
                                               submission_id=entry.submission_id, lease_token=entry.lease_token,
                                               verdict=entry.verdict, time_ms=entry.time_ms,
                                               memory_kb=entry.memory_kb, detail=entry.detail,
                                               data_digest=entry.data_digest).outcome
                stored = outcome in (leases.WriteOutcome.ACCEPTED, leases.WriteOutcome.DUPLICATE)
                return DeliveryOutcome(Delivery.DELIVERED if stored else Delivery.GONE)
            with conn.transaction():
                decided = conn.execute(L.report_result, {
                    "submission_id": entry.submission_id, "worker_id": self.config.worker_id,
                    "verdict": entry.verdict, "time_ms": entry.time_ms, "memory_kb": entry.memory_kb,
                    "detail": Jsonb(entry.detail), "data_digest": entry.data_digest}).fetchone()[0]
            return DeliveryOutcome(Delivery.DELIVERED if decided else Delivery.GONE)
        except psycopg.errors.UndefinedColumn:
            return DeliveryOutcome(Delivery.REJECTED, "the schema has no lease columns (stage 1 rolled back); "
                                                      "this lease result cannot be matched")
        except db.UNAVAILABLE:
            self._drop_connection()
            return DeliveryOutcome(Delivery.RETRY)

    def interrupt(self) -> None:
        """SIGTERM: nothing to cut short; a legacy poll waits at most legacy_poll_secs on the stop event."""

    def close(self) -> None:
        self._drop_connection()
