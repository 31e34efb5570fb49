"""Cutover stage 2: legacy direct-DB workers and an arbiter worker on one database."""

from __future__ import annotations

import os
import threading

import psycopg
from support.fixtures_data import seed_problem, seed_user
from support.procs import aplusb_site, direct_transport, wait_for
from support.programs import PROGRAMS

from arbiter.store import leases

FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2, "backoff_max_secs": 2.0,
        "legacy_poll_secs": 0.2}


def legacy_login(db, name: str) -> str:
    """A per-host LOGIN role in the legacy group role, as the baseline deployment has."""
    role = f"{name.replace('-', '_')}_{os.getpid()}"
    with db.connect() as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE judge_legacy_worker')
        conn.execute(f'GRANT CONNECT ON DATABASE "{db.name}" TO "{role}"')
    return db.dsn.replace("user=postgres", f"user={role}")


def start_stage2_workers(db, site, arbiters, workers, with_production: bool) -> list:
    """Stage 2: home-1 on an arbiter, home-2 (and prod-1) on their legacy database accounts."""
    a = arbiters.start(db.dsn)
    procs = [
        workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred, **FAST),
        workers("home-2", "home", "direct", site.testdata, dsn=legacy_login(db, "home-2"), **FAST),
    ]
    if with_production:
        procs.append(workers("prod-1", "production", "direct", site.testdata, dsn=legacy_login(db, "prod-1"),
                             **FAST))
    for p in procs:
        p.start()
    return procs


def test_legacy_and_arbiter_workers_never_claim_the_same_submission(make_db, arbiters, workers, tmp_path):
    db = make_db("stage1")
    site = aplusb_site(db, tmp_path)
    with db.connect() as conn:
        sids = [leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"])
                for _ in range(45)]
    procs = start_stage2_workers(db, site, arbiters, workers, with_production=True)
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE status = 'AC'").fetchone()[0] == 45,
                 180, interval=0.5, what="all judged")
        per_submission = conn.execute("SELECT submission_id, count(*) FROM submission_judgings GROUP BY 1").fetchall()
        assert sorted(s for s, _ in per_submission) == sids
        assert all(n == 1 for _, n in per_submission), "a submission was judged twice"
        by_worker = dict(conn.execute("SELECT worker_id, count(*) FROM submission_judgings GROUP BY 1").fetchall())
        leased = conn.execute("SELECT count(*) FROM submission_judgings WHERE lease_token IS NOT NULL").fetchone()[0]
        assert leased == by_worker.get("home-1", 0) > 0
        assert by_worker.get("home-2", 0) > 0
        assert conn.execute("SELECT rr_last_home FROM judge_dispatch_state").fetchone()[0] in ("home-1", "home-2")
    for p in procs:
        errors = [line for line in p.log_text().splitlines() if '"level": "error"' in line]
        assert errors == [], errors


def test_legacy_home_worker_keeps_its_turns_beside_a_parked_arbiter_worker(make_db, arbiters, workers, tmp_path):
    """Stage 2 under a trickle of work: the arbiter's parked home worker is always first to know of
    new work, yet the legacy home worker still gets every other submission by the round-robin pointer
    (the gate of a rollback to stage 2 waits for exactly that)."""
    db = make_db("stage1")
    site = aplusb_site(db, tmp_path)
    user, problem = site.user, site.problem
    start_stage2_workers(db, site, arbiters, workers, with_production=False)
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM judge_nodes WHERE idle").fetchone()[0] == 2,
                 60, interval=0.2, what="both home workers idle")
        sids = []
        for _ in range(24):  # one at a time, each judged before the next arrives
            sids.append(leases.submit(conn, user, problem, "python3", PROGRAMS["python3"]["AC"]))
            wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s",
                                          (sids[-1],)).fetchone()[0] == "AC", 30, interval=0.05, what="judged")
            wait_for(lambda: conn.execute("SELECT count(*) FROM judge_nodes WHERE idle").fetchone()[0] == 2,
                     10, interval=0.05, what="both idle again")
        by_worker = dict(conn.execute("SELECT worker_id, count(*) FROM submission_judgings GROUP BY 1").fetchall())
    assert sum(by_worker.values()) == 24
    # Strict alternation is not promised (a poll can land between the pointer's moves), a fair share is.
    assert by_worker.get("home-2", 0) >= 8, by_worker
    assert by_worker.get("home-1", 0) >= 8, by_worker


def test_legacy_yield_rules(make_db, tmp_path):
    db = make_db("stage1")
    with db.connect() as conn:
        problem = seed_problem(conn)
        user = seed_user(conn)
        for _ in range(4):
            leases.submit(conn, user, problem, "python3", "print(1)")
    prod = direct_transport(db.dsn, "prod-1", "production", tmp_path)
    home1 = direct_transport(db.dsn, "home-1", "home", tmp_path)
    home2 = direct_transport(db.dsn, "home-2", "home", tmp_path)
    assert home1.claim() is not None  # home-1 announces itself idle and claims
    assert home2.claim() is not None
    # Both home workers idle again: production yields to them.
    with db.connect() as conn:
        conn.execute("UPDATE judge_nodes SET idle = true, last_seen = now()")
    assert prod.claim() is None
    # Round-robin: home-2 claimed last, so it is home-1's turn; home-2 yields.
    assert home2.claim() is None
    assert home1.claim() is not None
    # No idle home worker (stale heartbeat): production takes work.
    with db.connect() as conn:
        conn.execute("UPDATE judge_nodes SET last_seen = now() - interval '1 minute'")
    assert prod.claim() is not None


def test_legacy_global_lock_stalls_everyone_while_held(make_db, tmp_path):
    """The legacy weakness the arbiter removes: one worker holding the lock blocks all claims."""
    db = make_db("stage1")
    with db.connect() as conn:
        problem = seed_problem(conn)
        leases.submit(conn, seed_user(conn), problem, "python3", "print(1)")
    home = direct_transport(db.dsn, "home-1", "home", tmp_path)
    holder = psycopg.connect(db.dsn)
    holder.execute("SELECT * FROM judge_dispatch_state WHERE id = 1 FOR UPDATE")
    got = []
    t = threading.Thread(target=lambda: got.append(home.claim()))
    t.start()
    t.join(1.5)
    assert t.is_alive() and not got, "claim should wait for the global lock"
    holder.rollback()
    holder.close()
    t.join(5)
    assert got and got[0] is not None


def test_a_legacy_claim_made_as_the_stop_arrives_is_judged_not_stranded(make_db, workers, tmp_path):
    """Found by the cutover test: supervisord restarted a legacy worker just as it claimed a
    submission; the worker left without judging it, and nothing ever hands a legacy claim back."""
    db = make_db("stage1")
    site = aplusb_site(db, tmp_path)
    with db.connect() as conn:
        sid = leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"])
    w = workers("home-2", "home", "direct", site.testdata, dsn=legacy_login(db, "home-2"),
                env={"JUDGE_WORKER_FAULTS": "term_after_assignment"}, **FAST).start()
    assert w.proc.wait(60) == 0, w.log_text()
    with db.connect() as conn:
        assert conn.execute("SELECT status, worker_id FROM submissions WHERE id = %s", (sid,)).fetchone() == \
            ("AC", "home-2"), w.log_text()
        assert conn.execute("SELECT count(*) FROM submission_judgings WHERE submission_id = %s",
                            (sid,)).fetchone() == (1,)
