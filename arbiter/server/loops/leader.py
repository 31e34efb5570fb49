"""Leader lock: a session-level PostgreSQL advisory lock held on a dedicated connection.

Only the holder dispatches and reclaims. The lock is for efficiency only;
correctness comes from the conditional writes, so two arbiters that both
believe they lead can schedule worse but never corrupt data. The thread
also serves as the database health probe: the leader touches the DB every
leader_check_secs; a standby waits on the lock itself (pg_advisory_lock, in
waits of leader_retry_secs at most), so it leads the moment the lock is free:
when the leader's session ends (its process or host died) or when the leader
resigns (a stop, a rolling upgrade: ``resign``).

States of the thread: STANDBY (waiting on the lock) -> LEADING (holds it) ->
STANDBY again when the session is lost; RESIGNED from either, for good: a
stopping arbiter neither holds nor takes the lock.
"""

from __future__ import annotations

import enum
import logging
import threading

import psycopg

from arbiter.store import db

log = logging.getLogger("arbiter.leader")


class LeaderState(enum.Enum):
    STANDBY = "standby"
    LEADING = "leading"
    RESIGNED = "resigned"


class LeaderLock:
    def __init__(self, settings, health: db.DbHealth, on_gain=None, on_lose=None):
        self.settings = settings
        self.health = health
        self.on_gain = on_gain or (lambda: None)
        self.on_lose = on_lose or (lambda: None)
        self._conn: psycopg.Connection | None = None
        self._leader = threading.Event()
        self._resigned = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and resign(): the thread looks again now
        self._thread = threading.Thread(target=self._run, name="leader-lock", daemon=True)
        # A standby's wait on the lock, at most: short of the session's statement_timeout (2 x
        # db_timeout_secs), so a wait that runs out is an answer, not an error.
        self._lock_wait_ms = max(100, min(int(settings.leader_retry_secs * 1000), int(settings.db_timeout_secs * 1000)))

    @property
    def is_leader(self) -> bool:
        return self._leader.is_set()

    @property
    def state(self) -> LeaderState:
        if self._resigned.is_set():
            return LeaderState.RESIGNED
        return LeaderState.LEADING if self._leader.is_set() else LeaderState.STANDBY

    def start(self) -> None:
        self._thread.start()

    def resign(self) -> None:
        """Give the lock up now and never take it again (the arbiter is stopping): a standby waiting
        on the lock leads at once. Safe to call from any thread; returns without waiting."""
        self._resigned.set()
        self._wake.set()
        self._cancel_wait()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._cancel_wait()
        self._thread.join(timeout=5)
        self._drop("stopping")

    def _cancel_wait(self) -> None:
        """A standby's lock wait is one statement: cancelled, it returns now (QueryCanceled)."""
        conn = self._conn
        if conn is not None and not self.is_leader:
            try:
                conn.cancel_safe(timeout=2)
            except Exception:  # noqa: BLE001 - the connection may be closing; the wait ends anyway
                pass

    def _drop(self, why: str) -> None:
        was_leader = self._leader.is_set()
        self._leader.clear()
        if self._conn is not None:
            try:
                self._conn.close()  # the session ends: the server releases the lock
            except Exception:  # noqa: BLE001 - the connection is being thrown away
                pass
            self._conn = None
        if was_leader:
            log.warning("leadership lost", extra={"reason": why})
            self.on_lose()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._resigned.is_set():
                if self._conn is not None:
                    self._drop("resigned: the arbiter is stopping")
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self._step()
            except psycopg.errors.QueryCanceled:
                pass  # stop() or resign() cut a standby's wait short
            except db.UNAVAILABLE as exc:
                self.health.mark_down(exc)
                self._drop(f"database: {type(exc).__name__}")
            except Exception:  # noqa: BLE001 - never let the probe thread die
                log.exception("leader lock step failed")
                self._drop("unexpected error")
            if self._conn is not None and not self.is_leader and self.health.up:
                continue  # a standby: the lock wait itself paces the loop
            # The leader checks its session; without a session, or in an outage, its end is noticed within a second.
            wait = self.settings.leader_check_secs
            if self._conn is None or not self.health.up:
                wait = min(wait, 1.0)
            self._wake.wait(wait)
            self._wake.clear()

    def _step(self) -> None:
        if self._conn is None:
            self._conn = db.connect_session(self.settings)  # a session-level lock
            self._conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{self._lock_wait_ms}ms",))
        if self.is_leader:
            db.ping(self._conn)
            self.health.mark_up()
            return
        try:
            self._conn.execute("SELECT pg_advisory_lock(%s)", (self.settings.leader_lock_key,))
        except psycopg.errors.LockNotAvailable:
            self.health.mark_up()  # the database answered: another arbiter leads
            return
        self.health.mark_up()
        if self._resigned.is_set() or self._stop.is_set():
            self._drop("resigned before leading")
            return
        log.info("leadership gained")
        self._leader.set()
        try:
            self.on_gain()
        except db.UNAVAILABLE:
            raise
        except Exception:  # noqa: BLE001
            log.exception("on_gain failed")
