"""The request log: an info line per request, except a worker's routine lease traffic answered with
a 2xx (a debug line); a refusal of that traffic is an info line. In process: Falcon's ASGI test
client and the real middleware, no server, no database."""

from __future__ import annotations

import logging

import falcon
import falcon.asgi
import falcon.testing
import pytest

from arbiter.server.http import operator_api, worker_api
from arbiter.server.http.request_log import RequestLog


class _Routine:
    routine = True

    async def on_post(self, req, resp, answer: int):
        if answer != 200:
            raise falcon.HTTPError(falcon.code_to_http_status(answer), title="refused")
        resp.media = {"ok": True}


class _Other:
    async def on_get(self, req, resp):
        resp.media = {"ok": True}


@pytest.fixture
def client():
    app = falcon.asgi.App(middleware=[RequestLog()])
    app.add_route("/routine/{answer:int}", _Routine())
    app.add_route("/other", _Other())
    return falcon.testing.TestClient(app)


def _request_lines(caplog, level):
    return [r for r in caplog.records if r.getMessage() == "request" and r.levelno == level]


def test_routine_2xx_is_a_debug_line_and_everything_else_an_info_line(client, caplog):
    with caplog.at_level(logging.INFO, logger="arbiter"):
        assert client.simulate_post("/routine/200").status_code == 200
        assert _request_lines(caplog, logging.INFO) == []
        for refused in (400, 410, 422):
            assert client.simulate_post(f"/routine/{refused}").status_code == refused
        assert client.simulate_get("/other").status_code == 200
        assert client.simulate_get("/nowhere").status_code == 404
    routes = [(r.route, r.status) for r in _request_lines(caplog, logging.INFO)]
    # The route names its field, not the field's converter (a metric label and a log field).
    assert routes == [("/routine/{answer}", 400), ("/routine/{answer}", 410),
                      ("/routine/{answer}", 422), ("/other", 200), ("unmatched", 404)]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="arbiter"):
        client.simulate_post("/routine/200")
    assert [(r.route, r.status) for r in _request_lines(caplog, logging.DEBUG)] == [("/routine/{answer}", 200)]


def test_the_routine_resources_are_exactly_a_workers_lease_traffic():
    routine = {cls.__name__ for module in (worker_api, operator_api) for cls in vars(module).values()
               if isinstance(cls, type) and getattr(cls, "routine", False)}
    assert routine == {"Acquire", "Heartbeat", "Result"}


def test_a_route_label_names_the_field_not_its_converter():
    from arbiter.server.http.app import ROUTES
    from arbiter.server.http.request_log import route_label

    labels = {route_label(path) for path, _ in ROUTES}
    assert "/v1/leases/{submission_id}/heartbeat" in labels
    assert not any(":" in label or "(" in label for label in labels), labels
    assert route_label(None) == "unmatched"
