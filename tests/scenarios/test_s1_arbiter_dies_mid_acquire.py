"""Scenario 1: the arbiter dies mid-acquire: before COMMIT, after COMMIT before the reply, after the reply."""

import uuid

import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from worker.delivery.http_client import ArbiterClient, Unreachable


@pytest.fixture
def setup(db):
    with db.connect() as conn:
        seed_problem(conn)
        (sid,) = seed_submissions(conn, 1)
        cred = add_worker(conn, "home-1")
    return db, sid, cred


def row(db, sid):
    with db.connect() as conn:
        return conn.execute("SELECT status, lease_token::text, judge_attempts, "
                            "(SELECT count(*) FROM lease_grants) FROM submissions WHERE id = %s", (sid,)).fetchone()


def test_crash_before_commit_leaves_nothing(setup, arbiters):
    db, sid, cred = setup
    a = arbiters.start(db.dsn, env={"JUDGE_ARBITER_FAULTS": "crash_before_commit"})
    with pytest.raises(Unreachable):
        ArbiterClient([a.url], cred).acquire("req-1", None, 3)
    assert row(db, sid) == ("pending", None, 0, 0)  # the transaction rolled back with the process
    a.kill9()
    a.extra_env = {}
    a.start()
    lease = ArbiterClient([a.url], cred).acquire("req-1", None, 3).body
    assert lease["submission_id"] == sid and lease["lease_gen"] == 1


def test_crash_after_commit_retry_gets_the_same_lease(setup, arbiters):
    db, sid, cred = setup
    a = arbiters.start(db.dsn, env={"JUDGE_ARBITER_FAULTS": "crash_after_commit"})
    with pytest.raises(Unreachable):
        ArbiterClient([a.url], cred).acquire("req-1", None, 3)
    status, token, attempts, grants = row(db, sid)
    assert (status, attempts, grants) == ("judging", 1, 1)  # committed, but the worker never heard
    a.kill9()
    a.extra_env = {}
    a.start()
    c = ArbiterClient([a.url], cred)
    again = c.acquire("req-1", None, 3)
    assert again.status == 200 and again.body["lease_token"] == token
    assert row(db, sid)[3] == 1  # no second lease
    assert c.result(sid, {"lease_token": token, "verdict": "AC"}).status == 200


def test_crash_after_commit_without_retry_comes_back_unconfirmed(setup, arbiters):
    db, sid, cred = setup
    # A long lease and a short grace: only the unconfirmed expiry can bring the lease back this soon.
    a = arbiters.start(db.dsn, env={"JUDGE_ARBITER_FAULTS": "crash_after_commit"}, unconfirmed_secs=2.0,
                       lease_secs=60.0, grace_secs=1.0)
    with pytest.raises(Unreachable):
        ArbiterClient([a.url], cred).acquire("req-1", None, 3)
    a.kill9()
    a.extra_env = {}
    a.start()
    # Unconfirmed: back after the short expiry, not the lease period, and the attempt that never
    # reached a worker is given back.
    wait_for(lambda: row(db, sid)[0] == "pending", 15, what="unconfirmed lease reclaimed")
    assert row(db, sid)[2] == 0
    lease = ArbiterClient([a.url], cred).acquire(str(uuid.uuid4()), None, 3).body
    assert lease["submission_id"] == sid and lease["lease_gen"] == 2


def test_crash_after_reply_worker_carries_on(setup, arbiters):
    db, sid, cred = setup
    a = arbiters.start(db.dsn)
    c = ArbiterClient([a.url], cred)
    lease = c.acquire("req-1", None, 3).body
    a.kill9()
    a.start()
    assert c.heartbeat(sid, lease["lease_token"]).status == 200
    assert c.result(sid, {"lease_token": lease["lease_token"], "verdict": "WA"}).status == 200
    assert row(db, sid)[:3] == ("WA", lease["lease_token"], 1)
