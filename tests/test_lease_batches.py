"""Heartbeats and results written in batches (group commit; arbiter/store/leases.py ``heartbeats``,
``record_results``): every write of a batch is answered as it would be alone, the batch is one
statement, and batches lock their rows in one order, so two of them never deadlock."""

from __future__ import annotations

import threading
import uuid

import psycopg
import psycopg.types.json
from support.fixtures_data import seed_problem, seed_submissions, seed_user

from arbiter.store import leases
from arbiter.store.leases import HeartbeatWrite, ResultWrite, WriteOutcome


def _worker(conn, worker_id):
    conn.execute("INSERT INTO workers (worker_id, kind, languages, secret_sha256) VALUES (%s, 'home', %s, 'x')",
                 (worker_id, ["python3"]))


def _lease(conn, worker_id):
    return leases.acquire(conn, worker_id=worker_id, kind="home", request_id=str(uuid.uuid4()),
                          languages=["python3"], unconfirmed_secs=10, legacy=None)


def _expiry(conn, sid):
    return conn.execute("SELECT lease_expires_at - now() FROM submissions WHERE id = %s", (sid,)).fetchone()[0]


def test_a_batch_of_heartbeats_answers_each_as_if_it_came_alone(conn):
    seed_problem(conn)
    _worker(conn, "home-1")
    _worker(conn, "home-2")
    seed_submissions(conn, 3)
    a, b, c = _lease(conn, "home-1"), _lease(conn, "home-2"), _lease(conn, "home-1")
    beats = [
        HeartbeatWrite("home-1", a.submission_id, a.lease_token),
        HeartbeatWrite("home-1", b.submission_id, b.lease_token),  # home-2's lease
        HeartbeatWrite("home-1", c.submission_id, str(uuid.uuid4())),  # not the current token
        HeartbeatWrite("home-1", 999_999, a.lease_token),  # no such submission
        HeartbeatWrite("home-1", c.submission_id, "not-a-token"),
        HeartbeatWrite("home-1", a.submission_id, str(a.lease_token)),  # the first again (a retry)
    ]
    out = leases.heartbeats(conn, beats, lease_secs=60)
    assert [r.outcome for r in out] == [WriteOutcome.ACCEPTED, WriteOutcome.NOT_YOURS, WriteOutcome.GONE,
                                        WriteOutcome.NOT_FOUND, WriteOutcome.GONE, WriteOutcome.ACCEPTED]
    assert out[0].expires_at == out[5].expires_at
    assert 59 < _expiry(conn, a.submission_id).total_seconds() <= 60
    assert _expiry(conn, b.submission_id).total_seconds() <= 10  # refused: unchanged
    assert _expiry(conn, c.submission_id).total_seconds() <= 10


def test_a_batch_of_results_decides_each_once_and_counts_xp_per_first_pass(conn):
    first_problem = seed_problem(conn, "p1", xp_reward=10)
    second_problem = seed_problem(conn, "p2", xp_reward=7)
    _worker(conn, "home-1")
    alice, bob = seed_user(conn, "alice"), seed_user(conn, "bob")
    ids = [leases.submit(conn, user, problem, "python3", "print(1)") for user, problem in
           ((alice, first_problem), (alice, first_problem), (bob, first_problem), (bob, second_problem))]
    held = {lease.submission_id: lease for lease in (_lease(conn, "home-1") for _ in ids)}
    alice_1, alice_2, bob_1, bob_2 = (held[sid] for sid in ids)

    def result(lease, verdict="AC", worker="home-1", token=None):
        return ResultWrite(worker, lease.submission_id, token or lease.lease_token, verdict, time_ms=5,
                           detail={"tests": [{"verdict": verdict}]})

    out = leases.record_results(conn, [
        result(alice_2), result(alice_1),  # one problem twice: the older submission's first pass
        result(bob_1), result(bob_2),  # two problems: both rewards
        result(bob_1),  # a copy of a result in the same batch
        result(alice_1, token=str(uuid.uuid4())),  # a token that is not the lease's
    ])
    assert [r.outcome for r in out] == [WriteOutcome.ACCEPTED] * 4 + [WriteOutcome.DUPLICATE, WriteOutcome.GONE]
    assert [r.xp_granted for r in out[:4]] == [False, True, True, True]
    assert (out[4].verdict, out[4].seq) == ("AC", out[2].seq)
    assert all(r.judging_secs is not None and r.judging_secs >= 0 for r in out[:4])
    xp = dict(conn.execute("SELECT name, xp FROM users WHERE name IN ('alice', 'bob')").fetchall())
    assert xp == {"alice": 10, "bob": 17}
    assert conn.execute("SELECT submission_id FROM first_passes WHERE user_id = %s", (alice,)).fetchone()[0] == ids[0]
    assert conn.execute("SELECT count(*) FROM submission_judgings").fetchone()[0] == 4
    statuses = conn.execute("SELECT count(*) FROM submissions WHERE status = 'AC'").fetchone()[0]
    assert statuses == 4


def test_two_batches_over_the_same_rows_in_opposite_orders_never_deadlock(db, conn):
    # Two serving processes' batches may hold the same leases (a worker's heartbeat retried on another
    # process): a batch locks its rows in id order whatever order its writes came in, so they queue
    # behind each other instead of deadlocking (PostgreSQL would abort one after deadlock_timeout).
    seed_problem(conn)
    _worker(conn, "home-1")
    seed_submissions(conn, 60)
    held = [_lease(conn, "home-1") for _ in range(60)]
    forwards = [HeartbeatWrite("home-1", h.submission_id, h.lease_token) for h in held]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def hammer(beats):
        with db.connect() as own:
            own.execute("SET deadlock_timeout = '100ms'")
            start.wait()
            try:
                for _ in range(150):
                    out = leases.heartbeats(own, beats, lease_secs=60)
                    assert all(r.outcome is WriteOutcome.ACCEPTED for r in out)
            except Exception as exc:  # a deadlock PostgreSQL broke, or a batch that extended less than all
                errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(order,)) for order in (forwards, forwards[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []


def test_a_batch_probes_one_row_per_write_whatever_the_statistics_say(conn):
    # The planner's statistics lag behind a contest: analysed while nothing was judging, they say no row
    # is, and the table is small. A join would then scan every judging row for each batch (13 ms at
    # 10,000 leases), and a probe that names the status may take a partial index of judging rows and
    # read all of them; the statements probe the primary key once per write instead.
    seed_problem(conn)
    _worker(conn, "home-1")
    seed_submissions(conn, 20)
    conn.execute("ANALYZE submissions")  # as a contest's start finds them: a small table, nothing judging
    seed_submissions(conn, 3000)
    held = [_lease(conn, "home-1") for _ in range(1500)]
    pick = held[700:703]
    keys = {"submission_ids": [h.submission_id for h in pick], "lease_tokens": [h.lease_token for h in pick],
            "worker_ids": ["home-1"] * 3}
    statements = {
        "heartbeat_lease": (leases.Q.heartbeat_lease, {**keys, "lease_secs": 60}),
        "record_result": (leases.Q.record_result, {
            **keys, "verdicts": ["AC"] * 3, "times_ms": [1] * 3, "memories_kb": [1] * 3,
            "details": [psycopg.types.json.Jsonb({})] * 3, "data_digests": [None] * 3}),
    }
    for name, (statement, params) in statements.items():
        with conn.transaction():  # EXPLAIN ANALYZE writes: undone at the end of the block
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + statement, params,
                                                        prepare=True).fetchall())
            raise psycopg.Rollback()
        assert "Seq Scan on submissions" not in plan and "Bitmap Heap Scan on submissions" not in plan, (name, plan)
        # Nor a partial index of judging rows (all 1,500 of them are this one worker's: read per probe).
        assert "submissions_judging_idx" not in plan and "submissions_lease_expiry_idx" not in plan, (name, plan)
        assert "Index Scan using submissions_pkey on submissions" in plan, (name, plan)
