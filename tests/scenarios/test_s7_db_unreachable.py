"""Scenario 7: arbiter up, database unreachable: 503 and backoff, nothing reclaimed, grace on recovery."""

import time

import psycopg
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from worker.delivery.http_client import ArbiterClient, Unreachable


def test_db_outage_answers_503_reclaims_nothing_and_grants_grace(own_cluster, arbiters):
    dsn = own_cluster.judge_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed_problem(conn)
        sid, _ = seed_submissions(conn, 2)
        cred = add_worker(conn, "home-1")
    a = arbiters.start(dsn, lease_secs=3.0, grace_secs=5.0)
    # The start-up grace must be spent first, or it (not the grace owed on recovery) would save the lease.
    wait_for(lambda: "grace period granted" in a.log_text(), 10, what="the start-up grace period")
    c = ArbiterClient([a.url], cred)
    lease = c.acquire("r1", None, 5).body
    assert lease["submission_id"] == sid
    assert c.heartbeat(sid, lease["lease_token"]).status == 200

    own_cluster.stop("immediate")
    # Every request gets 503 quickly with a Retry-After, probes say not ready.
    wait_for(lambda: a.get("/readyz")[0] == 503, 10, what="readyz to drop")
    for call in (lambda: c.heartbeat(sid, lease["lease_token"]),
                 lambda: c.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC"}),
                 lambda: c.acquire("r2", None, 1)):
        t0 = time.monotonic()
        try:
            call()
            raise AssertionError("a request succeeded while the database was down")
        except Unreachable as exc:
            assert "503" in str(exc) and exc.retry_after and exc.retry_after >= 1
        assert time.monotonic() - t0 < 5
    status, body = a.get("/readyz")
    assert status == 503 and "database unreachable" in body["reasons"]
    time.sleep(5)  # longer than lease_secs: the lease has expired by the clock

    own_cluster.start()
    a.wait_ready(30)
    # Readiness comes back with the first dispatch round; the janitor's recovery sweep may come a tick later.
    wait_for(lambda: a.metric("arbiter_grace_periods_total") >= 2, 10, what="the grace period owed on recovery")
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status, lease_token::text, lease_expires_at > now() FROM submissions "
                           "WHERE id = %s", (sid,)).fetchone()
        assert row == ("judging", lease["lease_token"], True), row
    out = c.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC"})
    assert out.status == 200
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT status, judge_attempts FROM submissions WHERE id = %s",
                            (sid,)).fetchone() == ("AC", 1)
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (1,)
    assert a.log_text().count("grace period granted") >= 2, "a grace period at start-up and one on recovery"
