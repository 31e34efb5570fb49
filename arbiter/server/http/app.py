"""The Falcon application (ASGI): routes, middleware and error mapping.

Responders are coroutines on the server's event loop (arbiter/server/serving.py); their database calls,
which are short, run on ``runtime``'s thread pools (``await runtime.db(...)``)."""

from __future__ import annotations

import logging

import falcon
import falcon.asgi

from arbiter.server.http import base, operator_api, worker_api
from arbiter.server.http.auth import WorkerAuth
from arbiter.server.http.operator_access import OperatorAccess
from arbiter.server.http.request_log import RequestLog
from arbiter.store import db

log = logging.getLogger("arbiter.app")

# Routes that answer without the database (probes, metrics, the API description).
_DB_FREE = {"/healthz", "/readyz", "/metrics", "/openapi.json"}

# While the database is away (a failover takes about 10 s) the answer is 503 at once, costing the arbiter
# no database work; workers come back when told (worker/backoff.py as_told), so the first of them
# is here within about this long after the new primary answers.
DATABASE_RETRY_SECS = 1


class DatabaseGate:
    """While the database is known to be down, every DB-backed request gets 503 at once. After
    routing: a path that names no route is a 404 whatever the database does, and the request's
    route is known to its metric and log line."""

    def __init__(self, runtime):
        self.runtime = runtime

    async def process_resource(self, req, resp, resource, params):
        if resource is not None and req.path not in _DB_FREE and not self.runtime.health.up:
            raise falcon.HTTPServiceUnavailable(title="unavailable", description="database unreachable",
                                                retry_after=DATABASE_RETRY_SECS)


def _database_unavailable(runtime):
    async def handle(req, resp, exc, params):
        runtime.health.mark_down(exc)
        raise falcon.HTTPServiceUnavailable(title="unavailable", description="database unreachable",
                                            retry_after=DATABASE_RETRY_SECS)

    return handle


async def _unexpected(req, resp, exc, params):
    if isinstance(exc, falcon.HTTPError):
        raise exc
    log.exception("unhandled error", extra={"route": req.uri_template})
    raise falcon.HTTPInternalServerError(title="internal error")


# What needs no parked state: served by the dispatching process and by every lease process.
LEASE_ROUTES = [
    ("/v1/leases/{submission_id:int(min=1, max=9223372036854775807)}/heartbeat", worker_api.Heartbeat),
    ("/v1/leases/{submission_id:int(min=1, max=9223372036854775807)}/result", worker_api.Result),
    ("/v1/leases/{submission_id:int(min=1, max=9223372036854775807)}/release", worker_api.Release),
    ("/v1/data/{digest}", worker_api.DataSet),
    ("/v1/blobs/{sha256}", worker_api.Blob),
]

ROUTES = [
    ("/v1/acquire", worker_api.Acquire),
    *LEASE_ROUTES,
    ("/v1/status", operator_api.StatusJson),
    ("/status", operator_api.StatusPage),
    ("/healthz", operator_api.Healthz),
    ("/readyz", operator_api.Readyz),
    ("/metrics", operator_api.Metrics),
    ("/openapi.json", operator_api.OpenApi),
]


class ClientGone:
    """ASGI wrapper: puts into each HTTP request's scope a coroutine function that returns once the
    client has disconnected. Valid after the body was read (the server then has nothing else to
    deliver): a parked acquire awaits it beside its ticket, so a closed connection frees its place.
    A stream cut on purpose (base.StreamCut) ends here, handled: the connection is closed."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            async def client_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass

            scope[base.CLIENT_GONE] = client_gone
        try:
            await self.app(scope, receive, send)
        except base.StreamCut:
            pass  # logged where it happened; returning unfinished makes the server close the connection
        finally:
            # The function holds the server's receive, whose request cycle holds this scope: a
            # reference cycle per request, left for the garbage collector's full passes, which then
            # stop the serving loop for 0.1-0.5 s with 10,000 connections open. Broken here, every
            # request's objects go when it ends (docs/decisions.md "Garbage collection").
            scope.pop(base.CLIENT_GONE, None)


def create_asgi(runtime) -> ClientGone:
    """What the server runs (arbiter/server/asgi.py)."""
    return ClientGone(create_app(runtime))


def create_lease_asgi(runtime) -> ClientGone:
    """What a lease process serves (arbiter/server/roles.py): lease traffic and its probes only. An
    acquire sent here is a 404: it belongs on the arbiter URL, where the parked requests are."""
    return ClientGone(create_app(runtime, LEASE_ROUTES + [("/healthz", operator_api.Healthz),
                                                           ("/readyz", operator_api.LeaseReadyz),
                                                           ("/v1/acquire", worker_api.AcquireElsewhere)]))


def create_app(runtime, routes=None) -> falcon.asgi.App:
    app = falcon.asgi.App(middleware=[RequestLog(), DatabaseGate(runtime), WorkerAuth(runtime),
                                 OperatorAccess(runtime.settings.operator_token)])
    app.req_options.strip_url_path_trailing_slash = True
    app.add_error_handler(Exception, _unexpected)
    app.add_error_handler(db.UNAVAILABLE, _database_unavailable(runtime))
    for path, resource in routes or ROUTES:
        app.add_route(path, resource(runtime))
    return app
