"""Scenario 9: the cutover goes wrong; one config switch per worker rolls back; nothing is lost.

Real processes throughout: legacy direct-DB workers, arbiter workers, an arbiter that is killed, a
schema migrated down under load. The Ansible playbooks (ansible/, tests/infra) drive the same steps
on the multi-host lab; this test pins down what the database must look like afterwards.
"""

from __future__ import annotations

import itertools
import threading

from support.checks import assert_each_submission_decided_once_by_its_last_lease
from support.fixtures_data import seed_problem, seed_user
from support.procs import add_worker, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS
from test_legacy_coexistence import legacy_login

from arbiter.ctl import main as ctl
from arbiter.store import leases, migrations

WORKER = {"heartbeat_interval_secs": 0.5, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
          "backoff_max_secs": 1.5, "legacy_poll_secs": 0.2}
SLOW = "import time\ntime.sleep(0.4)\na, b = map(int, input().split())\nprint(a + b)\n"


class Flow(threading.Thread):
    """Submissions keep arriving during the whole rollback, as on a live site."""

    def __init__(self, db, user, problem):
        super().__init__(daemon=True)
        self.db, self.user, self.problem = db, user, problem
        self.submitted: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        sources = itertools.cycle([SLOW, PROGRAMS["python3"]["AC"], SLOW, PROGRAMS["python3"]["WA"]])
        with self.db.connect() as conn:
            while not self.halt.wait(0.25):
                self.submitted.append(leases.submit(conn, self.user, self.problem, "python3", next(sources)))

    def stop(self) -> list[int]:
        self.halt.set()
        self.join(10)
        return self.submitted


def setup(make_db, stage, tmp_path):
    db = make_db(stage)
    with db.connect() as conn:
        problem = seed_problem(conn, xp_reward=10)
        user = seed_user(conn)
        creds = {w: add_worker(conn, w, kind) for w, kind in (("home-1", "home"), ("home-2", "home"),
                                                                ("prod-1", "production"))}
    testdata = tmp_path / "testdata"
    write_testdata(testdata, problem, APLUSB_TESTS)
    return db, problem, user, creds, testdata


def wait_all_judged_once(db, flow_ids):
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                      ).fetchone()[0] == 0, 120, interval=0.3, what="every submission judged")
        assert sorted(r[0] for r in conn.execute("SELECT id FROM submissions").fetchall()) == sorted(flow_ids)
        counts = assert_each_submission_decided_once_by_its_last_lease(conn)
        assert "system_error" not in counts, counts
        per_submission = conn.execute("SELECT submission_id, count(*) FROM submission_judgings "
                                      "WHERE decided_by = 'worker' GROUP BY 1").fetchall()
        assert len(per_submission) == len(flow_ids) and all(n == 1 for _, n in per_submission), \
            "a submission was judged twice"
        return counts, dict(conn.execute("SELECT worker_id, count(*) FROM submission_judgings GROUP BY 1").fetchall())


def test_stage2_arbiter_breaks_and_the_switched_worker_goes_back_to_direct(make_db, arbiters, workers, tmp_path):
    db, problem, user, creds, testdata = setup(make_db, "stage1", tmp_path)
    a = arbiters.start(db.dsn)
    home1 = workers("home-1", "home", "arbiter", testdata, arbiter_urls=[a.url], credential=creds["home-1"],
                    **WORKER).start()
    for worker_id, kind in (("home-2", "home"), ("prod-1", "production")):
        workers(worker_id, kind, "direct", testdata, dsn=legacy_login(db, worker_id), **WORKER).start()
    flow = Flow(db, user, problem)
    flow.start()
    with db.connect() as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE worker_id = 'home-1' AND "
                                      "status = 'judging' AND lease_confirmed_at IS NOT NULL").fetchone()[0],
                 30, what="home-1 judging under an arbiter lease")
    a.kill9()  # the stage goes wrong: the new part is dead with a lease out
    # Rollback: home-1 back to direct. SIGTERM lets it finish the submission in hand; the result waits in the
    # outbox, and the direct transport delivers it with the lease-checked statement on start-up.
    assert home1.terminate() == 0
    workers("home-1", "home", "direct", testdata, dsn=legacy_login(db, "home-1"), **WORKER).start()
    wait_for(lambda: not home1.outbox_files(), 30, what="home-1's outbox delivered over the direct transport")
    assert ctl.main(["--dsn", db.dsn, "leases", "drain", "--wait", "30"]) == 0
    wait_for(lambda: len(flow.submitted) > 25, 30, what="more submissions")
    counts, by_worker = wait_all_judged_once(db, flow.stop())
    assert set(counts) <= {"AC", "WA"}
    assert {"home-1", "home-2", "prod-1"} <= set(by_worker)
    with db.connect() as conn:
        legacy_after = conn.execute("SELECT count(*) FROM submission_judgings WHERE worker_id = 'home-1' "
                                    "AND lease_token IS NULL").fetchone()[0]
    assert legacy_after > 0, "home-1 judged on the direct transport after the rollback"


def test_stage4_rolls_back_to_the_legacy_scheme_under_load(make_db, arbiters, workers, tmp_path):
    db, problem, user, creds, testdata = setup(make_db, "stage4", tmp_path)
    a = arbiters.start(db.dsn)
    kinds = {"home-1": "home", "home-2": "home", "prod-1": "production"}
    procs = {w: workers(w, k, "arbiter", testdata, arbiter_urls=[a.url], credential=creds[w], **WORKER).start()
             for w, k in kinds.items()}
    flow = Flow(db, user, problem)
    flow.start()
    wait_for(lambda: len(flow.submitted) > 8, 30, what="submissions flowing")
    with db.connect() as conn:
        # Roll stage 4 back: the global lock and the round-robin row return; the arbiter notices and honours them.
        migrations.migrate(conn, "stage1")
        assert conn.execute("SELECT count(*) FROM judge_dispatch_state").fetchone() == (1,)
    wait_for(lambda: '"legacy_compat": true' in a.log_text(), 20, what="the arbiter to honour the legacy lock")
    for worker_id in ("prod-1", "home-2", "home-1"):  # one at a time, each taking work before the next
        assert procs[worker_id].terminate() == 0
        procs[worker_id] = workers(worker_id, kinds[worker_id], "direct", testdata,
                                   dsn=legacy_login(db, worker_id), **WORKER).start()
        with db.connect() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM submission_judgings WHERE worker_id = %s AND "
                                          "lease_token IS NULL", (worker_id,)).fetchone()[0] > 0,
                     30, what=f"{worker_id} to judge over the direct transport")
    a.stop()
    assert ctl.main(["--dsn", db.dsn, "leases", "drain", "--wait", "30"]) == 0
    submitted = flow.stop()
    counts, _ = wait_all_judged_once(db, submitted)
    assert set(counts) <= {"AC", "WA"}
    with db.connect() as conn:
        # All the way back to stage 0: the stage-1 columns go too, and the legacy scheme alone keeps judging.
        migrations.migrate(conn, "stage0")
        late = leases.submit(conn, user, problem, "python3", PROGRAMS["python3"]["AC"])
        wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s", (late,)).fetchone()[0] == "AC",
                 30, what="a submission judged on the pure legacy schema")
        assert conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                            ).fetchone() == (0,)
    for proc in procs.values():
        errors = [line for line in proc.log_text().splitlines() if '"level": "error"' in line]
        assert errors == [], errors
