"""The request log: one metric and one JSON line per request, and the count of refused results."""

from __future__ import annotations

import logging
import re
import time

from arbiter.protocol import delivery
from arbiter.server.http.base import log
from arbiter.server.metrics import METRICS

# A route's field converter ("{submission_id:int(min=1, max=...)}"): left out of the route's label,
# which names the field only ("/v1/leases/{submission_id}/heartbeat").
CONVERTER = re.compile(r"\{(\w+):[^}]*\}")


def route_label(uri_template: str | None) -> str:
    """The route a request matched, as metrics and logs name it; "unmatched" when it matched none (or
    was answered before routing: the database gate, a refused credential)."""
    return CONVERTER.sub(r"{\1}", uri_template) if uri_template else "unmatched"


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
        route = route_label(req.uri_template)
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
