"""What operators and monitoring read: liveness and readiness probes, Prometheus metrics, the site's
status (JSON for judgectl, a page for people) and the OpenAPI description."""

from __future__ import annotations

import json

import falcon
from psycopg.rows import dict_row

from arbiter.server.http.base import Resource, json_reply
from arbiter.server.loops import probes
from arbiter.server.metrics import METRICS
from arbiter.store import db, status


# -- probes, metrics, status -------------------------------------------------------
class Healthz(Resource):
    async def on_get(self, req, resp):
        json_reply(resp, falcon.HTTP_200, {"alive": True})


class Readyz(Resource):
    async def on_get(self, req, resp):
        ready, body = probes.readiness(self.runtime)
        json_reply(resp, falcon.HTTP_200 if ready else falcon.HTTP_503, body)


class Metrics(Resource):
    operator = True

    async def on_get(self, req, resp):
        probes.readiness(self.runtime)  # refreshes the probe gauges
        if METRICS.get("arbiter_db_up"):
            try:
                await self.runtime.db(_queue_gauges, self.runtime)
            except db.UNAVAILABLE:
                pass  # arbiter_db_up says so at the next scrape; the rest of the metrics are still worth a reply
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = METRICS.render()


def _queue_gauges(runtime) -> None:
    """From a database thread: the queue's gauges, as the database has them now."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        found = status.queue_gauges(cur)
    for state, count in found["queue"].items():
        METRICS.set_gauge("arbiter_queue_submissions", count, status=state)
    METRICS.set_gauge("arbiter_oldest_pending_seconds", round(found["oldest_pending_secs"], 3))


def status_snapshot(runtime) -> dict:
    """From a database thread."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        site = status.snapshot(cur)
    _, ready = probes.readiness(runtime)
    return {"arbiter": ready, **site}


async def _status_snapshot(runtime) -> dict:
    return await runtime.db(status_snapshot, runtime)


class StatusJson(Resource):
    operator = True

    async def on_get(self, req, resp):
        json_reply(resp, falcon.HTTP_200, json.loads(json.dumps(await _status_snapshot(self.runtime), default=str)))


class StatusPage(Resource):
    operator = True

    async def on_get(self, req, resp):
        from arbiter.server.http.status_page import render

        resp.content_type = falcon.MEDIA_HTML
        resp.text = render(await _status_snapshot(self.runtime))


class OpenApi(Resource):
    async def on_get(self, req, resp):
        from arbiter.server.http.openapi import build_spec

        json_reply(resp, falcon.HTTP_200, build_spec(self.settings))
