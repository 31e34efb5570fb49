"""What operators and monitoring read: liveness and readiness probes, Prometheus metrics, the site's
status (JSON for judgectl, a page for people) and the OpenAPI description."""

from __future__ import annotations

import json
import os
import time

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


class LeaseReadyz(Resource):
    """A lease process's readiness (arbiter/server/roles.py): it needs the database and nothing else."""

    async def on_get(self, req, resp):
        up = self.runtime.health.up
        json_reply(resp, falcon.HTTP_200 if up else falcon.HTTP_503,
                   {"ready": up, "reasons": [] if up else ["database unreachable"], "db_up": up,
                    "role": self.runtime.role, "pid": os.getpid()})


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
        counters = self.runtime.counters
        resp.text = METRICS.render(counters.others() if counters is not None else None)


def _queue_gauges(runtime) -> None:
    """From a database thread: the queue's gauges, as the database has them now."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        found = status.queue_gauges(cur)
    for state, count in found["queue"].items():
        METRICS.set_gauge("arbiter_queue_submissions", count, status=state)
    METRICS.set_gauge("arbiter_oldest_pending_seconds", round(found["oldest_pending_secs"], 3))
    for state, count in found["workers"].items():
        METRICS.set_gauge("arbiter_workers", count, state=state)


def status_snapshot(runtime, contest: bool = False) -> dict:
    """From a database thread. ``contest``: the status page's contest-day view too (its alerts)."""
    with runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        site = status.snapshot(cur)
        if contest:
            site.update(status.contest_view(cur))
    _, ready = probes.readiness(runtime)
    site = {"arbiter": ready, **site}
    if contest:
        site["alerts"] = alerts(runtime, site)
    return site


# The same thresholds as the alert rules (ansible/roles/judge_monitoring/files/judge-arbiter.rules.yml).
BACKLOG_SECS = 180
SYSTEM_ERROR_WINDOW_MINUTES = 15


def alerts(runtime, site: dict) -> list[str]:
    """The alert conditions this arbiter can see for itself, each named as its Prometheus rule."""
    found = []
    ready = site["arbiter"]
    if not ready["db_up"]:
        found.append("JudgeArbiterDatabaseUnreachable: this arbiter cannot reach PostgreSQL")
    if ready["stuck_alert"]:
        found.append("JudgeDispatchStuck: work and a waiting worker unmatched")
    if site["oldest_pending_secs"] > BACKLOG_SECS:
        found.append(f"JudgeBacklog: the oldest waiting submission has waited {site['oldest_pending_secs']:.0f} s")
    errors = sum(row["count"] for row in site["verdicts_last_hour"]
                 if row["verdict"] == "system_error" and row["minutes_ago"] < SYSTEM_ERROR_WINDOW_MINUTES)
    if errors:
        found.append(f"JudgeSubmissionSystemError: {errors} submission(s) ended system_error in the last "
                     f"{SYSTEM_ERROR_WINDOW_MINUTES} min")
    interval = runtime.settings.canary_interval_secs
    last = METRICS.get("arbiter_canary_last_success_timestamp_seconds")
    if interval > 0 and last > 0 and time.time() - last > 3 * interval:
        found.append(f"JudgeCanaryFailing: no canary judged right for {time.time() - last:.0f} s")
    return found


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
        resp.text = render(await self.runtime.db(status_snapshot, self.runtime, True))


class OpenApi(Resource):
    async def on_get(self, req, resp):
        from arbiter.server.http.openapi import build_spec

        json_reply(resp, falcon.HTTP_200, build_spec(self.settings))
