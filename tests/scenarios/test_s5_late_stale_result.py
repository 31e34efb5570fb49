"""Scenario 5 over HTTP, as the seed's timeline: token A, stall, reclaim, token B to the same worker,
A's result arrives late -> 410 and B's result stands."""


from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from worker.delivery.http_client import ArbiterClient


def test_late_result_of_a_reclaimed_lease_is_fenced(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        (sid,) = seed_submissions(conn, 1)
        cred = add_worker(conn, "home-1")
    a = arbiters.start(db.dsn, lease_secs=2.0, unconfirmed_secs=2.0)
    c = ArbiterClient([a.url], cred)
    token_a = c.acquire("first", None, 3).body["lease_token"]
    assert c.heartbeat(sid, token_a).status == 200
    # home-1 stalls: no heartbeats. The lease expires and is reclaimed by DB time.
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone()[0]
                 == "pending", 15, what="reclaim")
    lease_b = c.acquire("second", None, 3).body
    assert lease_b["submission_id"] == sid and lease_b["lease_gen"] == 2
    token_b = lease_b["lease_token"]
    assert c.heartbeat(sid, token_b).status == 200
    late = c.result(sid, {"lease_token": token_a, "verdict": "WA"})
    assert late.status == 410
    with db.connect() as conn:
        assert conn.execute("SELECT status, lease_token::text FROM submissions WHERE id = %s",
                            (sid,)).fetchone() == ("judging", token_b)
    assert c.result(sid, {"lease_token": token_b, "verdict": "AC"}).status == 200
    # And A arriving even later changes nothing either.
    assert c.result(sid, {"lease_token": token_a, "verdict": "WA"}).status == 410
    with db.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone() == ("AC",)
        assert conn.execute("SELECT verdict, lease_gen FROM submission_judgings").fetchall() == [("AC", 2)]
