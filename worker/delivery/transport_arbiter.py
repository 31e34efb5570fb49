"""Arbiter transport: long-poll acquire (request_id reused across retries), heartbeats, results."""

from __future__ import annotations

import logging
import threading
import uuid

from arbiter.protocol.delivery import Delivery, DeliveryOutcome, for_result_status
from worker.backoff import Backoff
from worker.config import client_ssl_context
from worker.credential_file import CredentialFile
from worker.delivery.assignment import Assignment
from worker.delivery.http_client import ArbiterClient, Unreachable
from worker.delivery.outbox import Entry
from worker.judging.judge import Job

log = logging.getLogger("worker.arbiter")


def job_from_lease(lease: dict) -> Job:
    problem = lease["problem"]
    return Job(submission_id=lease["submission_id"], problem_id=problem["id"], problem_slug=problem["slug"],
               language=lease["language"], source=lease["source"], time_limit_ms=problem["time_limit_ms"],
               memory_limit_kb=problem["memory_limit_kb"], comparer=problem.get("comparer", "tokens"),
               checker_sha256=problem.get("checker_sha256"), data_digest=problem.get("data_digest"))


# The least a heartbeat waits at one URL, however short the interval (a busy arbiter answers late).
MIN_HEARTBEAT_WAIT_SECS = 1.0


class Heartbeats(threading.Thread):
    """Keeps one lease alive while it is judged; sets ``lost`` on 410 (or 403/404).

    A heartbeat waits at one URL no longer than an interval (at least MIN_HEARTBEAT_WAIT_SECS), not the
    request timeout: a URL that takes the request and never answers (a host gone silent, a port whose
    process is still starting) would otherwise hold the heartbeat longer than the lease lasts, where
    the next URL answers at once. A lease outlasts several intervals (docs/runbook.md, the lease port)."""

    def __init__(self, client: ArbiterClient, assignment: Assignment, interval: float, backoff_max: float):
        super().__init__(daemon=True, name=f"heartbeat-{assignment.job.submission_id}")
        self.client = client
        self.assignment = assignment
        self.interval = interval
        self.wait_per_url = min(client.timeout, max(interval, MIN_HEARTBEAT_WAIT_SECS))
        self.backoff = Backoff(1.0, backoff_max)
        self.lost = threading.Event()
        self.done = threading.Event()

    def beat(self) -> bool:
        """One heartbeat. False when the arbiter could not be reached."""
        a = self.assignment
        try:
            reply = self.client.heartbeat(a.job.submission_id, a.lease_token, timeout=self.wait_per_url)
        except Unreachable:
            return False
        if reply.status in (403, 404, 410):
            log.warning("lease lost", extra={"submission_id": a.job.submission_id, "status": reply.status})
            self.lost.set()
        return True

    def run(self) -> None:
        delay = self.interval
        while not self.done.wait(delay) and not self.lost.is_set():
            if self.beat():
                self.backoff.reset()
                delay = self.interval
            else:
                delay = min(self.interval, self.backoff.next_delay())

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)


class ArbiterTransport:
    name = "arbiter"

    def __init__(self, config, slot: int | None = None):
        """``slot``: the judge slot this transport asks for (None: a worker with one slot, which sends none)."""
        self.config = config
        self.slot = slot
        credential = (CredentialFile(config.credential_file, config.worker_id).current
                      if config.credential_file else config.credential)
        context = client_ssl_context(config.tls_ca_file) if config.tls_ca_file else None
        self.client = ArbiterClient(list(config.arbiter_urls), credential, timeout=config.request_timeout_secs,
                                    ssl_context=context)
        self.backoff = Backoff(config.backoff_initial_secs, config.backoff_max_secs)
        self._request_id: str | None = None

    def next_assignment(self, stopping: threading.Event) -> Assignment | None:
        """One long-poll. The same request_id is reused until an answer arrives, so a retry after a lost
        reply gets the same lease back instead of a second one."""
        if self._request_id is None:
            self._request_id = uuid.uuid4().hex
        try:
            reply = self.client.acquire(self._request_id, list(self.config.languages), self.config.long_poll_secs,
                                        slot=self.slot)
        except Unreachable as exc:
            if stopping.is_set():
                return None
            # A 503 (the database away, a failover, a stopping leader) says when to come back; silence does not.
            delay = self.backoff.next_delay(exc.retry_after)
            log.warning("arbiter unreachable; backing off", extra={"delay_secs": round(delay, 2),
                                                                    "error": str(exc)[:200]})
            stopping.wait(delay)
            return None
        self.backoff.reset()
        if reply.status == 200:
            self._request_id = None
            lease = reply.body
            return Assignment(job_from_lease(lease), lease["lease_token"], lease["lease_gen"], self.name)
        if reply.status == 204:
            return None
        self._request_id = None
        if reply.status == 410:
            return None
        if reply.status == 429:
            # This worker has its share of parked requests (earlier ones the arbiter still holds):
            # a passing state, not a fault; wait as told.
            try:
                told = float(reply.headers.get("retry-after", "1"))
            except ValueError:
                told = 1.0
            delay = self.backoff.as_told(told)
            log.warning("arbiter: too many parked requests of this worker; waiting",
                        extra={"status": 429, "delay_secs": round(delay, 2)})
            stopping.wait(delay)
            return None
        log.error("acquire refused", extra={"status": reply.status,
                                            "title": (reply.body or {}).get("title")})
        stopping.wait(self.backoff.next_delay())
        return None

    def keep_alive(self, assignment: Assignment) -> Heartbeats:
        beats = Heartbeats(self.client, assignment, self.config.heartbeat_interval_secs, self.config.backoff_max_secs)
        beats.beat()  # the first heartbeat confirms the lease (10 s -> full lease)
        beats.start()
        return beats

    def release(self, assignment: Assignment, reason: str) -> str:
        """Hand the lease back so that the submission is pending again at once: 'released'. If the
        arbiter cannot be reached or refuses, the lease expires by itself, as before there was a
        release: 'expires' (403, 404 and 410 mean it is not this worker's lease any more: nothing to
        hand back, 'released')."""
        try:
            reply = self.client.release(assignment.job.submission_id, assignment.lease_token, reason)
        except Unreachable as exc:
            log.warning("could not hand the lease back; it expires by itself",
                        extra={"submission_id": assignment.job.submission_id, "error": str(exc)[:200]})
            return "expires"
        if reply.status not in (200, 403, 404, 410):
            log.warning("lease release refused; it expires by itself",
                        extra={"submission_id": assignment.job.submission_id, "status": reply.status})
            return "expires"
        return "released"

    def entry_for(self, assignment: Assignment, verdict) -> Entry:
        return Entry(transport="arbiter", submission_id=assignment.job.submission_id, verdict=verdict.verdict,
                     lease_token=assignment.lease_token, lease_gen=assignment.lease_gen, time_ms=verdict.time_ms,
                     memory_kb=verdict.memory_kb, detail=verdict.detail, data_digest=verdict.data_digest)

    def deliver(self, entry: Entry) -> DeliveryOutcome:
        """docs/protocol.md, "Every answer and what the worker does" (arbiter.protocol.delivery)."""
        if entry.transport != "arbiter":
            return DeliveryOutcome(Delivery.REJECTED, "a direct-DB result cannot be delivered through the arbiter")
        try:
            reply = self.client.result(entry.submission_id, entry.result_payload())
        except Unreachable as exc:
            log.warning("result delivery failed; will retry", extra={"submission_id": entry.submission_id,
                                                                      "error": str(exc)[:200]})
            return DeliveryOutcome(Delivery.RETRY, retry_after=exc.retry_after)
        kind = for_result_status(reply.status)
        if kind is Delivery.REJECTED:
            return DeliveryOutcome(kind, f"HTTP {reply.status} {(reply.body or {}).get('title', '')}")
        return DeliveryOutcome(kind)

    def interrupt(self) -> None:
        """SIGTERM: end a parked acquire now instead of at the end of its long-poll."""
        self.client.abort_acquire()

    def close(self) -> None:
        pass
