"""The workers' API: acquire (long-poll), heartbeat, result, release, and the test data and checker
blobs a worker fetches. Each resource is small: validate, call one state-machine function, map the
outcome (docs/protocol.md). ``urgent = True`` puts a resource's calls on the database lane that parked
or queued acquires never use (heartbeats, results, releases).

Heartbeat, Release and Result have the same shape (read the body, one named statement, count the
outcome, map a refusal with _outcome_error); kept as three resources on purpose, so that each
route's checks and reply read in one place."""

from __future__ import annotations

import asyncio
import math

import falcon

from arbiter.protocol.vocabulary import LANGUAGES, VERDICTS, VerdictCode
from arbiter.server.config import bind_port
from arbiter.server.http.base import (
    CLIENT_GONE,
    DIGEST,
    REQUEST_ID,
    Resource,
    StreamCut,
    field,
    json_reply,
    log,
    unavailable,
)
from arbiter.server.loops.tickets import Overloaded, Stopping, Ticket, TooManyParked
from arbiter.server.metrics import METRICS
from arbiter.store import db, leases, testblobs
from arbiter.store.leases import WriteOutcome


def _check_digest(value: str, what: str) -> None:
    if not DIGEST.fullmatch(value):
        raise falcon.HTTPBadRequest(title="malformed request", description=f"{what} is 64 hex digits")


class DataSet(Resource):
    """The files of a test-data set (by its digest): what a worker fetches to judge with it."""
    auth = True

    async def on_get(self, req, resp, digest: str):
        _check_digest(digest, "a data digest")
        files = await self.db(testblobs.data_set, digest=digest)
        if not files:
            raise falcon.HTTPNotFound(title="unknown data set", description=f"no test data stored as {digest}")
        json_reply(resp, falcon.HTTP_200, {"digest": digest, "files": files})


class Blob(Resource):
    """One stored test-data file by its SHA-256, streamed chunk by chunk; ``Range: bytes=N-`` resumes."""
    auth = True

    async def on_get(self, req, resp, sha256: str):
        _check_digest(sha256, "a file's sha256")
        size = await self.db(testblobs.blob_size, sha256=sha256)
        if size is None:
            raise falcon.HTTPNotFound(title="unknown file", description=f"no test-data file stored as {sha256}")
        first, last = 0, size - 1
        wanted = req.range  # (first, last), last -1 for "N-"; (-n, -1) for the last n bytes
        if wanted is not None:
            if req.range_unit != "bytes":
                raise falcon.HTTPRangeNotSatisfiable(size)
            first, last = wanted
            if first < 0:
                first, last = max(size + first, 0), size - 1
            elif last < 0 or last >= size:
                last = size - 1
            if first >= size and size > 0 or first > last + 1:
                raise falcon.HTTPRangeNotSatisfiable(size)
            resp.status = falcon.HTTP_206
            resp.set_header("Content-Range", f"bytes {first}-{last}/{size}")
        resp.content_type = "application/octet-stream"
        resp.set_header("Accept-Ranges", "bytes")
        resp.content_length = max(last - first + 1, 0)
        resp.stream = self._chunks(sha256, first, last + 1)

    async def _chunks(self, sha256: str, start: int, end: int):
        chunk = testblobs.CHUNK_BYTES
        seq, skip = divmod(start, chunk)
        position = start
        while position < end:
            try:
                data = await self.db(testblobs.blob_chunk, sha256=sha256, seq=seq)
            except db.UNAVAILABLE as exc:
                # The status line went out long ago: the only honest answer left is a body that ends
                # short. The worker keeps what arrived and resumes from there (Range) once we are back.
                log.warning("test-data download cut: the database went away mid-stream; the client resumes it",
                            extra={"sha256": sha256[:12], "sent_bytes": position - start,
                                   "error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})
                raise StreamCut() from None
            piece = data[skip:skip + (end - position)]
            yield piece
            position += len(piece)
            seq, skip = seq + 1, 0


class AcquireElsewhere(Resource):
    """/v1/acquire on a lease port (arbiter/server/roles.py): no parking lot here. A 404 that says
    where acquires go, for a worker whose arbiter URL names the lease port by mistake."""

    async def on_post(self, req, resp):
        raise falcon.HTTPNotFound(title="acquire is not served here",
                                  description="this port serves lease traffic only (heartbeats, results, "
                                              "releases, test data); acquire at the arbiter URL (its bind port)")


class Acquire(Resource):
    routine = True
    auth = True

    def __init__(self, runtime):
        super().__init__(runtime)
        # With lease processes (arbiter/server/roles.py) a grant names their port: the worker sends
        # this lease's heartbeats, result, release and data fetches there, at its arbiter URL's host.
        self.lease_port = bind_port(self.settings.lease_bind) if self.settings.lease_bind else None

    def _grant(self, lease: leases.Lease) -> dict:
        grant = lease.as_json()
        if self.lease_port is not None:
            grant["lease_port"] = self.lease_port
        return grant

    async def on_post(self, req, resp):
        worker = req.context.worker
        body = await self.read_json(req)
        request_id = field(body, "request_id", str)
        if not REQUEST_ID.fullmatch(request_id):
            raise falcon.HTTPBadRequest(title="malformed request",
                                        description="request_id must be 1-128 chars of A-Z a-z 0-9 . _ : -")
        wanted = field(body, "languages", list, required=False, default=list(worker.languages))
        if not all(isinstance(x, str) for x in wanted) or not set(wanted) <= set(LANGUAGES):
            raise falcon.HTTPUnprocessableEntity(title="unknown language",
                                                 description=f"languages must be among {sorted(LANGUAGES)}")
        languages = tuple(sorted(set(wanted) & set(worker.languages)))
        slot = field(body, "slot", int, required=False, default=0)
        if not 0 <= slot < worker.slots:
            raise falcon.HTTPUnprocessableEntity(
                title="unknown slot", description=f"slot must be 0..{worker.slots - 1}: this worker is registered "
                                                  f"with {worker.slots} slot(s) (judgectl worker ensure --slots)")
        wait = field(body, "wait_secs", float, required=False, default=self.settings.long_poll_max_secs)
        if not 0 <= wait < math.inf:
            raise falcon.HTTPBadRequest(title="malformed request", description="wait_secs must be a number >= 0")
        # A longer wait than this arbiter allows is served as its longest: a worker configured for a
        # longer long-poll than the arbiter (a config mismatch) still gets work instead of 400 forever.
        wait = min(wait, self.settings.long_poll_max_secs)
        # A retried request_id is recognised by the dispatch round that sees its ticket first (one
        # lookup for every request parked since the last round): its earlier lease, or 410.
        if self.runtime.dispatcher.stopping:
            METRICS.inc("arbiter_acquires_total", outcome="stopping")
            raise unavailable("this arbiter is stopping", 1)
        # Never longer than the worker asked to wait (a worker polling with wait_secs 0 gets its answer now).
        handover = min(self.settings.handover_wait_secs, wait)
        if not await _leading_within(self.runtime.leader, handover):
            raise unavailable("this arbiter is not the leader", int(self.settings.leader_retry_secs) or 1)
        if not languages:
            raise falcon.HTTPUnprocessableEntity(title="no language", description="no language in common with "
                                                 "the worker's registered languages")
        ticket = Ticket(worker=worker, request_id=request_id, languages=languages, slot=slot)
        try:
            self.runtime.dispatcher.park(ticket)
        except Stopping:
            METRICS.inc("arbiter_acquires_total", outcome="stopping")
            raise unavailable("this arbiter is stopping", 1) from None
        except Overloaded:
            METRICS.inc("arbiter_acquires_total", outcome="overloaded")
            raise unavailable("too many parked acquire requests", 1) from None
        except TooManyParked:
            METRICS.inc("arbiter_acquires_total", outcome="worker_parking_full")
            raise falcon.HTTPTooManyRequests(
                title="too many parked requests",
                description=f"this worker already has {self.settings.max_parked_per_worker * worker.slots} acquire "
                            "requests parked; wait for one to be answered", retry_after=1) from None
        try:
            await _until_answered_or_gone(ticket, wait, req.scope.get(CLIENT_GONE))
        finally:
            lease = await self.runtime.dispatcher.unpark_async(ticket)
        if lease is not None:
            METRICS.inc("arbiter_acquires_total", outcome="retry_live" if ticket.retried else "leased")
            return json_reply(resp, falcon.HTTP_200, self._grant(lease))
        if ticket.earlier_gone:
            METRICS.inc("arbiter_acquires_total", outcome="retry_dead")
            raise falcon.HTTPGone(title="lease gone",
                                  description="this request_id was served and its lease is no longer live; "
                                              "acquire with a new request_id")
        if self.runtime.dispatcher.stopping:
            raise unavailable("this arbiter is stopping", 1)
        if not self.runtime.leader.is_leader:
            # Its lock session ended under a parked request: the database failed over or was switched
            # over (this arbiter leads again within a second of the new primary), or another arbiter
            # took the lock (the worker's next URL, tried at once). Come back in a second either way.
            raise unavailable("this arbiter lost leadership", 1)
        METRICS.inc("arbiter_acquires_total", outcome="nothing")
        resp.status = falcon.HTTP_204


async def _leading_within(leader, secs: float) -> bool:
    """Whether this arbiter leads, now or within ``secs``: a worker turned away by a leader that is
    stopping comes here while the lock passes over (milliseconds; the standby waits on the lock), and
    parks here instead of backing off for a Retry-After. A standby with a live leader elsewhere turns
    the worker away after ``secs``, once, and the worker stays with the leader from then on."""
    deadline = asyncio.get_running_loop().time() + secs
    while not leader.is_leader:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _until_answered_or_gone(ticket: Ticket, wait: float, client_gone) -> None:
    """Wait for the ticket's signal, at most ``wait`` seconds, or until the client disconnects (so a
    worker that went away frees its parking place now, not when its long-poll would have ended)."""
    if client_gone is None:
        await ticket.event.wait_async(wait)
        return
    gone = asyncio.ensure_future(client_gone())
    try:
        await ticket.event.wait_async(wait, or_until=gone)
    finally:
        gone.cancel()


def _outcome_error(outcome: WriteOutcome, what: str):
    if outcome is WriteOutcome.GONE:
        return falcon.HTTPGone(title="lease gone", description=f"this lease is no longer current; the {what} "
                               "was not recorded")
    if outcome is WriteOutcome.NOT_YOURS:
        return falcon.HTTPForbidden(title="not your lease", description="the lease belongs to another worker")
    return falcon.HTTPNotFound(title="no such submission")


class Heartbeat(Resource):
    routine = True
    auth = True
    urgent = True

    async def on_post(self, req, resp, submission_id: int):
        body = await self.read_json(req)
        token = field(body, "lease_token", str)
        # Written with the heartbeats that came with it, in one statement (arbiter/server/group_commit.py).
        result = await self.runtime.heartbeat_writes.write(
            leases.HeartbeatWrite(req.context.worker.worker_id, submission_id, token))
        METRICS.inc("arbiter_heartbeats_total", outcome=result.outcome.value)
        if result.outcome is not WriteOutcome.ACCEPTED:
            raise _outcome_error(result.outcome, "heartbeat")
        json_reply(resp, falcon.HTTP_200, {"submission_id": submission_id, "expires_at": result.expires_at.isoformat()})


class Release(Resource):
    """The holder hands its lease back: the submission is pending again at once (or system_error once
    released max_releases times), instead of waiting out the lease."""

    auth = True
    urgent = True

    async def on_post(self, req, resp, submission_id: int):
        body = await self.read_json(req)
        token = field(body, "lease_token", str)
        reason = field(body, "reason", str, required=False, default="")
        if len(reason) > 500:
            raise falcon.HTTPBadRequest(title="malformed request", description="reason longer than 500 characters")
        worker = req.context.worker
        result = await self.db(leases.release, worker_id=worker.worker_id, submission_id=submission_id,
                               lease_token=token, reason=reason, max_releases=self.settings.max_releases)
        METRICS.inc("arbiter_releases_total", outcome=result.outcome.value)
        if result.outcome is WriteOutcome.ACCEPTED and result.status == VerdictCode.system_error:
            METRICS.inc("arbiter_system_errors_total", cause="releases")
        if result.outcome is not WriteOutcome.ACCEPTED:
            raise _outcome_error(result.outcome, "release")
        log.info("lease released", extra={"submission_id": submission_id, "worker_id": worker.worker_id,
                                          "status": result.status, "reason": reason})
        json_reply(resp, falcon.HTTP_200, {"submission_id": submission_id, "status": result.status})


class Result(Resource):
    routine = True
    # A refusal here that no retry can fix leaves a verdict in the worker's outbox/rejected/: counted
    # apart (arbiter_results_refused_total) for the alert JudgeResultRefused.
    counts_refusals = True
    auth = True
    urgent = True

    async def on_post(self, req, resp, submission_id: int):
        body = await self.read_json(req)
        token = field(body, "lease_token", str)
        verdict = field(body, "verdict", str)
        if verdict not in VERDICTS:
            raise falcon.HTTPUnprocessableEntity(title="unknown verdict",
                                                 description=f"verdict must be one of {sorted(VERDICTS)}")
        time_ms = field(body, "time_ms", int, required=False)
        memory_kb = field(body, "memory_kb", int, required=False)
        detail = field(body, "detail", dict, required=False, default={})
        data_digest = field(body, "data_digest", str, required=False)
        if data_digest is not None and not DIGEST.fullmatch(data_digest):
            raise falcon.HTTPBadRequest(title="malformed request", description="data_digest must be 64 hex digits")
        for name, value in (("time_ms", time_ms), ("memory_kb", memory_kb)):
            if value is not None and not 0 <= value < 2**31:
                raise falcon.HTTPBadRequest(title="malformed request", description=f"{name} out of range")
        worker = req.context.worker
        record = await self.runtime.result_writes.write(
            leases.ResultWrite(worker.worker_id, submission_id, token, verdict, time_ms, memory_kb, detail,
                               data_digest), weight=req.content_length or 0)
        METRICS.inc("arbiter_results_total", outcome=record.outcome.value)
        if record.outcome is WriteOutcome.ACCEPTED:
            METRICS.inc("arbiter_verdicts_total", verdict=verdict, worker=worker.worker_id)
            if verdict == VerdictCode.system_error:
                METRICS.inc("arbiter_system_errors_total", cause="worker")
            if record.judging_secs is not None:
                METRICS.observe("arbiter_judging_seconds", record.judging_secs, kind=worker.kind)
        if record.outcome not in (WriteOutcome.ACCEPTED, WriteOutcome.DUPLICATE):
            log.info("result refused", extra={"submission_id": submission_id, "worker_id": worker.worker_id,
                                              "outcome": record.outcome.value})
            raise _outcome_error(record.outcome, "result")
        log.info("result received", extra={"submission_id": submission_id, "worker_id": worker.worker_id,
                                           "verdict": record.verdict, "duplicate": record.outcome is WriteOutcome.DUPLICATE})
        # A repeat of the same token answers exactly as the first time.
        json_reply(resp, falcon.HTTP_200, {"submission_id": submission_id, "verdict": record.verdict, "status": "received"})
