"""What an idle arbiter costs the database, and why a NOTIFY that never arrives still strands
nothing: a real arbiter under gunicorn against a PostgreSQL server of this test's own that counts
statements (pg_stat_statements)."""

from __future__ import annotations

import json
import socket
import time
import uuid

import psycopg
import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import FAST, add_worker, request_bytes, wait_for

from arbiter.lab import devcluster
from arbiter.server.config import ArbiterSettings
from arbiter.store import migrations

# The arbiter's defaults for everything procs.FAST shortens for the fault tests (the idle cadence
# included); the standing canary probe stays off, as in every test that does not test it.
DEFAULT_CADENCE = {key: getattr(ArbiterSettings(), key) for key in FAST if key != "canary_interval_secs"}


@pytest.fixture(scope="module")
def counting_cluster():
    cluster = devcluster.LocalCluster(fast=True, settings={"shared_preload_libraries": "'pg_stat_statements'"})
    cluster.init().start()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def site(counting_cluster):
    name = f"idle_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(counting_cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = counting_cluster.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrations.migrate(conn)
        conn.execute("CREATE EXTENSION pg_stat_statements")
        seed_problem(conn)
        creds = [add_worker(conn, f"home-{i}") for i in range(10)]
    return dsn, creds


def park(port: int, credential: str, wait_secs: float = 30) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(request_bytes("/v1/acquire", {"request_id": uuid.uuid4().hex, "wait_secs": wait_secs}, credential))
    return s


def answer(s: socket.socket) -> tuple[int, dict | None]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    while len(rest) < length:
        rest += s.recv(65536)
    return status, (json.loads(rest) if rest else None)


def statements(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = "
                                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                                "AND query NOT LIKE '%%pg_stat_statements%%'").fetchone()[0])


def test_an_idle_leader_with_parked_workers_runs_at_most_one_statement_a_second(site, arbiters):
    dsn, creds = site
    a = arbiters.start(dsn, **DEFAULT_CADENCE)
    parked = [park(a.port, cred) for cred in creds for _ in range(4)]
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 40, what="40 parked requests")
    time.sleep(3)  # the parking's own statements and the janitor's first sweeps are done
    before, t0 = statements(dsn), time.monotonic()
    time.sleep(20)
    rate = (statements(dsn) - before - 1) / (time.monotonic() - t0)  # - 1: the first count itself
    assert a.get("/readyz")[1]["parked"] == 40
    assert rate <= 1.0, f"{rate:.2f} statements/s from an idle leader"
    for s in parked:
        s.close()


def test_a_submission_whose_notify_never_comes_is_found_by_the_sweep(site, arbiters):
    """Inserted with triggers off (no NOTIFY): a parked request gets it at the next sweep."""
    dsn, creds = site
    a = arbiters.start(dsn, **{**DEFAULT_CADENCE, "dispatch_sweep_secs": 3.0})
    s = park(a.port, creds[0])
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="parked")
    time.sleep(1.5)  # a round after the parking has looked already: only a sweep can find it now
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no trigger fires: no NOTIFY
        (sid,) = seed_submissions(conn, 1)
    t0 = time.monotonic()
    status, lease = answer(s)
    assert status == 200 and lease["submission_id"] == sid
    assert time.monotonic() - t0 < 3.0 + 2.0, "found later than the sweep interval allows"
    s.close()


def test_work_that_became_pending_while_the_listen_session_was_gone_is_found_on_relisten(site, arbiters):
    """The LISTEN session is killed and a submission arrives before it is back (its NOTIFY goes
    nowhere): the round after the new LISTEN looks at the queue, long before any sweep."""
    dsn, creds = site
    a = arbiters.start(dsn, **{**DEFAULT_CADENCE, "dispatch_sweep_secs": 300.0})
    s = park(a.port, creds[0])
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="parked")
    with psycopg.connect(dsn, autocommit=True) as conn:
        killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE query = 'LISTEN submission_pending' AND datname = current_database()").fetchall()
        assert killed == [(True,)]
        (sid,) = seed_submissions(conn, 1)
    s.settimeout(30)
    status, lease = answer(s)
    assert status == 200 and lease["submission_id"] == sid
    s.close()


def test_work_a_round_could_not_lock_is_looked_at_again_next_round(site, arbiters):
    """A round whose acquire hits a lock timeout (the worker's row is locked: the statement that
    notes its lease waits 2 s) leaves the work pending; the next round looks again, long before
    any sweep, and the parked request gets the work once the lock is gone."""
    dsn, creds = site
    a = arbiters.start(dsn, **{**DEFAULT_CADENCE, "dispatch_sweep_secs": 300.0})
    s = park(a.port, creds[0])
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, what="parked")
    blocker = psycopg.connect(dsn)
    blocker.execute("SELECT 1 FROM workers WHERE worker_id = 'home-0' FOR UPDATE")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            (sid,) = seed_submissions(conn, 1)
        wait_for(lambda: "will retry next round" in a.log_text(), 15, what="a round that hit the lock timeout")
    finally:
        blocker.rollback()
        blocker.close()
    s.settimeout(30)
    status, lease = answer(s)
    assert status == 200 and lease["submission_id"] == sid
    s.close()
