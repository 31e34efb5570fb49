"""The worker daemon as a real process against a real arbiter and database."""

from __future__ import annotations

import json
import time

import pytest
from support.fixtures_data import seed_problem, seed_user
from support.procs import add_worker, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS

from arbiter.store import leases

WORKER_FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
               "backoff_max_secs": 2.0}


@pytest.fixture
def lab(db, arbiters, workers, tmp_path):
    with db.connect() as conn:
        problem = seed_problem(conn, "aplusb", xp_reward=10)
        user = seed_user(conn, "alice")
        cred = add_worker(conn, "home-1")
    testdata = tmp_path / "testdata"
    write_testdata(testdata, problem, APLUSB_TESTS)

    def submit(language="python3", verdict="AC", source=None):
        with db.connect() as conn:
            return leases.submit(conn, user, problem, language, source or PROGRAMS[language][verdict])

    def status(sid):
        with db.connect() as conn:
            return conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone()[0]

    def history(sid):
        with db.connect() as conn:
            return conn.execute("SELECT verdict, lease_gen FROM submission_judgings WHERE submission_id = %s "
                                "ORDER BY seq", (sid,)).fetchall()

    return dict(db=db, arbiters=arbiters, workers=workers, testdata=testdata, cred=cred, submit=submit,
                status=status, history=history, problem=problem)


def start_worker(lab, arbiter, env=None, **extra):
    w = lab["workers"]("home-1", "home", "arbiter", lab["testdata"], arbiter_urls=[arbiter.url],
                       credential=lab["cred"], env=env, **{**WORKER_FAST, **extra})
    return w.start()


def test_worker_judges_real_submissions_with_correct_verdicts(lab):
    a = lab["arbiters"].start(lab["db"].dsn)
    expected = {lab["submit"](lang, v): v for lang in ("python3", "c", "cpp") for v in ("AC", "WA", "CE", "RE")}
    start_worker(lab, a)
    wait_for(lambda: all(lab["status"](s) not in ("pending", "judging") for s in expected), 120,
             interval=0.3, what="all judged")
    assert {s: lab["status"](s) for s in expected} == expected
    for sid in expected:
        assert len(lab["history"](sid)) == 1


def test_kill9_after_outbox_write_delivers_exactly_once_on_restart(lab):
    a = lab["arbiters"].start(lab["db"].dsn, lease_secs=30.0, unconfirmed_secs=10.0)
    sid = lab["submit"]("python3", "AC")
    w = start_worker(lab, a, env={"JUDGE_WORKER_FAULTS": "crash_after_outbox_write"})
    assert w.proc.wait(60) == -9  # killed itself right after the outbox write
    files = w.outbox_files()
    assert len(files) == 1 and lab["status"](sid) == "judging"
    w.env = {}
    w.start(env={"JUDGE_WORKER_FAULTS": ""})
    wait_for(lambda: lab["status"](sid) == "AC", 30, what="outbox delivered after restart")
    wait_for(lambda: not w.outbox_files(), 10, what="outbox cleared")
    assert lab["history"](sid) == [("AC", 1)]
    with lab["db"].connect() as conn:
        assert conn.execute("SELECT xp FROM users").fetchone() == (10,)
        assert conn.execute("SELECT judge_attempts FROM submissions WHERE id = %s", (sid,)).fetchone() == (1,)


def test_heartbeat_410_abandons_the_judging(lab):
    slow = "import time\ntime.sleep(2.5)\nprint(3)\n"  # 3 tests of 2.5 s each: the kill comes mid-test
    a = lab["arbiters"].start(lab["db"].dsn, lease_secs=30.0)
    sid = lab["submit"]("python3", source=slow)
    w = start_worker(lab, a, heartbeat_interval_secs=0.3)
    wait_for(lambda: "judging" in w.log_text() and lab["status"](sid) == "judging", 30, what="judging")
    with lab["db"].connect() as conn, conn.transaction():
        # The lease runs out (as if the worker had been silent) and is handed back, in one transaction so
        # that no heartbeat slips in between (a heartbeat on a still-current token extends it).
        conn.execute("UPDATE submissions SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (sid,))
        assert [r.submission_id for r in leases.reclaim_expired(conn, max_attempts=3)] == [sid]
    wait_for(lambda: "lease lost" in w.log_text(), 20, what="heartbeat 410")
    lost_at = time.monotonic()
    wait_for(lambda: "judging abandoned" in w.log_text(), 20, what="judging abandoned")
    assert time.monotonic() - lost_at < 2.0, "the running test was not killed on the 410"
    # The same worker may take the submission again, under a new generation; gen 1 never writes.
    wait_for(lambda: lab["status"](sid) not in ("pending", "judging"), 60, what="re-judged")
    assert [gen for _, gen in lab["history"](sid)] == [2]


def _parked(arbiter) -> float:
    status, text = arbiter.get("/metrics")
    assert status == 200
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("arbiter_parked_requests"))


def test_sigterm_cuts_a_parked_long_poll_short_and_work_still_flows(lab):
    """A stop (every restart, every cutover switch) does not wait for the long-poll to run out."""
    long_poll = 25.0
    a = lab["arbiters"].start(lab["db"].dsn, long_poll_max_secs=long_poll, unconfirmed_secs=2.0)
    w = start_worker(lab, a, long_poll_secs=long_poll)
    wait_for(lambda: _parked(a) >= 1, 30, what="the worker's acquire to park")
    stop_asked = time.monotonic()
    assert w.terminate(60) == 0
    took = time.monotonic() - stop_asked
    assert took < long_poll / 2, f"the stop waited {took:.1f}s for the long-poll"
    assert "worker stopped" in w.log_text()
    # Whatever the arbiter does with the cut request, the next worker judges the next submission.
    sid = lab["submit"]("python3")
    start_worker(lab, a, long_poll_secs=long_poll)
    wait_for(lambda: lab["status"](sid) == "AC", 60, interval=0.2, what="judged after the restart")
    assert len(lab["history"](sid)) == 1


def test_sigterm_finishes_the_current_submission_then_exits(lab):
    slow = "import time\ntime.sleep(1.5)\na, b = map(int, input().split())\nprint(a + b)\n"
    a = lab["arbiters"].start(lab["db"].dsn, lease_secs=30.0)
    sid = lab["submit"]("python3", source=slow)
    w = start_worker(lab, a)
    wait_for(lambda: lab["status"](sid) == "judging", 30, what="leased")
    time.sleep(0.3)
    assert w.terminate(60) == 0
    assert lab["status"](sid) == "AC"
    assert "worker stopped" in w.log_text()


def test_a_lease_taken_as_the_stop_arrives_is_handed_back_at_once(lab):
    """SIGTERM between taking a lease and judging it: the worker releases the lease (pending again,
    no attempt used) instead of leaving it to expire (unconfirmed_secs 10 here)."""
    a = lab["arbiters"].start(lab["db"].dsn, unconfirmed_secs=10.0, lease_secs=30.0)
    sid = lab["submit"]("python3")
    w = start_worker(lab, a, env={"JUDGE_WORKER_FAULTS": "term_after_assignment"})
    assert w.proc.wait(60) == 0, w.log_text()
    with lab["db"].connect() as conn:
        assert conn.execute("SELECT status, judge_attempts, lease_releases, lease_token FROM submissions "
                            "WHERE id = %s", (sid,)).fetchone() == ("pending", 0, 1, None), w.log_text()
    assert "stopping: handing the new lease back" in w.log_text()
    assert lab["history"](sid) == []


def test_a_worker_without_the_test_data_hands_the_lease_to_one_that_has_it(lab, tmp_path):
    """home-1 lacks the problem's test data: it releases the lease (a reason, not a verdict) and
    home-2, which has the data, judges it; no attempt is charged for home-1's releases."""
    a = lab["arbiters"].start(lab["db"].dsn, max_releases=1000, unconfirmed_secs=10.0, lease_secs=30.0)
    sid = lab["submit"]("python3")
    empty = tmp_path / "no-testdata"
    empty.mkdir()
    lab["workers"]("home-1", "home", "arbiter", empty, arbiter_urls=[a.url], credential=lab["cred"],
                   **WORKER_FAST).start()

    def releases():
        with lab["db"].connect() as conn:
            return conn.execute("SELECT lease_releases FROM submissions WHERE id = %s", (sid,)).fetchone()[0]

    wait_for(lambda: releases() >= 1, 30, what="home-1 handing the lease back")
    with lab["db"].connect() as conn:
        cred2 = add_worker(conn, "home-2")
    lab["workers"]("home-2", "home", "arbiter", lab["testdata"], arbiter_urls=[a.url], credential=cred2,
                   **WORKER_FAST).start()
    wait_for(lambda: lab["status"](sid) == "AC", 60, interval=0.2, what="judged by home-2")
    with lab["db"].connect() as conn:
        assert conn.execute("SELECT worker_id, verdict FROM submission_judgings WHERE submission_id = %s",
                            (sid,)).fetchall() == [("home-2", "AC")]
        assert conn.execute("SELECT judge_attempts FROM submissions WHERE id = %s", (sid,)).fetchone() == (1,)


def test_a_submission_no_worker_can_judge_ends_as_system_error_with_the_reason(lab, tmp_path):
    a = lab["arbiters"].start(lab["db"].dsn, max_releases=3)
    sid = lab["submit"]("python3")
    empty = tmp_path / "no-testdata"
    empty.mkdir()
    w = lab["workers"]("home-1", "home", "arbiter", empty, arbiter_urls=[a.url], credential=lab["cred"],
                       **WORKER_FAST).start()
    wait_for(lambda: lab["status"](sid) == "system_error", 60, interval=0.2, what="given up after 3 releases")
    with lab["db"].connect() as conn:
        ((reason,),) = conn.execute("SELECT detail->>'reason' FROM submission_judgings WHERE submission_id = %s",
                                    (sid,)).fetchall()
    assert reason.startswith("released 3 times by workers that could not judge it; last: no test data for problem")
    assert "cannot judge this submission here; handing the lease back" in w.log_text()


def test_an_entry_the_arbiter_refuses_for_good_is_moved_aside_and_the_rest_delivered(lab):
    """One outbox entry that can never be delivered (422: here a detail PostgreSQL cannot store, as an
    older or broken worker might have written it) must not block the entries behind it."""
    from worker.delivery.http_client import ArbiterClient
    from worker.delivery.outbox import Entry, Outbox

    a = lab["arbiters"].start(lab["db"].dsn, lease_secs=30.0, unconfirmed_secs=10.0)
    first, second = lab["submit"]("python3", "AC"), lab["submit"]("python3", "AC")
    client = ArbiterClient([a.url], lab["cred"], timeout=10)
    leased = {}
    for request_id in ("pre-1", "pre-2"):
        body = client.acquire(request_id, None, 5).body
        leased[body["submission_id"]] = body
    assert set(leased) == {first, second}
    w = lab["workers"]("home-1", "home", "arbiter", lab["testdata"], arbiter_urls=[a.url], credential=lab["cred"],
                       **WORKER_FAST)
    box = Outbox(w.outbox)
    for sid, detail, created in ((first, {"stderr": "a\u0000b"}, 1.0), (second, {}, 2.0)):
        box.put(Entry(transport="arbiter", submission_id=sid, verdict="AC", lease_token=leased[sid]["lease_token"],
                      lease_gen=leased[sid]["lease_gen"], time_ms=1, memory_kb=1, detail=detail, created_at=created))
    w.start()
    wait_for(lambda: lab["status"](second) == "AC", 30, what="the entry behind the refused one delivered")
    wait_for(lambda: not w.outbox_files(), 10, what="the outbox emptied")
    rejected = sorted((w.outbox / "rejected").glob("*.json"))
    assert [json.loads(p.read_text())["submission_id"] for p in rejected] == [first]
    assert '"outbox entry rejected"' in w.log_text() and "HTTP 422" in w.log_text()
    assert lab["status"](first) == "judging" and lab["history"](first) == []
