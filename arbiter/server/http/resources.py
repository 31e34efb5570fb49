"""The HTTP resources. Each is small: validate, call one state-machine function, map the outcome.

Responders are coroutines (arbiter/server/http/app.py); ``await self.runtime.db(fn, ...)`` runs a state-machine
function on a database thread. ``urgent = True`` puts a resource's calls on the lane that parked or
queued acquires never use (heartbeats, results, releases)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from typing import Any

import falcon
from psycopg.rows import dict_row

from arbiter.protocol import delivery
from arbiter.server.loops import probes
from arbiter.server.loops.tickets import Overloaded, Stopping, Ticket, TooManyParked
from arbiter.server.metrics import METRICS
from arbiter.store import leases, status, testblobs
from arbiter.store.leases import WriteOutcome

# Scope key under which arbiter/server/http/app.py's ClientGone puts "wait until this client disconnects".
CLIENT_GONE = "arbiter.client_gone"
log = logging.getLogger("arbiter.http")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # matched whole (fullmatch): no trailing newline
DIGEST = re.compile(r"[0-9a-f]{64}")  # a test-data digest (arbiter/protocol/testdata.py), matched whole
# A worker's body nests 3-4 levels (detail.tests[i].field); anything deeper is refused before any
# code recurses over it.
MAX_JSON_DEPTH = 32


# -- request helpers ------------------------------------------------------------
def _not_a_number(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_storable(body: Any) -> None:
    """400 past MAX_JSON_DEPTH; 422 for the first value PostgreSQL cannot store (text and jsonb refuse
    NUL and lone surrogates; jsonb refuses non-finite numbers), naming where it is.

    Iterative, so a deep body cannot exhaust the stack here either."""
    stack: list[tuple[str, Any, int]] = [("body", body, 0)]
    while stack:
        where, value, depth = stack.pop()
        problem = None
        if isinstance(value, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise falcon.HTTPBadRequest(title="malformed request",
                                            description=f"{where} nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    problem = _bad_text(key)
                    if problem:
                        where = f"a key in {where}"
                        break
                    stack.append((f"{where}.{key}" if where != "body" else key, item, depth + 1))
            else:
                stack.extend((f"{where}[{i}]", item, depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            problem = _bad_text(value)
        elif isinstance(value, float) and not math.isfinite(value):
            problem = "is a number out of range"
        if problem:
            raise falcon.HTTPUnprocessableEntity(title="unstorable value", description=f"{where} {problem}")


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "contains \\u0000, which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not a Unicode character), which cannot be stored"
    return None


def _body_too_large(max_bytes: int) -> falcon.HTTPError:
    # The limit in the title too: a worker's log line names what to shrink below.
    return falcon.HTTPContentTooLarge(title=f"body too large (limit {max_bytes} bytes)",
                                      description=f"the body is larger than max_body_bytes ({max_bytes} bytes)")


async def read_json(req, max_bytes: int, timeout: float) -> dict[str, Any]:
    """The request's JSON object, or a 4xx: too large (413), not all there within ``timeout`` (408),
    not JSON or nested too deeply (400), a value PostgreSQL cannot store (422, naming the field).
    Nothing is written before this passes."""
    length = req.content_length
    if length is not None and length > max_bytes:
        raise _body_too_large(max_bytes)
    try:
        async with asyncio.timeout(timeout):
            raw = await req.bounded_stream.read(max_bytes + 1)
    except TimeoutError:
        METRICS.inc("arbiter_slow_clients_closed_total", phase="body")
        # The rest of the body may still come: the connection is closed after the answer.
        raise falcon.HTTPError(falcon.HTTP_408, title="body too slow",
                               description=f"the body did not arrive within {timeout:g} s",
                               headers={"Connection": "close"}) from None
    if len(raw) > max_bytes:
        raise _body_too_large(max_bytes)
    try:
        body = json.loads(raw, parse_constant=_not_a_number)  # NaN and Infinity are not JSON
    except RecursionError:
        raise falcon.HTTPBadRequest(title="malformed request",
                                    description=f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise falcon.HTTPBadRequest(title="malformed JSON", description=str(exc)) from None
    if not isinstance(body, dict):
        raise falcon.HTTPBadRequest(title="malformed request", description="the body must be a JSON object")
    _check_storable(body)
    return body


_KIND_NAMES = {str: "a string", list: "a list", dict: "an object"}


def _field(body: dict, name: str, kind, required: bool = True, default=None):
    if name not in body or body[name] is None:
        if required:
            raise falcon.HTTPBadRequest(title="malformed request", description=f"field {name!r} is required")
        return default
    value = body[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise falcon.HTTPBadRequest(title="malformed request", description=f"field {name!r} must be an integer")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise falcon.HTTPBadRequest(title="malformed request", description=f"field {name!r} must be a number")
    if kind in _KIND_NAMES and not isinstance(value, kind):
        raise falcon.HTTPBadRequest(title="malformed request",
                                    description=f"field {name!r} must be {_KIND_NAMES[kind]}")
    return value


def _json(resp, status, body: dict) -> None:
    resp.status = status
    resp.media = body


def _unavailable(description: str, retry_after: int) -> falcon.HTTPServiceUnavailable:
    return falcon.HTTPServiceUnavailable(title="unavailable", description=description, retry_after=retry_after)


class _Base:
    urgent = False

    def __init__(self, runtime):
        self.runtime = runtime
        self.settings = runtime.settings

    async def read_json(self, req) -> dict[str, Any]:
        return await read_json(req, self.settings.max_body_bytes, self.settings.body_timeout_secs)

    async def db(self, fn, **kwargs):
        """``fn(conn, **kwargs)`` with a pooled connection, on this resource's database lane."""
        def call():
            with self.runtime.pool.connection() as conn:
                return fn(conn, **kwargs)

        return await self.runtime.db(call, urgent=self.urgent)


# -- worker API ------------------------------------------------------------------
class DataSet(_Base):
    """The files of a test-data set (by its digest): what a worker fetches to judge with it."""
    auth = True

    async def on_get(self, req, resp, digest: str):
        if not DIGEST.fullmatch(digest):
            raise falcon.HTTPBadRequest(title="malformed request", description="a data digest is 64 hex digits")
        files = await self.db(testblobs.data_set, digest=digest)
        if not files:
            raise falcon.HTTPNotFound(title="unknown data set", description=f"no test data stored as {digest}")
        _json(resp, falcon.HTTP_200, {"digest": digest, "files": files})


class Blob(_Base):
    """One stored test-data file by its SHA-256, streamed chunk by chunk; ``Range: bytes=N-`` resumes."""
    auth = True

    async def on_get(self, req, resp, sha256: str):
        if not DIGEST.fullmatch(sha256):
            raise falcon.HTTPBadRequest(title="malformed request", description="a file's sha256 is 64 hex digits")
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
            data = await self.db(testblobs.blob_chunk, sha256=sha256, seq=seq)
            piece = data[skip:skip + (end - position)]
            yield piece
            position += len(piece)
            seq, skip = seq + 1, 0

class Acquire(_Base):
    routine = True
    auth = True

    async def on_post(self, req, resp):
        worker = req.context.worker
        body = await self.read_json(req)
        request_id = _field(body, "request_id", str)
        if not REQUEST_ID.fullmatch(request_id):
            raise falcon.HTTPBadRequest(title="malformed request",
                                        description="request_id must be 1-128 chars of A-Z a-z 0-9 . _ : -")
        wanted = _field(body, "languages", list, required=False, default=list(worker.languages))
        if not all(isinstance(x, str) for x in wanted) or not set(wanted) <= leases.LANGUAGES:
            raise falcon.HTTPUnprocessableEntity(title="unknown language",
                                                 description=f"languages must be among {sorted(leases.LANGUAGES)}")
        languages = tuple(sorted(set(wanted) & set(worker.languages)))
        slot = _field(body, "slot", int, required=False, default=0)
        if not 0 <= slot < worker.slots:
            raise falcon.HTTPUnprocessableEntity(
                title="unknown slot", description=f"slot must be 0..{worker.slots - 1}: this worker is registered "
                                                  f"with {worker.slots} slot(s) (judgectl worker ensure --slots)")
        wait = _field(body, "wait_secs", float, required=False, default=self.settings.long_poll_max_secs)
        if not 0 <= wait < math.inf:
            raise falcon.HTTPBadRequest(title="malformed request", description="wait_secs must be a number >= 0")
        # A longer wait than this arbiter allows is served as its longest: a worker configured for a
        # longer long-poll than the arbiter (a config mismatch) still gets work instead of 400 forever.
        wait = min(wait, self.settings.long_poll_max_secs)
        earlier = await self.db(leases.find_grant, worker_id=worker.worker_id, request_id=request_id)
        if earlier is not None:
            state, lease = earlier
            METRICS.inc("arbiter_acquires_total", outcome=f"retry_{state.value}")
            if state is leases.GrantState.LIVE:
                return _json(resp, falcon.HTTP_200, lease.as_json())
            raise falcon.HTTPGone(title="lease gone",
                                  description="this request_id was served and its lease is no longer live; "
                                              "acquire with a new request_id")
        if not self.runtime.leader.is_leader:
            raise _unavailable("this arbiter is not the leader", int(self.settings.leader_retry_secs) or 1)
        if not languages:
            raise falcon.HTTPUnprocessableEntity(title="no language", description="no language in common with "
                                                 "the worker's registered languages")
        ticket = Ticket(worker=worker, request_id=request_id, languages=languages, slot=slot)
        try:
            self.runtime.dispatcher.park(ticket)
        except Stopping:
            METRICS.inc("arbiter_acquires_total", outcome="stopping")
            raise _unavailable("this arbiter is stopping", 1) from None
        except Overloaded:
            METRICS.inc("arbiter_acquires_total", outcome="overloaded")
            raise _unavailable("too many parked acquire requests", 1) from None
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
            METRICS.inc("arbiter_acquires_total", outcome="leased")
            return _json(resp, falcon.HTTP_200, lease.as_json())
        if not self.runtime.leader.is_leader:
            raise _unavailable("this arbiter lost leadership", int(self.settings.leader_retry_secs) or 1)
        METRICS.inc("arbiter_acquires_total", outcome="nothing")
        resp.status = falcon.HTTP_204


async def _until_answered_or_gone(ticket: Ticket, wait: float, client_gone) -> None:
    """Wait for the ticket's signal, at most ``wait`` seconds, or until the client disconnects (so a
    worker that went away frees its parking place now, not when its long-poll would have ended)."""
    answered = asyncio.ensure_future(ticket.event.wait_async(wait))
    watchers = {answered}
    if client_gone is not None:
        watchers.add(asyncio.ensure_future(client_gone()))
    try:
        await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in watchers:
            task.cancel()


def _outcome_error(outcome: WriteOutcome, what: str):
    if outcome is WriteOutcome.GONE:
        return falcon.HTTPGone(title="lease gone", description=f"this lease is no longer current; the {what} "
                               "was not recorded")
    if outcome is WriteOutcome.NOT_YOURS:
        return falcon.HTTPForbidden(title="not your lease", description="the lease belongs to another worker")
    return falcon.HTTPNotFound(title="no such submission")


class Heartbeat(_Base):
    routine = True
    auth = True
    urgent = True

    async def on_post(self, req, resp, submission_id: int):
        body = await self.read_json(req)
        token = _field(body, "lease_token", str)
        result = await self.db(leases.heartbeat, worker_id=req.context.worker.worker_id,
                               submission_id=submission_id, lease_token=token, lease_secs=self.settings.lease_secs)
        METRICS.inc("arbiter_heartbeats_total", outcome=result.outcome.value)
        if result.outcome is not WriteOutcome.ACCEPTED:
            raise _outcome_error(result.outcome, "heartbeat")
        _json(resp, falcon.HTTP_200, {"submission_id": submission_id, "expires_at": result.expires_at.isoformat()})


class Release(_Base):
    """The holder hands its lease back: the submission is pending again at once (or system_error once
    released max_releases times), instead of waiting out the lease."""

    auth = True
    urgent = True

    async def on_post(self, req, resp, submission_id: int):
        body = await self.read_json(req)
        token = _field(body, "lease_token", str)
        reason = _field(body, "reason", str, required=False, default="")
        if len(reason) > 500:
            raise falcon.HTTPBadRequest(title="malformed request", description="reason longer than 500 characters")
        worker = req.context.worker
        result = await self.db(leases.release, worker_id=worker.worker_id, submission_id=submission_id,
                               lease_token=token, reason=reason, max_releases=self.settings.max_releases)
        METRICS.inc("arbiter_releases_total", outcome=result.outcome.value)
        if result.outcome is not WriteOutcome.ACCEPTED:
            raise _outcome_error(result.outcome, "release")
        log.info("lease released", extra={"submission_id": submission_id, "worker_id": worker.worker_id,
                                          "status": result.status, "reason": reason})
        _json(resp, falcon.HTTP_200, {"submission_id": submission_id, "status": result.status})


class Result(_Base):
    routine = True
    # A refusal here that no retry can fix leaves a verdict in the worker's outbox/rejected/: counted
    # apart (arbiter_results_refused_total) for the alert JudgeResultRefused.
    counts_refusals = True
    auth = True
    urgent = True

    async def on_post(self, req, resp, submission_id: int):
        body = await self.read_json(req)
        token = _field(body, "lease_token", str)
        verdict = _field(body, "verdict", str)
        if verdict not in leases.VERDICTS:
            raise falcon.HTTPUnprocessableEntity(title="unknown verdict",
                                                 description=f"verdict must be one of {sorted(leases.VERDICTS)}")
        time_ms = _field(body, "time_ms", int, required=False)
        memory_kb = _field(body, "memory_kb", int, required=False)
        detail = _field(body, "detail", dict, required=False, default={})
        data_digest = _field(body, "data_digest", str, required=False)
        if data_digest is not None and not DIGEST.fullmatch(data_digest):
            raise falcon.HTTPBadRequest(title="malformed request", description="data_digest must be 64 hex digits")
        for name, value in (("time_ms", time_ms), ("memory_kb", memory_kb)):
            if value is not None and not 0 <= value < 2**31:
                raise falcon.HTTPBadRequest(title="malformed request", description=f"{name} out of range")
        worker = req.context.worker
        record = await self.db(leases.record_result, worker_id=worker.worker_id, submission_id=submission_id,
                               lease_token=token, verdict=verdict, time_ms=time_ms, memory_kb=memory_kb,
                               detail=detail, data_digest=data_digest)
        METRICS.inc("arbiter_results_total", outcome=record.outcome.value)
        if record.outcome not in (WriteOutcome.ACCEPTED, WriteOutcome.DUPLICATE):
            log.info("result refused", extra={"submission_id": submission_id, "worker_id": worker.worker_id,
                                              "outcome": record.outcome.value})
            raise _outcome_error(record.outcome, "result")
        log.info("result received", extra={"submission_id": submission_id, "worker_id": worker.worker_id,
                                           "verdict": record.verdict, "duplicate": record.outcome is WriteOutcome.DUPLICATE})
        # A repeat of the same token answers exactly as the first time.
        _json(resp, falcon.HTTP_200, {"submission_id": submission_id, "verdict": record.verdict, "status": "received"})


# -- probes, metrics, status -------------------------------------------------------
class Healthz(_Base):
    async def on_get(self, req, resp):
        _json(resp, falcon.HTTP_200, {"alive": True})


class Readyz(_Base):
    async def on_get(self, req, resp):
        ready, body = probes.readiness(self.runtime)
        _json(resp, falcon.HTTP_200 if ready else falcon.HTTP_503, body)


class Metrics(_Base):
    operator = True

    async def on_get(self, req, resp):
        probes.readiness(self.runtime)  # refreshes the probe gauges
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = METRICS.render()


def status_snapshot(runtime) -> dict:
    """From a database thread."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        site = status.snapshot(cur)
    _, ready = probes.readiness(runtime)
    return {"arbiter": ready, **site}


async def _status_snapshot(runtime) -> dict:
    return await runtime.db(status_snapshot, runtime)


class StatusJson(_Base):
    operator = True

    async def on_get(self, req, resp):
        _json(resp, falcon.HTTP_200, json.loads(json.dumps(await _status_snapshot(self.runtime), default=str)))


class StatusPage(_Base):
    operator = True

    async def on_get(self, req, resp):
        from arbiter.server.http.status_page import render

        resp.content_type = falcon.MEDIA_HTML
        resp.text = render(await _status_snapshot(self.runtime))


class OpenApi(_Base):
    async def on_get(self, req, resp):
        from arbiter.server.http.openapi import build_spec

        _json(resp, falcon.HTTP_200, build_spec(self.settings))


class RequestLog:
    """Middleware: a metric per request and a JSON log line (never headers or bodies): at info level,
    except a worker's routine lease traffic answered with a 2xx (resources with ``routine = True``):
    several requests a second per judging worker at contest time, each already told by a line of its
    own ("lease granted", "result received") or by metrics (heartbeats), so a debug line. A refusal
    is always an info line."""

    def __init__(self):
        # The refusals a result can meet, exported at 0 from the start (a rate needs a first sample).
        for code in ("400", "403", "404", "413", "422"):
            METRICS.inc("arbiter_results_refused_total", 0, status=code)

    async def process_request(self, req, resp):
        req.context.started = time.monotonic()

    async def process_response(self, req, resp, resource, req_succeeded):
        route = req.uri_template or "unmatched"
        status = resp.status[:3] if isinstance(resp.status, str) else str(int(resp.status))
        METRICS.inc("arbiter_requests_total", route=route, status=status)
        if getattr(resource, "counts_refusals", False) and delivery.is_refusal(int(status)):
            METRICS.inc("arbiter_results_refused_total", status=status)
        level = logging.DEBUG if getattr(resource, "routine", False) and status[0] == "2" else logging.INFO
        if not log.isEnabledFor(level):
            return
        worker = getattr(req.context, "worker", None)
        log.log(level, "request", extra={"method": req.method, "route": route, "status": int(status),
                                   "ms": round((time.monotonic() - req.context.started) * 1000, 1),
                                   "worker_id": worker.worker_id if worker else None})
