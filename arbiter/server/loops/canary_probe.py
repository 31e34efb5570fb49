"""The standing end-to-end probe: the leader keeps one unpinned canary in the queue at a time.

Every ``canary_interval_secs`` (0: off) a new canary is submitted once the previous one is decided;
any worker takes it (canaries go to the front of the queue) and judges it through the real path.
Its outcome sets ``arbiter_canary_last_success_timestamp_seconds`` (DB time) and
``arbiter_canary_duration_seconds``; the alert JudgeCanaryFailing fires when no canary succeeded
for three intervals. (The janitor forgets decided canaries older than ``canary_keep_secs``.)

Lifecycle of the probe's one canary (``ProbeState``): IDLE --submit/adopt--> OPEN --decided--> IDLE.
A new leader adopts an open canary left by the previous one instead of adding a second.
"""

from __future__ import annotations

import enum
import logging
import threading
import time

from arbiter.server.metrics import METRICS
from arbiter.store import canary, db, leases

log = logging.getLogger("arbiter.canary")

# How often the open canary is looked at: its timings come from the database, so a late look does
# not distort them; it only delays the metric.
MAX_LOOK_SECS = 2.0


class ProbeState(enum.Enum):
    IDLE = "idle"  # no canary of ours open; the next is due at ``next_due``
    OPEN = "open"  # ``open_id`` is in the queue or being judged


class CanaryProbe:
    def __init__(self, settings, pool, is_leader):
        self.settings = settings
        self.pool = pool
        self.is_leader = is_leader
        self.state = ProbeState.IDLE
        self.open_id: int | None = None
        self.next_due = 0.0
        self._seeded = False
        self._looks = 0  # looks at the open canary so far (they thin out as it ages)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="canary-probe", daemon=True)
        METRICS.set_gauge("arbiter_canary_interval_seconds", settings.canary_interval_secs)
        METRICS.set_gauge("arbiter_canary_duration_seconds", 0)
        # 0 until the leader's probe seeds it from the database (the alert ignores 0): declared
        # from the start so every arbiter exports the series the alert reads.
        METRICS.set_gauge("arbiter_canary_last_success_timestamp_seconds", 0)
        for outcome in ("as_expected", "unexpected"):
            METRICS.inc("arbiter_canaries_total", 0, outcome=outcome)

    def start(self) -> None:
        if self.settings.canary_interval_secs > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _look_after(self) -> float:
        """Seconds until the next look. An open canary: soon while it is young, then less and less
        often up to a quarter interval (one nobody takes costs a statement per quarter interval,
        not every 2 s). None open: when the next is due. Not leading: the base cadence (no DB)."""
        base = min(MAX_LOOK_SECS, self.settings.canary_interval_secs / 4)
        if not self.is_leader() or not self._seeded:
            return base
        if self.state is ProbeState.OPEN:
            return min(base * 2 ** min(self._looks, 10), self.settings.canary_interval_secs / 4)
        return max(base, self.next_due - time.monotonic())

    def _run(self) -> None:
        while not self._stop.wait(self._look_after()):
            if not self.is_leader():
                self._lose()
                continue
            try:
                with self.pool.connection() as conn:
                    self.tick(conn, time.monotonic())
            except db.UNAVAILABLE:
                pass
            except Exception:  # noqa: BLE001
                log.exception("canary probe failed")

    def _lose(self) -> None:
        """Leadership lost: forget what we tracked; the next leader adopts it."""
        self.state, self.open_id, self._seeded = ProbeState.IDLE, None, False
        self.next_due = 0.0  # leading again: adopt or submit at the first tick

    def tick(self, conn, now: float) -> None:
        if not self._seeded:
            # A restarted or new leader starts from the database's record; a site that never had a
            # successful canary counts from now (DB time), so the alert means "none for three
            # intervals of probing", not "none since 1970".
            last = canary.last_probe_success(conn)
            if last is None:
                last = leases.database_now(conn).timestamp()
            METRICS.set_gauge("arbiter_canary_last_success_timestamp_seconds", last)
            self._seeded = True
        if self.state is ProbeState.OPEN:
            result = canary.outcome(conn, self.open_id)
            self._looks += 1
            if result is None or result.decided:
                self._decided(result)
        if self.state is ProbeState.IDLE and now >= self.next_due:
            # Only when one is due (a new leader's first tick included): an idle probe costs nothing.
            adopted = canary.open_probes(conn)
            if adopted:
                self.state, self.open_id = ProbeState.OPEN, adopted[0]
            else:
                self.open_id = canary.submit(conn, self.settings.canary_language)
                self.state = ProbeState.OPEN
                self.next_due = now + self.settings.canary_interval_secs
            self._looks = 0

    def _decided(self, result: canary.Outcome | None) -> None:
        self.state, self.open_id = ProbeState.IDLE, None
        if result is None:
            return  # forgotten or rolled back under us: nothing to report
        METRICS.set_gauge("arbiter_canary_duration_seconds", round(result.total_s, 3))
        fields = {"submission_id": result.submission_id, "worker_id": result.worker_id,
                  "transport": result.transport, "verdict": result.status, "expected": result.expected,
                  "queued_s": result.queued_s, "judging_s": result.judging_s, "total_s": result.total_s}
        if result.as_expected:
            METRICS.inc("arbiter_canaries_total", outcome="as_expected")
            METRICS.set_gauge("arbiter_canary_last_success_timestamp_seconds", result.decided_at)
            log.info("canary as expected", extra=fields)
        else:
            METRICS.inc("arbiter_canaries_total", outcome="unexpected")
            log.error("canary got an unexpected verdict", extra={**fields, "alert": "JudgeCanaryFailing"})
