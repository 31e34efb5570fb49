"""Readiness on the real dispatch path, and the "waiting but unmatched" alert.

Ready means: the database answers, we hold the leader lock, and a dispatch
round completed within ``ready_max_round_age_secs`` (the loop wakes at least
every tick, so a live loop always has a recent round). The stuck alert fires
when a parked request and claimable work for it have coexisted unmatched for
longer than ``stuck_alert_secs``; it is computed by its own thread, so a
wedged dispatch loop cannot silence it.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from arbiter.server.metrics import METRICS
from arbiter.store import db, leases

log = logging.getLogger("arbiter.probes")


class StuckMonitor:
    def __init__(self, settings, runtime):
        self.settings = settings
        self.runtime = runtime
        self.alerting = False
        self.oldest_unmatched = 0.0
        METRICS.set_gauge("arbiter_stuck_dispatch", 0)
        METRICS.set_gauge("arbiter_oldest_unmatched_seconds", 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stuck-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        # A quarter of the alert's threshold (at most 7.5 s): the alert fires at most that late.
        interval = min(7.5, self.settings.stuck_alert_secs / 4)
        while not self._stop.wait(interval):
            try:
                self.check()
            except db.UNAVAILABLE:
                pass
            except Exception:  # noqa: BLE001
                log.exception("stuck check failed")

    def check(self) -> None:
        tickets = self.runtime.dispatcher.parked_snapshot()
        oldest = 0.0
        if tickets and self.runtime.leader.is_leader:
            with self.runtime.pool.connection() as conn:
                claimable = leases.claimable_real_languages(conn)
            now = time.monotonic()
            waiting = [now - t.parked_at for t in tickets if claimable.intersection(t.languages)]
            oldest = max(waiting, default=0.0)
        self.oldest_unmatched = oldest
        alert = oldest > self.settings.stuck_alert_secs
        METRICS.set_gauge("arbiter_oldest_unmatched_seconds", round(oldest, 3))
        METRICS.set_gauge("arbiter_stuck_dispatch", 1 if alert else 0)
        if alert and not self.alerting:
            log.error("dispatch stuck: claimable work and a parked request unmatched",
                      extra={"alert": "StuckDispatch", "waiting_secs": round(oldest, 1)})
        elif self.alerting and not alert:
            log.info("dispatch unstuck", extra={"alert": "StuckDispatch"})
        self.alerting = alert


def readiness(runtime) -> tuple[bool, dict]:
    settings = runtime.settings
    reasons = []
    age = None
    if runtime.dispatcher.last_round_completed is not None:
        age = time.monotonic() - runtime.dispatcher.last_round_completed
    if not runtime.health.up:
        reasons.append("database unreachable")
    if not runtime.leader.is_leader:
        reasons.append("not the leader")
    if age is None:
        reasons.append("no dispatch round completed yet")
    elif age > settings.ready_max_round_age_secs:
        reasons.append(f"last dispatch round {age:.1f}s ago")
    if runtime.monitor.alerting:
        reasons.append("stuck dispatch alert")
    METRICS.set_gauge("arbiter_last_round_age_seconds", round(age, 3) if age is not None else -1)
    METRICS.set_gauge("arbiter_is_leader", 1 if runtime.leader.is_leader else 0)
    METRICS.set_gauge("arbiter_db_up", 1 if runtime.health.up else 0)
    body = {
        "ready": not reasons,
        "reasons": reasons,
        "leader": runtime.leader.is_leader,
        "db_up": runtime.health.up,
        "last_round_age_secs": round(age, 3) if age is not None else None,
        "parked": len(runtime.dispatcher.parked_snapshot()),
        "legacy_compat": runtime.dispatcher.legacy_compat,
        "stuck_alert": runtime.monitor.alerting,
        # Which process answered (arbiter/server/roles.py): a probe of the process, not of a submission.
        "role": runtime.role,
        "pid": os.getpid(),
    }
    return not reasons, body
