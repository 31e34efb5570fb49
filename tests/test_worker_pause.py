"""judgectl worker pause/resume against a real arbiter and database: a paused worker is granted no new
lease (its parked requests stay parked, the work goes to others), the leases it holds run to their
end, and resume hands it work at once (the NOTIFY wakes the dispatcher); every bad input is one line
and exit 2, and a schema without pauses says so."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from worker.delivery.http_client import ArbiterClient


def judgectl(db, *args):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=60)


def park(c: ArbiterClient, wait: float):
    """An acquire in a thread; the box gets its reply."""
    box = {}

    def run():
        box["reply"] = c.acquire(str(uuid.uuid4()), None, wait)
        box["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def test_a_paused_worker_gets_nothing_new_finishes_what_it_holds_and_resumes(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        creds = {w: add_worker(conn, w, "production" if w.startswith("prod") else "home") for w in ("home-1", "prod-1")}
    # No periodic look at the queue during the test: only NOTIFYs (a submission, a resume) start one.
    a = arbiters.start(db.dsn, dispatch_tick_secs=30.0, dispatch_sweep_secs=30.0, unconfirmed_secs=20.0,
                       lease_secs=30.0, long_poll_max_secs=20.0)
    home, prod = (ArbiterClient([a.url], creds[w], timeout=30) for w in ("home-1", "prod-1"))
    with db.connect() as conn:
        (held,) = seed_submissions(conn, 1)
    lease = home.acquire("before-the-pause", None, 5).body
    assert lease["submission_id"] == held

    paused = judgectl(db, "worker", "pause", "home-1", "--reason", "disk check")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout == "paused home-1: no new leases; 1 lease(s) it holds run to their end\n"
    again = judgectl(db, "worker", "pause", "home-1")
    assert again.stdout.startswith("already paused home-1"), again.stdout
    listed = judgectl(db, "worker", "list").stdout
    assert "home-1           home       paused" in listed and "(disk check)" in listed, listed
    assert a.metric('arbiter_workers{state="paused"}') == 1

    # Home goes first, but a paused home worker is passed over: the production worker gets the work.
    home_thread, home_box = park(home, wait=3)
    prod_thread, prod_box = park(prod, wait=3)
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 2, what="both parked")
    with db.connect() as conn:
        (second,) = seed_submissions(conn, 1)
    prod_thread.join(10)
    home_thread.join(10)
    assert prod_box["reply"].status == 200 and prod_box["reply"].body["submission_id"] == second
    assert home_box["reply"].status == 204, "a paused worker's request ends with no work"

    # What it held before the pause runs to its end: heartbeats and the result are taken.
    assert home.heartbeat(held, lease["lease_token"]).status == 200
    assert home.result(held, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 200

    # Work waits while the only free worker is paused; resume wakes the dispatcher for its parked request.
    thread, box = park(home, wait=15)
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="home-1 parked while paused")
    with db.connect() as conn:
        (third,) = seed_submissions(conn, 1)
    time.sleep(1.0)
    assert "reply" not in box, "granted while paused"
    with db.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (third,)).fetchone() == ("pending",)
    resumed_at = time.monotonic()
    resumed = judgectl(db, "worker", "resume", "home-1")
    assert resumed.returncode == 0 and resumed.stdout == "resumed home-1\n", resumed
    thread.join(20)
    assert box["reply"].status == 200 and box["reply"].body["submission_id"] == third
    assert box["at"] - resumed_at < 10, "the parked request got the work when resumed, not on a later poll"
    assert judgectl(db, "worker", "resume", "home-1").stdout == "home-1 was not paused\n"
    assert a.metric('arbiter_workers{state="paused"}') == 0


def test_bad_pause_input_is_one_line_and_exit_2_and_changes_nothing(db, make_db):
    with db.connect() as conn:
        add_worker(conn, "home-1", "home")
    for args, message in [
        (("pause", "nosuch"), "judgectl: error: no worker 'nosuch' (judgectl worker list names them)"),
        (("resume", "nosuch"), "judgectl: error: no worker 'nosuch' (judgectl worker list names them)"),
        (("pause", "Bad Id!"), "judgectl: error: bad worker id 'Bad Id!': 1-63 chars of a-z, 0-9, '_' or '-', "
                               "starting with a letter or digit"),
        (("pause", "home-1", "--reason", "x" * 201), "judgectl: error: --reason must be at most 200 printable "
                                                      "characters"),
        (("pause", "home-1", "--reason", "two\nlines"), "judgectl: error: --reason must be at most 200 printable "
                                                         "characters"),
    ]:
        done = judgectl(db, "worker", *args)
        assert (done.returncode, done.stderr.strip()) == (2, message), (args, done.stderr)
        assert done.stdout == ""
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM worker_pauses").fetchone() == (0,)
    # Stages 2-3 (the legacy scheme beside the arbiter) have no pauses: the operator is told what to do.
    stage1 = make_db("stage1")
    with stage1.connect() as conn:
        add_worker(conn, "home-1", "home")
    done = judgectl(stage1, "worker", "pause", "home-1")
    assert done.returncode == 1 and done.stderr.strip() == (
        "judgectl: error: this database has no worker pauses before the stage-4 schema (judgectl migrate --to "
        "stage4)"), done.stderr
    listed = judgectl(stage1, "worker", "list")
    assert listed.returncode == 0 and "home-1" in listed.stdout, listed
