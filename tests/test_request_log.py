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


def test_with_the_database_down_a_route_gets_503_under_its_own_name_and_no_route_gets_404(own_cluster, arbiters):
    """The database gate answers after routing: its 503 is counted under the route it refused
    (it was "unmatched"), and a path that names no route is a 404 whatever the database does."""
    import json
    import urllib.error
    import urllib.request

    from support.procs import wait_for

    a = arbiters.start(own_cluster.judge_dsn)
    own_cluster.stop("immediate")
    try:
        wait_for(lambda: a.get("/readyz")[1] and a.get("/readyz")[1].get("db_up") is False, 30, 0.2,
                 "the arbiter to see the database down")
        answers = {}
        for path in ("/v1/leases/7/heartbeat", "/v1/nowhere"):
            request = urllib.request.Request(a.url + path, data=json.dumps({"lease_token": "x"}).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            try:
                urllib.request.urlopen(request, timeout=10)
            except urllib.error.HTTPError as refused:
                answers[path] = refused.code
        assert answers == {"/v1/leases/7/heartbeat": 503, "/v1/nowhere": 404}, answers
        text = a.get("/metrics")[1]
        assert 'arbiter_requests_total{route="/v1/leases/{submission_id}/heartbeat",status="503"} 1' in text, text
        assert 'arbiter_requests_total{route="unmatched",status="404"} 1' in text
    finally:
        own_cluster.start()
