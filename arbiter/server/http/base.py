"""What every resource of the arbiter shares: the resource base (its database lane, its JSON body),
reading and checking a request body (size, time, depth, text PostgreSQL can store), the answers'
shapes, and the patterns of ids and digests. Bad input is a clear 4xx here, before any resource code."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from typing import Any

import falcon

from arbiter.server.metrics import METRICS

# Scope key under which arbiter/server/http/app.py's ClientGone puts "wait until this client disconnects".
CLIENT_GONE = "arbiter.client_gone"
log = logging.getLogger("arbiter.http")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # matched whole (fullmatch): no trailing newline
DIGEST = re.compile(r"[0-9a-f]{64}")  # a test-data digest (arbiter/protocol/testdata.py), matched whole
# A worker's body nests 3-4 levels (detail.tests[i].field); anything deeper is refused before any
# code recurses over it.
MAX_JSON_DEPTH = 32


class StreamCut(Exception):  # noqa: N818 - an outcome, not an error: the response ends short, on purpose
    """A streamed response ends before its Content-Length, logged and handled (the client resumes
    with Range): the ASGI wrapper (app.py) returns without completing it, so the server closes the
    connection. Raised only after the response has started."""


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


def field(body: dict, name: str, kind, required: bool = True, default=None):
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


def json_reply(resp, status, body: dict) -> None:
    resp.status = status
    resp.media = body


def unavailable(description: str, retry_after: int) -> falcon.HTTPServiceUnavailable:
    return falcon.HTTPServiceUnavailable(title="unavailable", description=description, retry_after=retry_after)


class Resource:
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
