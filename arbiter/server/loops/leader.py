"""Leader lock: a session-level pg_try_advisory_lock held on a dedicated connection.

Only the holder dispatches and reclaims. The lock is for efficiency only;
correctness comes from the conditional writes, so two arbiters that both
believe they lead can schedule worse but never corrupt data. The thread
also serves as the database health probe: it touches the DB every
leader_check_secs (and a standby tries for the lock every leader_retry_secs).
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg

from arbiter.store import db

log = logging.getLogger("arbiter.leader")


class LeaderLock:
    def __init__(self, settings, health: db.DbHealth, on_gain=None, on_lose=None):
        self.settings = settings
        self.health = health
        self.on_gain = on_gain or (lambda: None)
        self.on_lose = on_lose or (lambda: None)
        self._conn: psycopg.Connection | None = None
        self._leader = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-lock", daemon=True)
        self._next_try = 0.0

    @property
    def is_leader(self) -> bool:
        return self._leader.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._drop("stopping")

    def _drop(self, why: str) -> None:
        was_leader = self._leader.is_set()
        self._leader.clear()
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - the connection is being thrown away
                pass
            self._conn = None
        if was_leader:
            log.warning("leadership lost", extra={"reason": why})
            self.on_lose()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except db.UNAVAILABLE as exc:
                self.health.mark_down(exc)
                self._drop(f"database: {type(exc).__name__}")
            except Exception:  # noqa: BLE001 - never let the probe thread die
                log.exception("leader lock step failed")
                self._drop("unexpected error")
            # A standby comes back in time for its next try; the leader checks its session.
            wait = self.settings.leader_check_secs
            if not self.health.up or self._conn is None:
                wait = min(wait, 1.0)  # an outage's end is noticed within a second
            elif not self.is_leader:
                wait = min(wait, max(0.1, self._next_try - time.monotonic()))
            self._stop.wait(wait)

    def _step(self) -> None:
        if self._conn is None:
            self._conn = db.connect_session(self.settings)  # a session-level lock
        self._conn.execute("SELECT 1")
        self.health.mark_up()
        now = time.monotonic()
        if self.is_leader or now < self._next_try:
            return
        self._next_try = now + self.settings.leader_retry_secs
        got = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.settings.leader_lock_key,)).fetchone()[0]
        if got:
            log.info("leadership gained")
            self._leader.set()
            try:
                self.on_gain()
            except db.UNAVAILABLE:
                raise
            except Exception:  # noqa: BLE001
                log.exception("on_gain failed")
