"""The arbiter behind PgBouncer in transaction pooling mode (Debian's pgbouncer): statements go
through the pooler (dsn), LISTEN and the leader lock through session_dsn. NOTIFY wake-ups, leader
take-over and the legacy global lock all work, and the pooler really carries the statements."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from arbiter.lab.devcluster import free_port
from worker.delivery.http_client import ArbiterClient

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"  # .ci/setup installs Debian's


class PgBouncer:
    """pgbouncer in transaction mode in front of the test server, run as the postgres OS user."""

    def __init__(self, server_dsn_info: dict, dbname: str):
        self.port = free_port()
        # Outside pytest's tmp (mode 0700 under root's): the postgres user reads its config here.
        self.dir = Path(tempfile.mkdtemp(prefix="judge-pgbouncer-"))
        self.dir.chmod(0o755)
        user = pwd.getpwnam("postgres")
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""[databases]
{dbname} = host={server_dsn_info['host']} port={server_dsn_info['port']} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 4
max_client_conn = 500
server_reset_query =
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
""")
        for path in [self.dir, *self.dir.iterdir()]:
            os.chown(path, user.pw_uid, user.pw_gid)
        self.proc = subprocess.Popen(["runuser", "-u", "postgres", "--", PGBOUNCER, str(self.dir / "pgbouncer.ini")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        self.dsn = f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres"
        wait_for(self._up, 15, what="pgbouncer to accept connections")

    def _up(self) -> bool:
        try:
            psycopg.connect(self.dsn, connect_timeout=1, prepare_threshold=None).close()
            return True
        except psycopg.OperationalError:
            return False

    def transactions(self, dbname: str) -> int:
        """Transactions the pooler has carried for that database (its admin console's SHOW STATS)."""
        with psycopg.connect(f"host=127.0.0.1 port={self.port} dbname=pgbouncer user=postgres",
                             autocommit=True, prepare_threshold=None) as admin:
            cur = admin.cursor()
            cur.execute("SHOW STATS")
            names = [c.name for c in cur.description]
            for row in cur.fetchall():
                if row[names.index("database")] == dbname:
                    return int(row[names.index("total_xact_count")])
        return 0

    def stop(self) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def behind_pgbouncer(make_db):
    def make(stage: str = "stage4"):
        database = make_db(stage)
        with database.connect() as conn:
            seed_problem(conn)
            creds = {w: add_worker(conn, w) for w in ("home-1", "home-2")}
            # Through a transaction pooler the arbiter cannot send startup options: the timeouts it
            # relies on are the role's settings in that database (docs/runbook.md).
            conn.execute(f'ALTER ROLE postgres IN DATABASE "{database.name}" SET lock_timeout = 2000')
            conn.execute(f'ALTER ROLE postgres IN DATABASE "{database.name}" SET statement_timeout = 6000')
        info = psycopg.conninfo.conninfo_to_dict(database.dsn)
        bouncer = PgBouncer(info, database.name)
        started.append(bouncer)
        return database, bouncer, creds

    started: list[PgBouncer] = []
    yield make
    for bouncer in started:
        bouncer.stop()


def test_notify_wakeups_and_leader_takeover_through_a_transaction_pooler(behind_pgbouncer, arbiters):
    db, bouncer, creds = behind_pgbouncer()
    settings = {"session_dsn": db.dsn, "dispatch_tick_secs": 30.0, "long_poll_max_secs": 20.0}
    a1 = arbiters.start(bouncer.dsn, name="a1", **settings)
    a2 = arbiters.start(bouncer.dsn, name="a2", wait_ready=False, **settings)
    carried = bouncer.transactions(db.name)
    # A parked worker is woken by NOTIFY (a 30 s tick: nothing else would wake the round in time).
    c = ArbiterClient([a1.url, a2.url], creds["home-1"], timeout=30)
    with db.connect() as conn:
        (first,) = seed_submissions(conn, 1)
    lease = c.acquire("one", None, 5).body
    assert lease["submission_id"] == first
    box = {}

    def parked_acquire():
        t0 = time.monotonic()
        box["reply"] = c.acquire("two", None, 15)
        box["secs"] = time.monotonic() - t0

    thread = threading.Thread(target=parked_acquire)
    thread.start()
    wait_for(lambda: a1.get("/readyz")[1]["parked"] == 1, what="parked on the leader")
    time.sleep(0.5)
    with db.connect() as conn:
        (second,) = seed_submissions(conn, 1)
    thread.join(20)
    assert box["reply"].status == 200 and box["reply"].body["submission_id"] == second
    assert box["secs"] < 5, "woken by the tick, not by NOTIFY"
    # Many requests at once: the arbiter's pooled connections share the pooler's 4 server
    # connections, so a statement prepared on one server connection would be missing on another.
    statuses = []

    def beat():
        mine = ArbiterClient([a1.url], creds["home-1"], timeout=30)
        statuses.extend(mine.heartbeat(first, lease["lease_token"]).status for _ in range(15))

    beaters = [threading.Thread(target=beat) for _ in range(12)]
    for t in beaters:
        t.start()
    for t in beaters:
        t.join(60)
    assert statuses == [200] * 180
    assert c.result(first, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 200
    # The statements really went through the pooler.
    assert bouncer.transactions(db.name) > carried
    # Leader take-over: kill -9 the leader; the standby takes the lock (its session is direct).
    a1.kill9()
    wait_for(lambda: a2.get("/readyz")[0] == 200, 30, what="the standby to lead")
    with db.connect() as conn:
        (third,) = seed_submissions(conn, 1)
    reply = ArbiterClient([a2.url], creds["home-2"], timeout=30).acquire("three", None, 10)
    assert reply.status == 200 and reply.body["submission_id"] == third


def test_the_legacy_global_lock_is_honoured_through_a_transaction_pooler(behind_pgbouncer, arbiters):
    """Stages 1-3: the acquire transaction takes the legacy global lock through the pooler. While a
    legacy worker holds it nobody is leased anything; once it lets go the parked worker gets work."""
    db, bouncer, creds = behind_pgbouncer("stage1")
    a = arbiters.start(bouncer.dsn, session_dsn=db.dsn, long_poll_max_secs=20.0)
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    holder = psycopg.connect(db.dsn)
    holder.execute("SELECT rr_last_home FROM judge_dispatch_state WHERE id = 1 FOR UPDATE")
    try:
        reply = ArbiterClient([a.url], creds["home-1"], timeout=30).acquire("held", None, 4)
        assert reply.status == 204, "leased while a legacy worker held the global lock"
        with db.connect() as conn:
            assert conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone() == ("pending",)
    finally:
        holder.rollback()
        holder.close()
    reply = ArbiterClient([a.url], creds["home-1"], timeout=30).acquire("free", None, 10)
    assert reply.status == 200 and reply.body["submission_id"] == sid
