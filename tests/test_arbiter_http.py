"""The arbiter as a real gunicorn process against a real database."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import uuid

import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from worker.delivery.http_client import ArbiterClient


@pytest.fixture
def world(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        creds = {w: add_worker(conn, w, "production" if w.startswith("prod") else "home")
                 for w in ("home-1", "home-2", "prod-1")}
    return db, arbiters, creds


def client(arbiter, credential):
    return ArbiterClient([arbiter.url], credential, timeout=10)


def park(c, wait=5.0, request_id=None):
    """Start an acquire in a thread; returns (thread, box) where box gets (reply, seconds, finished_at)."""
    box = {}

    def run():
        t0 = time.monotonic()
        reply = c.acquire(request_id or str(uuid.uuid4()), None, wait)
        box["reply"], box["secs"], box["at"] = reply, time.monotonic() - t0, time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def raw_post(arbiter, path, body: bytes, credential=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", arbiter.port, timeout=10)
    h = {"Content-Type": "application/json", **(headers or {})}
    if credential:
        h["Authorization"] = f"Bearer {credential}"
    conn.request("POST", path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, (json.loads(data) if data else None)


def test_parked_acquire_is_woken_by_notify_within_100ms(world):
    db, arbiters, creds = world
    # A 30 s tick: only NOTIFY (not a polling tick) can wake the dispatcher within the test's window.
    a = arbiters.start(db.dsn, dispatch_tick_secs=30.0, long_poll_max_secs=20.0)
    c = client(a, creds["home-1"])
    thread, box = park(c, wait=15)
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="request parked")
    time.sleep(0.3)
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
        committed = time.monotonic()
    thread.join(15)
    reply = box["reply"]
    assert reply.status == 200 and reply.body["submission_id"] == sid
    latency = box["at"] - committed
    assert latency < 0.1, f"submit -> lease took {latency * 1000:.1f} ms"


def test_acquire_answers_204_after_the_long_poll_window(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn)
    thread, box = park(client(a, creds["home-1"]), wait=1.0)
    thread.join(10)
    assert box["reply"].status == 204
    assert 0.9 <= box["secs"] < 3


def test_a_longer_wait_than_the_arbiter_allows_is_served_as_its_longest(world):
    """A worker configured for a longer long-poll than this arbiter allows gets work, not 400 forever."""
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, long_poll_max_secs=1.0)
    thread, box = park(client(a, creds["home-1"]), wait=25.0)
    thread.join(10)
    assert box["reply"].status == 204 and 0.9 <= box["secs"] < 3
    for bad in (-1, "soon", [1]):
        status, body = raw_post(a, "/v1/acquire", json.dumps({"request_id": "x", "wait_secs": bad}).encode(),
                                creds["home-1"])
        assert status == 400, (bad, status, body)


def test_lease_result_duplicate_and_stale(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn)
    c = client(a, creds["home-1"])
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    lease = c.acquire("r-1", None, 5).body
    assert lease["submission_id"] == sid and lease["lease_gen"] == 1
    again = c.acquire("r-1", None, 5)
    assert again.status == 200 and again.body["lease_token"] == lease["lease_token"]
    assert c.heartbeat(sid, lease["lease_token"]).status == 200
    payload = {"lease_token": lease["lease_token"], "verdict": "AC", "time_ms": 12, "memory_kb": 3000}
    first = c.result(sid, payload)
    second = c.result(sid, payload)
    assert first.status == second.status == 200
    assert first.body == second.body == {"submission_id": sid, "verdict": "AC", "status": "received"}
    stale = c.result(sid, {"lease_token": str(uuid.uuid4()), "verdict": "WA"})
    assert stale.status == 410
    assert c.heartbeat(sid, lease["lease_token"]).status == 410
    gone = c.acquire("r-1", None, 1)
    assert gone.status == 410
    with db.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone() == ("AC",)
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (1,)
        assert conn.execute("SELECT xp FROM users").fetchone() == (10,)


def test_a_released_lease_is_taken_by_a_parked_worker_at_once_and_its_token_is_dead(world):
    """The release arrow over HTTP: a parked worker is woken by it (NOTIFY), not by lease expiry
    (lease_secs 60 here); a stale or foreign release is refused and writes nothing."""
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, dispatch_tick_secs=30.0, unconfirmed_secs=10.0, lease_secs=60.0,
                       long_poll_max_secs=20.0)
    first, second = client(a, creds["home-1"]), client(a, creds["home-2"])
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    lease = first.acquire("r-1", None, 5).body
    assert first.heartbeat(sid, lease["lease_token"]).status == 200
    thread, box = park(second, wait=15)
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="home-2 parked")
    assert second.release(sid, lease["lease_token"], "not mine").status == 403
    assert first.release(sid, str(uuid.uuid4()), "stale").status == 410
    released = first.release(sid, lease["lease_token"], "the worker is stopping")
    assert released.status == 200 and released.body == {"submission_id": sid, "status": "pending"}
    thread.join(15)
    assert box["reply"].status == 200 and box["reply"].body["submission_id"] == sid
    assert box["reply"].body["attempt"] == 1, "the released attempt was given back"
    # The old token is dead: a repeat of the release, a heartbeat or a result under it is 410.
    assert first.release(sid, lease["lease_token"], "again").status == 410
    assert first.heartbeat(sid, lease["lease_token"]).status == 410
    assert first.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 410
    assert a.metric('arbiter_releases_total{outcome="accepted"}') == 1


def test_home_workers_first_then_production(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, dispatch_tick_secs=30.0, unconfirmed_secs=15.0, lease_secs=20.0)
    prod_thread, prod_box = park(client(a, creds["prod-1"]), wait=3)
    home_thread, home_box = park(client(a, creds["home-1"]), wait=3)
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 2, what="two parked requests")
    with db.connect() as conn:
        seed_submissions(conn, 1)
    home_thread.join(10)
    prod_thread.join(10)
    assert home_box["reply"].status == 200
    assert prod_box["reply"].status == 204


def test_round_robin_is_fair_among_home_workers(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, dispatch_tick_secs=30.0, unconfirmed_secs=15.0, lease_secs=20.0)
    got = {"home-1": 0, "home-2": 0}
    for _ in range(6):
        threads = {w: park(client(a, creds[w]), wait=3) for w in got}
        wait_for(lambda: a.get("/readyz")[1]["parked"] == 2, what="both parked")
        with db.connect() as conn:
            seed_submissions(conn, 1)
        for w, (thread, box) in threads.items():
            thread.join(10)
            if box["reply"].status == 200:
                got[w] += 1
                lease = box["reply"].body
                assert client(a, creds[w]).result(lease["submission_id"],
                                                  {"lease_token": lease["lease_token"], "verdict": "WA"}).status == 200
    assert got == {"home-1": 3, "home-2": 3}


def test_bad_input_gets_clear_errors_and_changes_nothing(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, max_body_bytes=4096)
    c = client(a, creds["home-1"])
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    lease = c.acquire("r", None, 5).body
    token = lease["lease_token"]
    path = f"/v1/leases/{sid}/result"
    assert raw_post(a, path, b"{not json", creds["home-1"])[0] == 400
    assert raw_post(a, path, b"[1, 2]", creds["home-1"])[0] == 400
    assert raw_post(a, path, json.dumps({"verdict": "AC"}).encode(), creds["home-1"])[0] == 400
    status, body = raw_post(a, path, json.dumps({"lease_token": token, "verdict": "PASSED"}).encode(), creds["home-1"])
    assert status == 422 and "unknown verdict" in body["title"]
    big = json.dumps({"lease_token": token, "verdict": "AC", "detail": {"x": "y" * 10000}}).encode()
    assert raw_post(a, path, big, creds["home-1"])[0] == 413
    assert raw_post(a, path, json.dumps({"lease_token": token, "verdict": "AC"}).encode())[0] == 401
    assert raw_post(a, path, json.dumps({"lease_token": token, "verdict": "AC"}).encode(),
                    "home-1.wrongsecret")[0] == 401
    # Another worker presenting home-1's token: refused, nothing written.
    assert raw_post(a, path, json.dumps({"lease_token": token, "verdict": "AC"}).encode(), creds["home-2"])[0] == 403
    assert raw_post(a, f"/v1/leases/{sid}/heartbeat", json.dumps({"lease_token": token}).encode(),
                    creds["home-2"])[0] == 403
    assert raw_post(a, "/v1/leases/999999/result", json.dumps({"lease_token": token, "verdict": "AC"}).encode(),
                    creds["home-1"])[0] == 404
    assert raw_post(a, "/v1/acquire", json.dumps({"request_id": "bad id!"}).encode(), creds["home-1"])[0] == 400
    assert raw_post(a, "/v1/acquire", json.dumps({"request_id": "x", "languages": ["cobol"]}).encode(),
                    creds["home-1"])[0] == 422
    with db.connect() as conn:
        assert conn.execute("SELECT status, worker_id FROM submissions").fetchall() == [("judging", "home-1")]
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (0,)
    log = a.log_text()
    assert token not in log and creds["home-1"].split(".")[1] not in log


# Bodies no client should send, each refused with a 4xx and nothing written (never a 500): JSON
# nested past any sane depth, values PostgreSQL cannot store (NUL, a lone surrogate, in a value or
# a key), numbers that are not JSON (NaN, Infinity) or out of a double's range.
def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


HOSTILE_VALUES = [
    ("deep-5000", _deep(5000), 400),
    ("deep-100", _deep(100), 400),
    ("nul", json.dumps("a\u0000b"), 422),
    ("lone-surrogate", '"\\udc80"', 422),
    ("nan", "NaN", 400),
    ("infinity", "Infinity", 400),
    ("minus-infinity", "-Infinity", 400),
    ("overflow", "1e400", 422),
]


@pytest.mark.parametrize("name,value,status", HOSTILE_VALUES, ids=[h[0] for h in HOSTILE_VALUES])
def test_hostile_bodies_get_a_4xx_on_every_endpoint_and_change_nothing(world, name, value, status):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, lease_secs=30.0)
    c = client(a, creds["home-1"])
    # The janitor's start-up grace period extends every live lease; let it pass before the lease
    # exists, so that a changed expiry below can only be a request's doing.
    wait_for(lambda: a.metric("arbiter_grace_periods_total") >= 1, 20, what="the start-up grace period")
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    token = c.acquire("r", None, 5).body["lease_token"]

    def row():
        with db.connect() as conn:
            return conn.execute("SELECT status, worker_id, lease_token, lease_gen, judge_attempts, "
                                "lease_confirmed_at, lease_expires_at FROM submissions "
                                "WHERE id = %s", (sid,)).fetchone()

    before, graces_before = row(), a.metric("arbiter_grace_periods_total")
    tok = json.dumps(token)
    bodies = {
        "/v1/acquire": [f'{{"request_id": "r2", "wait_secs": 0, "languages": {value}}}',
                        f'{{"request_id": {value}}}'],
        f"/v1/leases/{sid}/heartbeat": [f'{{"lease_token": {value}}}',
                                        f'{{"lease_token": {tok}, "extra": {value}}}'],
        f"/v1/leases/{sid}/result": [f'{{"lease_token": {tok}, "verdict": "AC", "detail": {{"stderr": {value}}}}}',
                                     f'{{"lease_token": {tok}, "verdict": "AC", "detail": {{"tests": [{value}]}}}}',
                                     # a stale token too: the body is refused before the token is looked at
                                     f'{{"lease_token": "00000000-0000-0000-0000-000000000000", "verdict": "AC", '
                                     f'"detail": {{"x": {value}}}}}'],
    }
    if name in ("nul", "lone-surrogate"):  # in a key as well as in a value
        bodies[f"/v1/leases/{sid}/result"].append(
            f'{{"lease_token": {tok}, "verdict": "AC", "detail": {{{value}: 1}}}}')
    for path, variants in bodies.items():
        for body in variants:
            got, reply = raw_post(a, path, body.encode(), creds["home-1"])
            assert got == status, (path, body[:120], got, reply)
            assert reply["title"] and reply.get("description"), reply
    after = row()
    if a.metric("arbiter_grace_periods_total") == graces_before:
        assert after == before, "a refused request changed the submission or its lease"
    else:  # the janitor, starved on a loaded machine, owed a grace period: only the expiry may move
        assert after[:-1] == before[:-1], "a refused request changed the submission or its lease"
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM lease_grants").fetchone() == (1,)
    assert "Traceback" not in a.log_text()


def test_request_id_is_matched_whole(world):
    """The published pattern is the whole value: a trailing newline is not part of it."""
    db, arbiters, creds = world
    a = arbiters.start(db.dsn)
    got, reply = raw_post(a, "/v1/acquire", json.dumps({"request_id": "r1\n", "wait_secs": 0}).encode(),
                          creds["home-1"])
    assert got == 400 and "request_id" in reply["description"]
    assert raw_post(a, "/v1/acquire", json.dumps({"request_id": "r1", "wait_secs": 0}).encode(),
                    creds["home-1"])[0] == 204
    # A submission id past bigint names no submission: 404, not a database error.
    body = json.dumps({"lease_token": "x", "verdict": "AC"}).encode()
    assert raw_post(a, f"/v1/leases/{2**63}/result", body, creds["home-1"])[0] == 404
    assert raw_post(a, f"/v1/leases/{2**63 - 1}/result", body, creds["home-1"])[0] == 404


def test_one_worker_cannot_take_the_parking_lot(world):
    """A credential parks at most max_parked_per_worker requests; more get 429 + Retry-After, and
    other workers still park."""
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, max_parked=6, max_parked_per_worker=2)
    hog = client(a, creds["home-1"])
    parked = [park(hog, wait=5.0) for _ in range(2)]
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 2, what="two parked requests")
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
    conn.request("POST", "/v1/acquire", body=json.dumps({"request_id": "third", "wait_secs": 5}),
                 headers={"Authorization": f"Bearer {creds['home-1']}", "Content-Type": "application/json"})
    reply = conn.getresponse()
    body = json.loads(reply.read())
    conn.close()
    assert reply.status == 429 and reply.getheader("Retry-After") == "1", (reply.status, body)
    assert "already has 2" in body["description"]
    other_thread, other = park(client(a, creds["home-2"]), wait=1.0)
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 3, what="another worker parks beside them")
    other_thread.join(10)
    assert other["reply"].status == 204
    for thread, box in parked:
        thread.join(10)
        assert box["reply"].status == 204
    assert a.get("/readyz")[1]["parked"] == 0


def test_revoked_credential_is_refused(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn)
    c = client(a, creds["home-2"])
    assert c.acquire("x", None, 0).status == 204
    with db.connect() as conn:
        conn.execute("UPDATE workers SET revoked_at = now() WHERE worker_id = 'home-2'")
    wait_for(lambda: c.acquire(str(uuid.uuid4()), None, 0).status == 401, 5, what="revocation to apply")


def test_parked_long_polls_never_starve_heartbeats(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, max_parked=6, long_poll_max_secs=8.0)
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
        many = {f"home-p{i}": add_worker(conn, f"home-p{i}") for i in range(6)}
    lease = client(a, creds["home-1"]).acquire("mine", None, 5).body
    parked = [park(client(a, cred), wait=8) for cred in many.values()]
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 6, what="six parked requests")
    hb = client(a, creds["home-1"])
    for _ in range(10):
        t0 = time.monotonic()
        assert hb.heartbeat(sid, lease["lease_token"]).status == 200
        assert time.monotonic() - t0 < 1.0
    # One more long-poll is refused at once (503), however many threads or sockets are free.
    t0 = time.monotonic()
    with pytest.raises(Exception) as refused:
        client(a, creds["home-2"]).acquire("extra", None, 8)
    assert "too many parked" in str(refused.value) and time.monotonic() - t0 < 2
    assert client(a, creds["home-1"]).result(sid, {"lease_token": lease["lease_token"], "verdict": "WA"}).status == 200
    for thread, _ in parked:
        thread.join(15)


def test_kill9_and_restart_extends_in_flight_leases_and_resumes(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn, lease_secs=3.0, grace_secs=6.0)
    c = client(a, creds["home-1"])
    with db.connect() as conn:
        sid, later = seed_submissions(conn, 2)
    lease = c.acquire("k", None, 5).body
    assert c.heartbeat(sid, lease["lease_token"]).status == 200
    a.kill9()
    time.sleep(4)  # longer than lease_secs: by the clock the lease has run out while the arbiter was away
    with db.connect() as conn:
        assert conn.execute("SELECT lease_expires_at < now() FROM submissions WHERE id = %s", (sid,)).fetchone() == (True,)
    a.start()
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT lease_expires_at > now() + interval '4 seconds' FROM submissions "
                                      "WHERE id = %s", (sid,)).fetchone()[0], 10, what="grace period")
        assert conn.execute("SELECT status, lease_token::text FROM submissions WHERE id = %s",
                            (sid,)).fetchone() == ("judging", lease["lease_token"])
    assert c.heartbeat(sid, lease["lease_token"]).status == 200
    assert c.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 200
    nxt = c.acquire("k2", None, 5)
    assert nxt.status == 200 and nxt.body["submission_id"] == later
    with db.connect() as conn:
        assert conn.execute("SELECT judge_attempts FROM submissions WHERE id = %s", (sid,)).fetchone() == (1,)


def test_readyz_and_metrics(world):
    db, arbiters, creds = world
    a = arbiters.start(db.dsn)
    status, body = a.get("/readyz")
    assert status == 200 and body["ready"] and body["leader"] and body["db_up"]
    status, text = a.get("/metrics")
    assert status == 200
    assert "arbiter_dispatch_rounds_total" in text and "arbiter_is_leader 1" in text
    status, page = a.get("/status")
    assert status == 200 and "judge-arbiter" in page
    status, snap = a.get("/v1/status")
    assert status == 200 and {w["worker_id"] for w in snap["workers"]} == set(creds)


def test_openapi_document_matches_the_routes(world):
    from arbiter.server.http.app import ROUTES

    db, arbiters, creds = world
    a = arbiters.start(db.dsn)
    status, spec = a.get("/openapi.json")
    assert status == 200
    documented = set(spec["paths"])
    def template(path: str) -> str:  # the route without Falcon's converter: /v1/leases/{submission_id}/...
        return re.sub(r":int\([^)]*\)", "", path)

    served = {template(path) for path, _ in ROUTES}
    assert documented == served
    for path, resource in ROUTES:
        methods = {m[3:] for m in dir(resource) if m.startswith("on_")}
        assert methods == set(spec["paths"][template(path)]), path


def test_a_worker_told_429_waits_as_told_and_logs_no_error(db, arbiters, workers, tmp_path):
    from support.procs import aplusb_site, request_bytes

    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, max_parked_per_worker=1, long_poll_max_secs=10.0)
    # The worker's one parking place is held by another connection with its credential.
    held = socket.create_connection(("127.0.0.1", a.port))
    held.sendall(request_bytes("/v1/acquire", {"request_id": "held", "wait_secs": 10}, site.cred))
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="the place held")
    w = workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred,
                long_poll_secs=5.0, backoff_initial_secs=0.2).start()
    wait_for(lambda: "too many parked requests of this worker" in w.log_text(), 30, interval=0.2, what="a 429")
    held.close()
    assert "acquire refused" not in w.log_text()
    assert '"level": "error"' not in w.log_text()
