"""No verdict is lost to a refusal (real arbiter, real judge-worker, real database):
- a detail the arbiter refuses as too large (413) is dropped, the verdict, time, memory and failed
  test are delivered;
- a result refused for good waits in outbox/rejected/, `judge-worker --rejected` lists it and
  `judge-worker --resend-rejected` delivers it once the cause is fixed;
- the judge keeps a detail within its budget however many tests a problem has (worker/judging/detail_budget.py,
  with a property test over sizes and shapes)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from support.procs import doubling_tests, problem_site, wait_for

from arbiter.store import leases
from worker.judging import detail_budget

WORKER = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2, "backoff_max_secs": 1.0}
LONG_LEASES = {"lease_secs": 120.0, "grace_secs": 120.0}
TESTS = 300
# Right on every test but the last: a + b, except 1 more when the answer is 2 * TESTS.
WRONG_AT_LAST = f"a, b = map(int, input().split())\nprint(a + b + (a + b == {2 * TESTS}))\n"
RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"


def site(db, tmp_path):
    seeded = problem_site(db, tmp_path, "many", doubling_tests(TESTS), time_limit_ms=2000)

    def submit(source):
        with db.connect() as conn:
            return leases.submit(conn, seeded.user, seeded.problem, "python3", source)

    def judging(sid):
        with db.connect() as conn:
            return conn.execute("SELECT s.status, j.verdict, j.time_ms, j.detail FROM submissions s "
                                "LEFT JOIN submission_judgings j ON j.submission_id = s.id WHERE s.id = %s",
                                (sid,)).fetchone()

    return seeded.cred, seeded.testdata, submit, judging


def test_a_detail_over_the_body_limit_is_dropped_and_the_verdict_delivered(db, arbiters, workers, tmp_path):
    cred, testdata, submit, judging = site(db, tmp_path)
    a = arbiters.start(db.dsn, max_body_bytes=8000, **LONG_LEASES)  # 300 rows of detail: ~24 KB
    w = workers("home-1", "home", "arbiter", testdata, arbiter_urls=[a.url], credential=cred, **WORKER).start()
    sid = submit(WRONG_AT_LAST)
    wait_for(lambda: judging(sid)[0] not in ("pending", "judging"), 120, interval=0.2, what="judged")
    status, verdict, time_ms, detail = judging(sid)
    assert (status, verdict) == ("WA", "WA") and time_ms is not None, w.log_text()[-3000:]
    assert detail["failed_test"] == TESTS and "413" in detail["detail_dropped"], detail
    assert "sending it without its detail" in w.log_text()
    assert not w.outbox_files() and not list((w.outbox / "rejected").glob("*.json"))
    assert 'arbiter_results_refused_total{status="413"} 1' in a.get("/metrics")[1]


def judge_worker(w, *args):
    return subprocess.run([sys.executable, "-m", "worker.main", "--config", str(w.config), *args],
                          capture_output=True, text=True, timeout=60)


def test_a_result_refused_for_good_waits_in_rejected_and_is_resent_once_fixed(db, arbiters, workers, tmp_path):
    cred, testdata, submit, judging = site(db, tmp_path)
    # A misconfigured arbiter: its body limit refuses even a result without detail (~180 bytes).
    a = arbiters.start(db.dsn, max_body_bytes=150, **LONG_LEASES)
    w = workers("home-1", "home", "arbiter", testdata, arbiter_urls=[a.url], credential=cred, **WORKER).start()
    sid = submit(RIGHT)
    wait_for(lambda: list((w.outbox / "rejected").glob("*.json")), 120, interval=0.2, what="the result rejected")
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == 0
    assert judging(sid)[0] == "judging", "nothing was written for the refused result"
    assert 'arbiter_results_refused_total{status="413"} 2' in a.get("/metrics")[1]
    listed = judge_worker(w, "--rejected")
    assert listed.returncode == 1 and f"submission {sid} AC" in listed.stdout, listed.stdout + listed.stderr
    kept = json.loads(next((w.outbox / "rejected").glob("*.json")).read_text())
    assert kept["verdict"] == "AC" and kept["lease_token"], "the verdict and its lease token are kept"
    a.stop()  # the operator fixes the limit; the arbiter restarts on the same database
    fixed = arbiters.start(db.dsn, name="a2", **LONG_LEASES)
    w.config.write_text(w.config.read_text().replace(a.url, fixed.url))
    sent = judge_worker(w, "--resend-rejected")
    assert sent.returncode == 0 and f"submission {sid} AC: delivered" in sent.stdout, sent.stdout + sent.stderr
    status, verdict, _, detail = judging(sid)
    assert (status, verdict) == ("AC", "AC") and "detail_dropped" in detail, detail
    assert judge_worker(w, "--rejected").returncode == 0
    again = judge_worker(w, "--resend-rejected")
    assert (again.returncode, again.stdout) == (0, ""), "nothing left to send"


def test_the_arbiter_publishes_its_limits_and_the_detail_budget_is_far_below_them(db, arbiters):
    """The worker's detail budget, with the rest of a result, fits the arbiter's default body limit
    many times over; the arbiter publishes its limits in /openapi.json."""
    a = arbiters.start(db.dsn)
    status, spec = a.get("/openapi.json")
    limits = spec["info"]["x-limits"]
    assert status == 200 and limits["max_body_bytes"] == 1_048_576 and limits["max_header_bytes"] == 32 * 1024
    assert detail_budget.DETAIL_BUDGET_BYTES * 8 <= limits["max_body_bytes"]
    assert limits["max_source_bytes"] == leases.MAX_SOURCE_BYTES and limits["max_json_depth"] == 32


# -- the detail budget ---------------------------------------------------------------------------
def judge_detail(tests: int, failed: int | None, message_chars: int = 0) -> dict:
    rows = [{"test": i, "verdict": "AC", "time_ms": 12, "wall_ms": 15, "memory_kb": 3456} for i in range(1, tests + 1)]
    if message_chars:
        for row in rows:
            row["checker_message"] = "m" * message_chars
    if failed is None:
        return {"tests": rows}
    rows = rows[:failed]
    rows[-1] = {**rows[-1], "verdict": "WA"}
    return {"tests": rows, "failed_test": failed, "stderr_tail": "e" * 5000}


def test_two_thousand_tests_fit_the_budget_with_the_failed_one_and_its_neighbours():
    for detail in (judge_detail(2000, None), judge_detail(2000, 1999)):
        fitted = detail_budget.fit(detail)
        assert detail_budget.size_of(fitted) <= detail_budget.DETAIL_BUDGET_BYTES
        assert fitted["tests_compacted"] is True
    fitted = detail_budget.fit(judge_detail(2000, 1999))
    kept = [row["test"] for row in fitted["tests"] if isinstance(row.get("test"), int)]
    assert kept == [1, 1997, 1998, 1999], kept  # the first test, the failed one and its neighbours (no 2000: never run)
    summary = fitted["tests"][1]
    assert summary == {"tests": "2-1996", "count": 1995, "verdict": "AC", "max_time_ms": 12, "max_wall_ms": 15,
                       "max_memory_kb": 3456}
    assert fitted["failed_test"] == 1999 and fitted["stderr_tail"] == "e" * 5000
    small = judge_detail(20, 3)
    assert detail_budget.fit(small) is small, "a detail within the budget is left as the judge wrote it"


@settings(max_examples=200, deadline=None)
@given(tests=st.integers(0, 5000), failed=st.none() | st.integers(1, 5000), message=st.integers(0, 3000),
       budget=st.integers(300, 200_000))
def test_any_detail_fits_any_budget_and_keeps_the_failed_test(tests, failed, message, budget):
    if failed is not None:
        failed = min(failed, max(tests, 1))
        tests = max(tests, failed)
    detail = judge_detail(tests, failed, message)
    fitted = detail_budget.fit(detail, budget)
    assert detail_budget.size_of(fitted) <= budget
    if failed is not None:
        assert fitted["failed_test"] == failed
        rows = fitted.get("tests")
        if rows is not None:  # not the last resort
            assert any(isinstance(r, dict) and r.get("test") == failed and r.get("verdict") == "WA" for r in rows)
