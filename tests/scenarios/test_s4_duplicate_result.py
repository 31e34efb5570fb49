"""Scenario 4: a result is recorded, the reply is lost, the worker sends it again."""

from support.faultproxy import FaultProxy
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker

from worker.delivery.http_client import ArbiterClient, Unreachable


def _leased_through_a_proxy(db, arbiters):
    """One submission, leased (and confirmed) by home-1 through a fault proxy in front of the arbiter."""
    with db.connect() as conn:
        seed_problem(conn, xp_reward=10)
        (sid,) = seed_submissions(conn, 1)
        cred = add_worker(conn, "home-1")
    a = arbiters.start(db.dsn)
    proxy = FaultProxy(a.port)
    c = ArbiterClient([proxy.url], cred)
    lease = c.acquire("r", None, 3).body
    assert c.heartbeat(sid, lease["lease_token"]).status == 200
    return sid, proxy, c, lease


def test_result_reply_dropped_then_resent_is_recorded_once(db, arbiters):
    sid, proxy, c, lease = _leased_through_a_proxy(db, arbiters)
    payload = {"lease_token": lease["lease_token"], "verdict": "AC", "time_ms": 3}
    proxy.drop_next("/result")
    try:
        first = c.result(sid, payload)  # the client retries a dropped kept-alive reply once by itself
    except Unreachable:
        first = None
    assert proxy.dropped == 1
    again = c.result(sid, payload)
    assert again.status == 200 and again.body == {"submission_id": sid, "verdict": "AC", "status": "received"}
    if first is not None:
        assert first.body == again.body
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM first_passes").fetchone() == (1,)
        assert conn.execute("SELECT xp FROM users").fetchone() == (10,)
        assert conn.execute("SELECT status FROM submissions").fetchone() == ("AC",)
    proxy.close()


def test_a_result_the_network_delivers_twice_is_recorded_once(db, arbiters):
    """The same request arrives twice (the proxy sends a copy half a second after the first): the
    copy is answered as the first was and writes nothing. Removed by hand: without
    ``status = 'judging'`` in record_result the copy writes again and the unique index on
    (submission_id, lease_token) turns it into a 500."""
    sid, proxy, c, lease = _leased_through_a_proxy(db, arbiters)
    armed = proxy.duplicate_next("/result", 0.5)
    first = c.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC", "time_ms": 3})
    assert first.status == 200 and armed.fired.wait(10)
    copy = [e for e in proxy.history if e.duplicate]
    assert [(e.path, e.status) for e in copy] == [(f"/v1/leases/{sid}/result", 200)], copy
    assert copy[0].reply == first.body
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (1,)
        assert conn.execute("SELECT xp FROM users").fetchone() == (10,)
    proxy.close()
