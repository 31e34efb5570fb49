"""Canaries: pinned ones only to their worker (both transports), credited to nobody, at the front of
the queue, checked by `judgectl canary run` with real workers, watched by the standing probe, forgotten
when old."""

import subprocess
import sys
import time

import psycopg
import pytest
from support.fixtures_data import seed_problem, seed_submissions, seed_user
from support.procs import WorkerProcess, add_worker, aplusb_site, direct_transport, wait_for

from arbiter.store import canary, leases, status
from worker.delivery.http_client import ArbiterClient

# Worker timings that fit the test arbiters' (procs.FAST: long polls of 5 s at most).
WORKER_FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
               "backoff_max_secs": 2.0}


def judgectl(db, *args):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=120)


def row_of(conn, sid):
    return conn.execute("SELECT status, worker_id FROM submissions WHERE id = %s", (sid,)).fetchone()


def site_counts(conn):
    """Everything a user sees: XP, first passes, and the status page's queue."""
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cur:
        queue = status.queue(cur)
    return (conn.execute("SELECT coalesce(sum(xp), 0) FROM users").fetchone()[0],
            conn.execute("SELECT count(*) FROM first_passes").fetchone()[0], queue["queue"])


def test_a_pinned_canary_goes_only_to_its_worker_through_the_arbiter(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        (real,) = seed_submissions(conn, 1)
        creds = {w: add_worker(conn, w) for w in ("home-1", "home-2")}
        pinned = canary.submit(conn, "python3", pinned_worker="home-2")
    a = arbiters.start(db.dsn)
    one, two = (ArbiterClient([a.url], creds[w]) for w in ("home-1", "home-2"))
    # home-1 gets the real submission although the canary sits at the front: it is not home-1's.
    assert one.acquire("r1", None, 2).body["submission_id"] == real
    assert one.acquire("r2", None, 1).status == 204
    with db.connect() as conn:
        assert row_of(conn, pinned) == ("pending", None)
    lease = two.acquire("r1", None, 2).body
    assert lease["submission_id"] == pinned and lease["problem"]["slug"] == "judge-canary"
    assert two.result(pinned, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 200
    with db.connect() as conn:
        result = canary.outcome(conn, pinned)
    assert (result.status, result.worker_id, result.transport) == ("AC", "home-2", "arbiter")


def test_canaries_go_first_even_behind_a_long_queue(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        seed_submissions(conn, 50)
        cred = add_worker(conn, "home-1")
        first = canary.submit(conn, "python3")
    a = arbiters.start(db.dsn)
    assert ArbiterClient([a.url], cred).acquire("r1", None, 2).body["submission_id"] == first


def test_the_legacy_claim_honours_the_pin_and_takes_it_out_of_turn(make_db, tmp_path):
    db = make_db("stage0")
    with db.connect() as conn:
        seed_problem(conn)
        (real,) = seed_submissions(conn, 1)
        pinned = canary.submit(conn, "python3", pinned_worker="prod-1")
    home = direct_transport(db.dsn, "home-1", "home", tmp_path / "h")
    prod = direct_transport(db.dsn, "prod-1", "production", tmp_path / "p")
    job = home.claim()
    assert job.submission_id == real  # the canary at the front is not home-1's
    with db.connect() as conn:
        # home-1 is an idle home worker again: by the legacy rules the production worker yields to it ...
        conn.execute("UPDATE judge_nodes SET idle = true")
        assert row_of(conn, pinned) == ("pending", None)
    # ... but its own canary is nobody else's turn: prod-1 takes it at once.
    job = prod.claim()
    assert job.submission_id == pinned and job.problem_slug == "judge-canary"
    with db.connect() as conn:
        assert row_of(conn, pinned) == ("judging", "prod-1")


def test_a_claim_that_waited_for_the_global_lock_still_leases_after_the_canary_was_queued(make_db, tmp_path):
    """A legacy claim's transaction begins, then waits for the global lock another worker holds; the
    gate's canary is queued meanwhile and the claim takes it. Its leased_at is when the claim took it
    (the database's clock as the claim runs), never the transaction's start: queued->leased is never
    negative (a '-0.01s' gate line once failed the cutover test's parse of it)."""
    import threading

    db = make_db("stage0")
    prod = direct_transport(db.dsn, "prod-1", "production", tmp_path / "p")
    taken = {}
    with db.connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM judge_dispatch_state WHERE id = 1 FOR UPDATE")  # another worker's turn
        claimer = threading.Thread(target=lambda: taken.update(job=prod.claim()))
        claimer.start()
        with db.connect() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                          ).fetchone()[0] == 1, 10, what="the claim to wait for the global lock")
            time.sleep(0.05)  # the canary is queued well after the claim's transaction began
            pinned = canary.submit(conn, "python3", pinned_worker="prod-1")
        holder.execute("COMMIT")
        claimer.join(10)
    assert taken["job"].submission_id == pinned
    with db.connect() as conn:
        result = canary.outcome(conn, pinned)
    assert result.queued_s >= 0, result.timings()


def test_a_claim_that_ignores_the_pin_changes_nothing(make_db):
    """Old legacy code knows nothing of pins: the database keeps the pin all the same."""
    db = make_db("stage0")
    with db.connect() as conn:
        pinned = canary.submit(conn, "c", pinned_worker="home-2")
        taken = conn.execute("UPDATE submissions SET status = 'judging', worker_id = 'home-1' "
                             "WHERE status = 'pending' RETURNING id").fetchall()
        assert taken == [] and row_of(conn, pinned) == ("pending", None)
        conn.execute("UPDATE submissions SET status = 'judging', worker_id = 'home-2' WHERE id = %s", (pinned,))
        assert row_of(conn, pinned) == ("judging", "home-2")


@pytest.mark.parametrize("transport", ["arbiter", "legacy"])
def test_canaries_change_no_xp_no_first_pass_and_no_user_facing_count(db, transport):
    with db.connect() as conn:
        seed_problem(conn)
        user = seed_user(conn, "bob")
        add_worker(conn, "home-1")
        before = site_counts(conn)
        sids = [canary.submit(conn, lang) for lang in ("c", "python3")]
        assert site_counts(conn) == before  # open canaries are nobody's queue
        for sid in sids:
            if transport == "arbiter":
                lease = leases.acquire(conn, worker_id="home-1", kind="home", request_id=f"r{sid}",
                                       languages=["c", "python3"], unconfirmed_secs=5, legacy=None)
                assert lease.submission_id == sid
                leases.record_result(conn, worker_id="home-1", submission_id=sid, lease_token=lease.lease_token,
                                     verdict="AC", time_ms=1, memory_kb=1, detail={})
            else:
                from arbiter.store.sqlfiles import Statements

                L = Statements("legacy.sql")
                conn.execute("UPDATE submissions SET status = 'judging', worker_id = 'home-1' WHERE id = %s", (sid,))
                conn.execute(L.report_result, {"submission_id": sid, "worker_id": "home-1", "verdict": "AC",
                                               "time_ms": 1, "memory_kb": 1, "detail": "{}", "data_digest": None})
            assert canary.outcome(conn, sid).status == "AC"
        assert site_counts(conn) == before
        assert conn.execute("SELECT xp FROM users WHERE id = %s", (user,)).fetchone() == (0,)


def test_canary_run_passes_with_a_real_worker_on_each_transport(make_db, arbiters, tmp_path):
    db = make_db("stage1")  # both transports live side by side (the arbiter follows the legacy rules)
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn)
    w = WorkerProcess(tmp_path, "home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url],
                      credential=site.cred, **WORKER_FAST).start()
    try:
        for language in ("c", "python3"):
            out = judgectl(db, "canary", "run", "--worker", "home-1", "--transport", "arbiter",
                           "--language", language, "--timeout", "60")
            assert out.returncode == 0, out.stderr
            line = out.stdout.strip()
            assert f"({language}) on home-1 through arbiter: AC as expected; queued->leased " in line, line
            assert "leased->decided" in line and "total" in line
        wrong = judgectl(db, "canary", "run", "--worker", "home-1", "--transport", "direct", "--timeout", "60")
        assert wrong.returncode == 1 and "decided through arbiter, expected direct" in wrong.stderr
    finally:
        w.stop()
    d = WorkerProcess(tmp_path / "d", "home-1", "home", "direct", site.testdata, dsn=db.dsn,
                      **WORKER_FAST).start()
    try:
        out = judgectl(db, "canary", "run", "--worker", "home-1", "--transport", "direct", "--timeout", "60")
        assert out.returncode == 0, out.stderr
        assert "on home-1 through direct: AC as expected" in out.stdout
    finally:
        d.stop()


def test_canary_run_fails_naming_the_verdict_when_the_worker_judges_wrongly(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    # home-1's copy of the canary problem's test data is corrupted (its directory comes first).
    broken = site.testdata / "judge-canary"
    broken.mkdir()
    (broken / "1.in").write_text("1 2\n")
    (broken / "1.out").write_text("4\n")
    a = arbiters.start(db.dsn)
    w = WorkerProcess(tmp_path, "home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url],
                      credential=site.cred, **WORKER_FAST).start()
    try:
        out = judgectl(db, "canary", "run", "--worker", "home-1", "--transport", "arbiter", "--timeout", "60")
    finally:
        w.stop()
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "on home-1 through arbiter: verdict WA, expected AC" in out.stderr, \
        out.stderr


def test_canary_run_with_no_worker_times_out_and_withdraws_its_canary(db):
    unknown = judgectl(db, "canary", "run", "--worker", "home-9", "--timeout", "1")
    assert unknown.returncode == 2 and unknown.stderr == "judgectl: error: no active worker 'home-9' (judgectl worker list)\n"
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM submissions").fetchone() == (0,), "an unknown worker's canary was stored"
        add_worker(conn, "home-9", "home")  # registered, but no such process runs
    started = time.monotonic()
    out = judgectl(db, "canary", "run", "--worker", "home-9", "--timeout", "1")
    assert out.returncode == 1 and "worker home-9 did not take it in 1s (withdrawn)" in out.stderr, out.stderr
    assert time.monotonic() - started < 30
    with db.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE pinned_worker = 'home-9'").fetchall() == \
            [("system_error",)]
    bad = judgectl(db, "canary", "run", "--worker", "home-1", "--language", "cobol")
    assert bad.returncode == 2 and "cobol" in bad.stderr


def test_the_standing_probe_exports_its_success_and_its_failure(db, arbiters):
    with db.connect() as conn:
        cred = add_worker(conn, "home-1")
    a = arbiters.start(db.dsn, canary_interval_secs=1.0)
    assert a.metric("arbiter_canary_interval_seconds") == 1.0
    c = ArbiterClient([a.url], cred)

    def judge_next(verdict):
        lease = c.acquire(f"r{time.monotonic_ns()}", None, 5).body
        with db.connect() as conn:
            assert conn.execute("SELECT canary_expect, pinned_worker FROM submissions WHERE id = %s",
                                (lease["submission_id"],)).fetchone() == ("AC", None)
        assert c.result(lease["submission_id"], {"lease_token": lease["lease_token"], "verdict": verdict}).status == 200
        return lease["submission_id"]

    # No success ever: the probe counts from when it began (DB time), not from 1970.
    began = wait_for(lambda: a.metric("arbiter_canary_last_success_timestamp_seconds"), 10, what="the probe")
    with db.connect() as conn:
        assert 0 < float(conn.execute("SELECT extract(epoch FROM now())").fetchone()[0]) - began < 30
    judge_next("WA")
    wait_for(lambda: a.metric('arbiter_canaries_total{outcome="unexpected"}') == 1, 10, what="the failed canary")
    assert a.metric("arbiter_canary_last_success_timestamp_seconds") == began
    sid = judge_next("AC")
    wait_for(lambda: a.metric("arbiter_canary_last_success_timestamp_seconds") > began, 10,
             what="a successful canary")
    with db.connect() as conn:
        decided = conn.execute("SELECT extract(epoch FROM judged_at), extract(epoch FROM judged_at - created_at) "
                               "FROM submissions WHERE id = %s", (sid,)).fetchone()
        assert conn.execute("SELECT count(*) FROM submissions WHERE canary_expect IS NOT NULL "
                            "AND status IN ('pending', 'judging')").fetchone()[0] <= 1  # one open at a time
    assert a.metric("arbiter_canary_last_success_timestamp_seconds") == pytest.approx(float(decided[0]), abs=0.01)
    assert a.metric("arbiter_canary_duration_seconds") == pytest.approx(float(decided[1]), abs=0.01)
    # A restarted arbiter starts from the database's record, not from zero (no alert on every restart).
    a.kill9()
    b = arbiters.start(db.dsn, name="a2", canary_interval_secs=1.0)
    wait_for(lambda: b.metric("arbiter_canary_last_success_timestamp_seconds") == pytest.approx(float(decided[0]),
                                                                                               abs=0.01),
             10, what="the metric seeded from the database")
    status_code, snap = b.get("/v1/status")
    assert status_code == 200 and snap["last_canaries"][0]["worker_id"] == "home-1"
    assert snap["last_canaries"][0]["ok"] is True


def test_old_canaries_are_forgotten_but_each_workers_last_stays(db):
    with db.connect() as conn:
        seed_problem(conn)
        (real,) = seed_submissions(conn, 1)
        add_worker(conn, "home-1")
        sids = []
        for _ in range(4):
            sid = canary.submit(conn, "c")
            lease = leases.acquire(conn, worker_id="home-1", kind="home", request_id=f"r{sid}", languages=["c"],
                                   unconfirmed_secs=5, legacy=None)
            leases.record_result(conn, worker_id="home-1", submission_id=sid, lease_token=lease.lease_token,
                                 verdict="AC", time_ms=1, memory_kb=1, detail={})
            sids.append(sid)
        conn.execute("UPDATE submissions SET status = 'AC', judged_at = now() - interval '2 days' "
                     "WHERE id = %s", (real,))
        conn.execute("INSERT INTO submission_judgings (submission_id, worker_id, verdict) VALUES (%s, 'home-1', 'AC')",
                     (real,))
        conn.execute("UPDATE submissions SET judged_at = now() - interval '2 days' WHERE id = ANY(%s)", (sids,))
        assert canary.forget_old(conn, keep_secs=86400) == 3
        left = [r[0] for r in conn.execute("SELECT id FROM submissions ORDER BY id").fetchall()]
        assert left == [real, sids[-1]]
        assert conn.execute("SELECT count(*) FROM submission_judgings WHERE submission_id = ANY(%s)",
                            (sids[:-1],)).fetchone() == (0,)
        # Real history stays append-only.
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute("DELETE FROM submission_judgings WHERE submission_id = %s", (real,))


@pytest.mark.parametrize("line,message", [
    ("canary_interval_secs = -1", "'canary_interval_secs' must be >= 0"),
    ('canary_language = "cobol"', "'canary_language' must be one of c, cpp, python3"),
    ("canary_keep_secs = 0", "'canary_keep_secs' must be > 0"),
])
def test_bad_canary_settings_are_one_clear_error(tmp_path, line, message):
    from arbiter.server.config import ConfigError, load_settings

    config = tmp_path / "arbiter.toml"
    config.write_text(f'dsn = "postgresql:///x"\n{line}\n')
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_status_counts_open_canaries_apart_and_shows_each_workers_last(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        seed_submissions(conn, 2)
        cred = add_worker(conn, "home-1")
        canary.submit(conn, "c")
        canary.submit(conn, "python3", pinned_worker="home-9")
    a = arbiters.start(db.dsn)
    _, snap = a.get("/v1/status")
    assert snap["queue"] == {"pending": 2, "judging": 0} and snap["canaries_open"] == 2
    c = ArbiterClient([a.url], cred)
    lease = c.acquire("r1", None, 2).body
    assert c.result(lease["submission_id"], {"lease_token": lease["lease_token"], "verdict": "WA"}).status == 200
    _, snap = a.get("/v1/status")
    assert snap["canaries_open"] == 1 and snap["queue"]["pending"] == 2
    (last,) = snap["last_canaries"]
    assert (last["worker_id"], last["verdict"], last["expected"], last["ok"]) == ("home-1", "WA", "AC", False)
    page = a.get("/status")[1]
    assert "<th>last canary</th>" in page and "WA (FAILED, expected AC)" in page
    out = judgectl(db, "status")
    assert out.returncode == 0 and "FAILED (expected AC)" in out.stdout and "canaries" in out.stdout


def test_a_direct_workers_gate_before_stage_1_needs_no_registration(make_db):
    """Stage 0's gate runs for direct (legacy) workers, which register nowhere before they poll and
    for which there is no workers table yet: not an unknown worker (the netlab's cutover caught it)."""
    db = make_db("stage0")
    out = judgectl(db, "canary", "run", "--worker", "home-7", "--transport", "direct", "--timeout", "1")
    assert out.returncode == 1 and "worker home-7 did not take it in 1s (withdrawn)" in out.stderr, out.stderr
