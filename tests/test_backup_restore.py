"""The runbook's backup and restore, command by command: a custom-format pg_dump of a live site (one
submission decided, one judging under a lease, one waiting), pg_restore into a scratch database,
judgectl on the copy, and an arbiter started on the copy hands the dead arbiter's lease back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
from support.fixtures_data import seed_problem, seed_user
from support.procs import add_worker, wait_for
from support.programs import PROGRAMS

from arbiter.store import leases

COUNTED = ("submissions", "submission_judgings", "lease_grants", "workers", "schema_migrations", "first_passes")


def judgectl(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, JUDGE_DSN=dsn))


def counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in COUNTED}


def test_a_dump_restores_into_a_scratch_database_that_judgectl_and_an_arbiter_take_up(db, pg_server, arbiters,
                                                                                        tmp_path):
    with db.connect() as conn:
        problem = seed_problem(conn, "aplusb")
        user = seed_user(conn)
        add_worker(conn, "home-1", "home")
        ids = [leases.submit(conn, user, problem, "python3", PROGRAMS["python3"]["AC"]) for _ in range(3)]
        first = leases.acquire(conn, worker_id="home-1", kind="home", request_id="r1", languages=["python3"],
                               unconfirmed_secs=30, legacy=None)
        leases.record_result(conn, worker_id="home-1", submission_id=first.submission_id,
                             lease_token=first.lease_token, verdict="AC")
        live = leases.acquire(conn, worker_id="home-1", kind="home", request_id="r2", languages=["python3"],
                              unconfirmed_secs=2, legacy=None)
    dump = tmp_path / "judge.dump"
    done = subprocess.run(["pg_dump", "--format=custom", f"--file={dump}", db.dsn], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr

    scratch = f"{db.name}_restore"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    try:
        restored = pg_server.dsn(scratch)
        done = subprocess.run(["pg_restore", f"--dbname={restored}", "--no-owner", str(dump)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert counts(restored) == counts(db.dsn)

        version = judgectl(restored, "schema-version")
        assert version.returncode == 0 and version.stdout == judgectl(db.dsn, "schema-version").stdout
        status = judgectl(restored, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["queue"] == {"pending": 1, "judging": 1}
        shown = judgectl(restored, "submission", "show", str(first.submission_id))
        assert "status      AC" in shown.stdout, shown.stdout

        # The lease in the dump belonged to an arbiter long gone: one started on the copy hands it back
        # after its expiry and the grace period, by the restored database's clock.
        arbiters.start(restored, lease_secs=2.0, grace_secs=1.0)
        wait_for(lambda: _status(restored, live.submission_id) == "pending", 60, 0.2, "the dead lease handed back")
        assert ids[1] == live.submission_id
    finally:
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            arbiters.stop_all()
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def _status(dsn: str, sid: int) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone()[0]
