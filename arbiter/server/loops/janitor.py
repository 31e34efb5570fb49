"""The janitor: hands expired leases back (DB time), after a grace period whenever one is owed.

A grace period is owed at start-up, on gaining leadership, after the
database was unreachable and after the janitor itself was absent (the process
paused or starved for longer than ``absence_grace_after_secs`` of DB time): the arbiter's absence is not the workers' fault,
so no lease is reclaimed before every live lease has had a full period to
report in again.

A sweep is one statement (``lease_horizon``: DB time and the first expiry), plus the reclaim when
something has expired. While arbiter leases are live it sweeps every ``janitor_interval_secs``;
with none live it has nothing to reclaim and sweeps every ``janitor_idle_secs``, or at once when
the dispatcher grants a lease (``wake``). A stretch with no live lease is not an absence: there was
no lease its absence could have wronged.
"""

from __future__ import annotations

import logging
import threading
import time

from arbiter.server.metrics import METRICS
from arbiter.store import canary, db, leases

log = logging.getLogger("arbiter.janitor")

# Canaries are few (one per gate, one per probe interval): a look a minute keeps the table small.
FORGET_CANARIES_EVERY_SECS = 60.0


class Janitor:
    def __init__(self, settings, health: db.DbHealth, is_leader):
        self.settings = settings
        self.health = health
        self.is_leader = is_leader
        self._grace_owed = threading.Event()
        self._grace_owed.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="janitor", daemon=True)
        self._conn = None
        self._health_generation = None
        self._last_sweep_db_time = None
        self._last_forget = None
        self._wake = threading.Event()
        self.leases_live = True  # until the first sweep says otherwise
        self.declare_metrics()

    @staticmethod
    def declare_metrics() -> None:
        # Series exist from the start, at 0: an alert on their increase sees the first one.
        for outcome in ("pending", "system_error"):
            METRICS.inc("arbiter_leases_reclaimed_total", 0, outcome=outcome)
        for cause in ("attempts", "releases", "worker"):
            METRICS.inc("arbiter_system_errors_total", 0, cause=cause)
        METRICS.inc("arbiter_grace_periods_total", 0)
        METRICS.inc("arbiter_canaries_forgotten_total", 0)

    def owe_grace(self) -> None:
        self._grace_owed.set()
        self._wake.set()

    def wake(self) -> None:
        """A lease was granted: sweep on the short interval again."""
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        if self._conn is not None:
            self._conn.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self.leases_live or self._grace_owed.is_set()
            self._wake.wait(self.settings.janitor_interval_secs if busy else self.settings.janitor_idle_secs)
            self._wake.clear()
            if self._stop.is_set():
                break
            if not self.is_leader():
                self.leases_live = True  # whoever leads next: nothing is known here
                continue
            try:
                self.sweep()
            except db.UNAVAILABLE as exc:
                self.health.mark_down(exc)
                self.owe_grace()
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
            except Exception:  # noqa: BLE001
                log.exception("janitor sweep failed")
                self.owe_grace()

    def sweep(self) -> list[leases.Reclaimed]:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.settings)
        if self._health_generation != self.health.generation:
            # The database came back (or we just started): a grace period before any reclaim.
            self._health_generation = self.health.generation
            self._grace_owed.set()
        now, horizon = leases.lease_horizon(self._conn)
        if self._last_sweep_db_time is not None and self.leases_live:
            absent_secs = (now - self._last_sweep_db_time).total_seconds()
            if absent_secs > self.settings.absence_grace_after_secs:
                log.warning("janitor was absent; owing a grace period", extra={"absent_secs": round(absent_secs, 2)})
                self._grace_owed.set()
        self._last_sweep_db_time = now
        self.leases_live = horizon is not None
        if self._grace_owed.is_set():
            extended = leases.grant_grace_period(self._conn, grace_secs=self.settings.grace_secs)
            self._grace_owed.clear()
            METRICS.inc("arbiter_grace_periods_total")
            log.info("grace period granted", extra={"leases_extended": extended,
                                                    "grace_secs": self.settings.grace_secs})
            return []
        self._forget_old_canaries()
        if horizon is None or horizon > 0:
            return []  # nothing has expired
        reclaimed = leases.reclaim_expired(self._conn, max_attempts=self.settings.max_attempts)
        for item in reclaimed:
            METRICS.inc("arbiter_leases_reclaimed_total", outcome=item.new_status)
            if item.new_status == "system_error":
                METRICS.inc("arbiter_system_errors_total", cause="attempts")
            log.warning("lease expired", extra={"submission_id": item.submission_id, "worker_id": item.worker_id,
                                                "new_status": item.new_status})
        return reclaimed

    def _forget_old_canaries(self) -> None:
        """Decided canaries older than canary_keep_secs go (each worker's last stays), once a minute."""
        now = time.monotonic()
        if self._last_forget is not None and now - self._last_forget < FORGET_CANARIES_EVERY_SECS:
            return
        self._last_forget = now
        forgotten = canary.forget_old(self._conn, self.settings.canary_keep_secs)
        if forgotten:
            METRICS.inc("arbiter_canaries_forgotten_total", forgotten)
            log.info("old canaries forgotten", extra={"count": forgotten})
