"""Scenario 2: the arbiter is down for a while; workers keep judging; results land late, none twice.

The seed speaks of a 2-minute outage. The test keeps the proportions that matter (outage longer than
the lease and the grace period, several backoff rounds) and shortens the clock:
JUDGE_S2_OUTAGE_SECS (default 12) sets the outage; JUDGE_S2_OUTAGE_SECS=120 runs the seed's figure.
"""

import os
import time

from support.checks import assert_each_submission_decided_once_by_its_last_lease
from support.fixtures_data import seed_problem, seed_user
from support.procs import add_worker, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS

from arbiter.store import leases

OUTAGE_SECS = float(os.environ.get("JUDGE_S2_OUTAGE_SECS", "12"))
WORKER = {"heartbeat_interval_secs": 0.5, "long_poll_secs": 2.0, "backoff_initial_secs": 0.5,
          "backoff_max_secs": 3.0}


def sleepy_aplusb(seconds_per_test: float) -> str:
    return f"import time\ntime.sleep({seconds_per_test})\na, b = map(int, input().split())\nprint(a + b)\n"


def test_outage_longer_than_lease_judges_nothing_twice_and_fails_nothing(db, arbiters, workers, tmp_path):
    with db.connect() as conn:
        problem = seed_problem(conn, xp_reward=10, time_limit_ms=int(OUTAGE_SECS * 1000))
        user = seed_user(conn)
        creds = {w: add_worker(conn, w) for w in ("home-1", "home-2")}
    testdata = tmp_path / "testdata"
    write_testdata(testdata, problem, APLUSB_TESTS)
    a = arbiters.start(db.dsn, lease_secs=3.0, unconfirmed_secs=2.0, grace_secs=6.0)
    started = {worker_id: workers(worker_id, "home", "arbiter", testdata, arbiter_urls=[a.url],
                                  credential=creds[worker_id], **WORKER).start()
               for worker_id in ("home-1", "home-2")}
    # Both workers park before anything is submitted, so who judges what is decided by the arbiter,
    # not by which worker process happened to start faster: the long submission goes to one, and the
    # short one to the other (the first is busy). Submitted the other way round, a slow start of the
    # second worker would let the first finish the short one and take the long one too.
    wait_for(lambda: a.metric("arbiter_parked_requests") == 2, 30, what="both workers to park")

    def submit_and_wait_confirmed(source: str) -> tuple[int, str]:
        with db.connect() as conn:
            submission = leases.submit(conn, user, problem, "python3", source)
            return submission, wait_for(lambda: conn.execute(
                "SELECT worker_id FROM submissions WHERE id = %s AND status = 'judging' "
                "AND lease_confirmed_at IS NOT NULL", (submission,)).fetchone(), 30,
                what=f"submission {submission} to be under a confirmed lease")[0]

    # One is still running when the arbiter comes back (its heartbeats resume); the other finishes
    # during the outage (its result waits in the outbox).
    outlives_outage, judges_through = submit_and_wait_confirmed(sleepy_aplusb(OUTAGE_SECS / 2))
    finishes_in_outage, delivers_late = submit_and_wait_confirmed(sleepy_aplusb(1.0))
    assert {judges_through, delivers_late} == set(started)

    a.kill9()
    went_down = time.monotonic()
    with db.connect() as conn:
        queued_meanwhile = leases.submit(conn, user, problem, "c", PROGRAMS["c"]["AC"])
    time.sleep(OUTAGE_SECS)
    with db.connect() as conn:
        rows = dict(conn.execute("SELECT id, status FROM submissions").fetchall())
        assert rows == {finishes_in_outage: "judging", outlives_outage: "judging", queued_meanwhile: "pending"}
        assert conn.execute("SELECT bool_and(lease_expires_at < now()) FROM submissions WHERE status = 'judging'"
                            ).fetchone() == (True,), "the outage must outlast the leases for the test to mean anything"
    waiting = [w for w in started.values() if w.outbox_files()]
    assert [w.worker_id for w in waiting] == [delivers_late], "the short submission's result waits in its outbox"

    a.start()
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                      ).fetchone()[0] == 0, 60 + OUTAGE_SECS, interval=0.2, what="all judged")
        counts = assert_each_submission_decided_once_by_its_last_lease(conn)
        assert counts == {"AC": 3}
        assert conn.execute("SELECT id, judge_attempts, lease_gen FROM submissions ORDER BY id").fetchall() == [
            (outlives_outage, 1, 1), (finishes_in_outage, 1, 1), (queued_meanwhile, 1, 1)]
        assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone() == (3,)
        assert conn.execute("SELECT xp FROM users WHERE id = %s", (user,)).fetchone() == (10,)
    assert time.monotonic() - went_down >= OUTAGE_SECS
    assert "grace period granted" in a.log_text()
    assert not any(w.outbox_files() for w in started.values())


def test_arbiter_paused_longer_than_the_lease_reclaims_nothing_on_resume(db, arbiters):
    """SIGSTOP is an outage the arbiter does not see start or end: its janitor notices the gap in DB time."""
    import signal

    from support.fixtures_data import seed_submissions

    from worker.delivery.http_client import ArbiterClient

    with db.connect() as conn:
        seed_problem(conn)
        sid, _ = seed_submissions(conn, 2)
        cred = add_worker(conn, "home-1")
    a = arbiters.start(db.dsn, lease_secs=3.0, grace_secs=4.0)
    # The start-up grace must be spent before the pause, or it (not the absence check) would save the lease.
    wait_for(lambda: "grace period granted" in a.log_text(), 10, what="the start-up grace period")
    client = ArbiterClient([a.url], cred)
    lease = client.acquire("r1", None, 5).body
    assert client.heartbeat(sid, lease["lease_token"]).status == 200
    a.signal_all(signal.SIGSTOP)
    try:
        time.sleep(5)  # the lease (3 s) runs out by the database's clock while nobody can heartbeat
    finally:
        a.signal_all(signal.SIGCONT)
    time.sleep(1.0)  # several janitor rounds after waking
    with db.connect() as conn:
        assert conn.execute("SELECT status, lease_token::text, judge_attempts FROM submissions WHERE id = %s",
                            (sid,)).fetchone() == ("judging", lease["lease_token"], 1)
    assert client.heartbeat(sid, lease["lease_token"]).status == 200
    assert client.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 200
    assert "janitor was absent" in a.log_text()
