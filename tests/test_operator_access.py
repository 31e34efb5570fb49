"""Who may read the operator endpoints: the middleware in-process (any client address), then the real
arbiter with an operator token, and the status figures on a site with history."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import falcon
import falcon.asgi
import falcon.testing
import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker

from arbiter.server.config import ConfigError, load_settings
from arbiter.server.http.operator_access import OperatorAccess

TOKEN = "operator-token-0123456789abcdef"
REMOTE = "203.0.113.5"


class _Operator:
    operator = True

    async def on_get(self, req, resp):
        resp.media = {"secret": "status"}


class _Open:
    async def on_get(self, req, resp):
        resp.media = {"alive": True}


def _app(token: str) -> falcon.testing.TestClient:
    # The arbiter's app is ASGI (arbiter/server/http/app.py), and so is the middleware.
    app = falcon.asgi.App(middleware=[OperatorAccess(token)])
    app.add_route("/status", _Operator())
    app.add_route("/healthz", _Open())
    return falcon.testing.TestClient(app)


def _basic(password: str, user: str = "anyone") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_without_a_token_only_loopback_may_read():
    client = _app("")
    assert client.simulate_get("/status", remote_addr="127.0.0.1").status_code == 200
    assert client.simulate_get("/status", remote_addr="::1").status_code == 200
    refused = client.simulate_get("/status", remote_addr=REMOTE)
    assert refused.status_code == 403 and "operator_token_file" in refused.json["description"]
    assert client.simulate_get("/status", remote_addr=REMOTE,
                               headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 403
    assert client.simulate_get("/healthz", remote_addr=REMOTE).status_code == 200


@pytest.mark.parametrize("remote", ["127.0.0.1", REMOTE])
def test_with_a_token_anyone_presenting_it_may_read_and_no_one_else(remote):
    client = _app(TOKEN)
    missing = client.simulate_get("/status", remote_addr=remote)
    assert missing.status_code == 401 and "Basic" in missing.headers["WWW-Authenticate"]
    for header in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", _basic("wrong"), "Basic !!!notbase64",
                   f"Token {TOKEN}"):
        assert client.simulate_get("/status", remote_addr=remote,
                                   headers={"Authorization": header}).status_code == 401, header
    for header in (f"Bearer {TOKEN}", f"bearer {TOKEN}", _basic(TOKEN), _basic(TOKEN, user="")):
        ok = client.simulate_get("/status", remote_addr=remote, headers={"Authorization": header})
        assert ok.status_code == 200 and ok.json == {"secret": "status"}, header
    assert client.simulate_get("/healthz", remote_addr=remote).status_code == 200


@pytest.mark.parametrize("mode,content,message", [
    (0o644, TOKEN, "readable by group/others"),
    (0o600, "short", "fewer than 16 characters"),
])
def test_a_bad_token_file_is_one_clear_error(tmp_path, mode, content, message):
    token = tmp_path / "operator-token"
    token.write_text(content + "\n")
    token.chmod(mode)
    config = tmp_path / "arbiter.toml"
    config.write_text(f'dsn = "postgresql:///x"\noperator_token_file = "{token}"\n')
    with pytest.raises(ConfigError, match=message):
        load_settings(config)
    config.write_text(f'dsn = "postgresql:///x"\noperator_token_file = "{tmp_path / "nope"}"\n')
    with pytest.raises(ConfigError, match="No such file"):
        load_settings(config)


def test_the_real_arbiter_serves_status_to_the_token_and_never_logs_it(db, arbiters, tmp_path):
    token = tmp_path / "operator-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    a = arbiters.start(db.dsn, operator_token_file=str(token))
    assert a.get("/v1/status")[0] == 401
    assert a.get("/metrics")[0] == 401
    assert a.get("/healthz")[0] == 200 and a.get("/readyz")[0] == 200
    import urllib.request

    for path in ("/v1/status", "/metrics", "/status"):
        request = urllib.request.Request(a.url + path, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.status == 200
    assert TOKEN not in a.log_text()


def test_the_peer_is_the_socket_s_a_forwarded_for_header_is_not_read(db, arbiters):
    # The arbiter is served directly, never behind a proxy: the address that decides operator access is
    # the connection's, whatever a client writes in X-Forwarded-For (uvicorn would otherwise take it
    # from a client on loopback, and parse it on every request).
    import urllib.error
    import urllib.request

    a = arbiters.start(db.dsn)
    request = urllib.request.Request(a.url + "/v1/status", headers={"X-Forwarded-For": REMOTE})
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == 200


def test_status_counts_live_work_exactly_and_the_history_as_an_estimate(db, arbiters, tmp_path):
    with db.connect() as conn:
        seed_problem(conn)
        add_worker(conn, "home-1")
        seed_submissions(conn, 3)  # pending
        decided = seed_submissions(conn, 200)
        conn.execute("UPDATE submissions SET status = 'AC' WHERE id = ANY(%s)", (decided,))
        conn.execute("ANALYZE submissions")
    a = arbiters.start(db.dsn)
    status, snap = a.get("/v1/status")
    assert status == 200
    assert snap["queue"] == {"pending": 3, "judging": 0}
    assert snap["decided_estimate"] == 200  # exact right after ANALYZE; an estimate in general
    out = subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, "status", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["queue"] == {"pending": 3, "judging": 0}
    page = a.get("/status")[1]
    assert "decided, all time (the planner&#x27;s estimate)" in page and "~200" in page
