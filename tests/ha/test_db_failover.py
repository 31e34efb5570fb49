"""The database fails over under a stream of submissions, and nothing the arbiter acknowledged is lost.

A real replicated PostgreSQL (arbiter/lab/hacluster.py: Patroni, three etcd members, two database
hosts, synchronous replication), a real arbiter and two real workers reaching it through one
multi-host DSN with ``target_session_attrs=read-write``. Each test kills or hands over the primary in
the middle of judging and then requires, in the final database on the new primary:

- every submission the client was told of is there and terminal, with its program's verdict;
- every verdict was written by its submission's newest lease, once (tests/support/checks.py);
- no result the arbiter answered 200 for was lost: the arbiter logs "result received" after the
  commit returned, so a lost one shows as a second "result received" for the same submission (its
  lease lived on in the new primary, ran out, and the submission was judged again);
- no lease was reclaimed: the minutes without a database are not the workers' fault (the grace the
  janitor owes after an outage, docs/design.md scenario 7).

Both mechanisms were removed by hand once to see these fail: with ``synchronous=False`` (asynchronous
replication) the paused WAL sender keeps acknowledged results from the standby and the killed-primary test reports them
lost; with the janitor's grace after an outage removed, its leases (6 s) run out during the ~20 s
failover and the test reports the reclaims.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from support.checks import assert_each_submission_decided_once_by_its_last_lease
from support.procs import ArbiterProcess, WorkerProcess, add_worker, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS

from arbiter.lab.hacluster import HaCluster
from arbiter.store import leases, migrations

# Short leases, so that a failover (about 20 s: Patroni's ttl) outlasts them: only the grace after
# the outage keeps them from being reclaimed.
ARBITER = {"lease_secs": 6.0, "unconfirmed_secs": 3.0, "grace_secs": 8.0, "long_poll_max_secs": 3.0,
           "db_timeout_secs": 2.0}
WORKER = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
          "backoff_max_secs": 1.0, "request_timeout_secs": 3.0}
# About a second of judging each (three tests), so that a fault finds results on their way.
SLOW_AC = "import time\ntime.sleep(0.3)\na, b = map(int, input().split())\nprint(a + b)\n"
BACKLOG = 4

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def cluster():
    ha = HaCluster().start()
    yield ha
    ha.destroy()


class Site:
    """One database on the replicated cluster, an arbiter, two workers, and a client that keeps
    a few submissions waiting."""

    def __init__(self, cluster: HaCluster, root: Path, name: str):
        self.cluster = cluster
        with cluster.connect() as admin:
            admin.execute(f"CREATE DATABASE {name}")
        self.dsn = cluster.dsn(name)
        with self.connect() as conn:
            migrations.migrate(conn)
            self.problem = conn.execute("INSERT INTO problems (slug, title, xp_reward) VALUES ('aplusb', 'A+B', 10) "
                                        "RETURNING id").fetchone()[0]
            self.user = conn.execute("INSERT INTO users (name) VALUES ('u') RETURNING id").fetchone()[0]
            creds = {w: add_worker(conn, w) for w in ("home-1", "home-2")}
        testdata = root / "testdata"
        write_testdata(testdata, self.problem, APLUSB_TESTS)
        self.arbiter = ArbiterProcess(self.dsn, root, **ARBITER)
        self.workers = [WorkerProcess(root, w, "home", "arbiter", testdata, credential=c,
                                      arbiter_urls=[self.arbiter.url], **WORKER) for w, c in creds.items()]
        self.submitted: dict[int, str] = {}
        self.stop_client = threading.Event()
        self.client_errors: list[str] = []
        self._client = threading.Thread(target=self._submit_loop, name="client", daemon=True)

    def connect(self):
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)

    def start(self) -> "Site":
        self.arbiter.start()
        for worker in self.workers:
            worker.start()
        self._client.start()
        return self

    def _submit_loop(self) -> None:
        kinds = ["slow", "slow", "AC", "WA"]
        n = 0
        while not self.stop_client.is_set():
            try:
                with self.connect() as conn:
                    busy = conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                        ).fetchone()[0]
                    if busy < BACKLOG:
                        kind = kinds[n % len(kinds)]
                        source = SLOW_AC if kind == "slow" else PROGRAMS["python3"][kind]
                        sid = leases.submit(conn, self.user, self.problem, "python3", source)
                        self.submitted[sid] = "AC" if kind == "slow" else kind
                        n += 1
                        continue
            except psycopg.OperationalError:
                pass  # the primary is moving; the client tries again, as a web front end would
            except Exception as exc:  # noqa: BLE001 - a harness error must fail the test, not hang it
                self.client_errors.append(f"{type(exc).__name__}: {exc}")
                return
            self.stop_client.wait(0.1)

    def judged(self) -> int:
        try:
            with self.connect() as conn:
                return conn.execute("SELECT count(*) FROM submissions WHERE status NOT IN ('pending', 'judging')"
                                    ).fetchone()[0]
        except psycopg.OperationalError:
            return 0

    def first_grant_after(self, at: float) -> float | None:
        with self.connect() as conn:
            return conn.execute("SELECT extract(epoch FROM min(granted_at))::float8 FROM lease_grants "
                                "WHERE granted_at > to_timestamp(%s)", (at,)).fetchone()[0]

    def longest_grant_gap(self, since: float) -> float:
        """The longest wait between two lease grants after ``since`` (DB time), while work was queued."""
        with self.connect() as conn:
            times = [t for (t,) in conn.execute(
                "SELECT extract(epoch FROM granted_at)::float8 FROM lease_grants "
                "WHERE granted_at > to_timestamp(%s) ORDER BY granted_at", (since,)).fetchall()]
        return max(b - a for a, b in zip(times, times[1:]))

    def worker_errors(self) -> list[str]:
        return [line for w in self.workers for line in w.log_text().splitlines() if '"level": "error"' in line]

    def drain(self) -> None:
        """Stop submitting; wait until everything is judged and every outbox is empty."""
        self.stop_client.set()
        self._client.join(10)

        def settled():
            try:
                with self.connect() as conn:
                    busy = conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                        ).fetchone()[0]
            except psycopg.OperationalError:
                return False
            return busy == 0 and not any(w.outbox_files() for w in self.workers)

        wait_for(settled, 120, 0.5, "every submission judged and every outbox delivered")

    def arbiter_events(self) -> list[dict]:
        events = []
        for line in self.arbiter.log_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def check(self) -> None:
        """The invariants of the module's docstring."""
        assert not self.client_errors, self.client_errors
        with self.connect() as conn:
            status = dict(conn.execute("SELECT id, status FROM submissions").fetchall())
            missing = sorted(set(self.submitted) - set(status))
            assert not missing, f"submissions the client was told of are gone: {missing}"
            wrong = {sid: (status[sid], want) for sid, want in self.submitted.items() if status[sid] != want}
            assert not wrong, f"verdicts other than the programs' own: {wrong}"
            assert_each_submission_decided_once_by_its_last_lease(conn)
        events = self.arbiter_events()
        received = Counter(e["submission_id"] for e in events
                           if e.get("event") == "result received" and not e.get("duplicate"))
        assert set(received) >= set(self.submitted), "the arbiter's log must tell every result it received"
        lost = {sid: n for sid, n in received.items() if n > 1}
        assert not lost, f"results acknowledged, lost and judged again (submission: times received): {lost}"
        reclaimed = [e for e in events if e.get("event") == "lease expired"]
        assert not reclaimed, f"leases reclaimed across the failover: {reclaimed}"

    def stop(self) -> None:
        self.stop_client.set()
        for worker in self.workers:
            worker.stop()
        self.arbiter.stop()


@pytest.fixture
def site(cluster, tmp_path, request):
    name = "judge_" + request.node.name.removeprefix("test_")[:40]
    s = Site(cluster, tmp_path, name).start()
    yield s
    s.stop()
    cluster.heal()  # the next test starts from two hosts replicating, whatever this one left


def _walsender_pid(cluster: HaCluster, primary) -> int:
    with psycopg.connect(cluster.node_dsn(primary), connect_timeout=3) as conn:
        return conn.execute("SELECT pid FROM pg_stat_replication").fetchone()[0]


def test_a_killed_primary_loses_no_acknowledged_result_and_reclaims_no_lease(cluster, site):
    wait_for(lambda: site.judged() >= 6, 90, 0.5, "six submissions judged before the fault")
    primary, standby = cluster.primary(), cluster.standby()
    assert cluster.sync_standby() is standby, "the standby must be the synchronous one before the fault"

    # The primary stops sending WAL for a few seconds while results keep arriving (its WAL sender is
    # paused; pausing the standby's receiver would not do: what was sent waits in its socket buffer),
    # then dies. With synchronous replication each of those commits waits for the standby, so no 200
    # goes out for them; with asynchronous replication they would be acknowledged, then lost.
    sender = _walsender_pid(cluster, primary)
    os.kill(sender, signal.SIGSTOP)
    time.sleep(3)
    killed_at = time.time()
    cluster.kill_host(primary)  # SIGKILL ends a stopped process too

    cluster.wait_for(lambda: cluster.primary() is standby, 90, f"{standby.name} promoted")
    first = wait_for(lambda: site.first_grant_after(killed_at), 90, 0.5, "a lease granted on the new primary")
    print(f"database failover: first lease on the new primary {first - killed_at:.1f} s after the primary's death")

    cluster.start_node(primary)  # the old primary comes back, rewound, as the new one's standby
    site.drain()
    site.check()
    assert cluster.primary() is standby


def test_a_switchover_under_load_reclaims_no_lease_and_loses_no_result(cluster, site):
    wait_for(lambda: site.judged() >= 6, 90, 0.5, "six submissions judged before the switchover")
    old = cluster.primary()
    started = time.time()
    cluster.switchover()
    new = cluster.primary()
    assert new is not old
    wait_for(lambda: site.judged() >= 12, 90, 0.5, "six more submissions judged after the switchover")
    print(f"switchover: longest gap between two leases {site.longest_grant_gap(started - 5):.1f} s")
    site.drain()
    site.check()
    # The workers saw the database move only as an arbiter that answered 503 for a moment: no error.
    assert site.worker_errors() == []
