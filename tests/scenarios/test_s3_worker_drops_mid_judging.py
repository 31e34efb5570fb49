"""Scenario 3: a worker drops mid-judging (kill -9): its lease expires and is reclaimed; nobody else waits."""

import time

from support.fixtures_data import seed_problem, seed_user
from support.procs import add_worker, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS

from arbiter.store import leases

FAST = {"heartbeat_interval_secs": 0.5, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2, "backoff_max_secs": 2.0}


def test_killed_worker_costs_one_lease_period_and_blocks_no_one(db, arbiters, workers, tmp_path):
    with db.connect() as conn:
        problem = seed_problem(conn)
        user = seed_user(conn)
        creds = {w: add_worker(conn, w) for w in ("home-1", "home-2")}
        slow = leases.submit(conn, user, problem, "python3",
                             "import time\ntime.sleep(3)\na, b = map(int, input().split())\nprint(a + b)\n")
    testdata = tmp_path / "testdata"
    write_testdata(testdata, problem, APLUSB_TESTS)
    a = arbiters.start(db.dsn, lease_secs=3.0)
    w1 = workers("home-1", "home", "arbiter", testdata, arbiter_urls=[a.url], credential=creds["home-1"], **FAST)
    w1.start()
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT worker_id FROM submissions WHERE id = %s AND status = 'judging'",
                                      (slow,)).fetchone(), 30, what="home-1 judging")
        # home-2 is up and asking for work before home-1 dies: "nobody else waits" is then a question of
        # dispatch alone, not of how long a worker takes to start on a busy machine.
        w2 = workers("home-2", "home", "arbiter", testdata, arbiter_urls=[a.url], credential=creds["home-2"], **FAST)
        w2.start()
        wait_for(lambda: a.metric("arbiter_parked_requests") >= 1, 30, what="home-2 parked")
        w1.kill9()
        killed = time.monotonic()
        # Others are not blocked meanwhile: new work is leased while the dead lease is still held. Read
        # from the grants (by the database's clock), not from when the quick one was judged: on a busy
        # machine judging it may take longer than the dead lease has left, which blocks no one.
        quick = leases.submit(conn, user, problem, "c", PROGRAMS["c"]["AC"])
        wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s", (quick,)).fetchone()[0]
                 == "AC", 30, what="other work flows")
        wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s", (slow,)).fetchone()[0]
                 == "AC", 60, what="the dropped submission judged by home-2")
        assert time.monotonic() - killed >= 3.0  # it waited for the lease to run out, as designed
        rows = conn.execute("SELECT worker_id, lease_gen FROM submission_judgings WHERE submission_id = %s",
                            (slow,)).fetchall()
        assert rows == [("home-2", 2)]
        quick_leased = conn.execute("SELECT granted_at FROM lease_grants WHERE submission_id = %s", (quick,)).fetchone()[0]
        slow_released = conn.execute("SELECT granted_at FROM lease_grants WHERE submission_id = %s AND lease_gen = 2",
                                     (slow,)).fetchone()[0]
        assert quick_leased < slow_released, "new work waited for the dead lease to be reclaimed"
