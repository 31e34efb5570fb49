"""The database fails over under a stream of submissions, and nothing the arbiter acknowledged is lost.

A real replicated PostgreSQL (arbiter/lab/hacluster.py: Patroni, three etcd members, two database
hosts, synchronous replication), a real arbiter and two real workers reaching it through one
multi-host DSN with ``target_session_attrs=read-write``. Each test kills or hands over the primary in
the middle of judging and then requires, in the final database on the new primary, what
``Site.check`` holds (tests/support/site.py): every submission terminal with its program's verdict,
each verdict by its newest lease, once; no result the arbiter answered 200 for lost; no lease
reclaimed (the seconds without a database are not the workers' fault: the grace the janitor owes
after an outage, docs/design.md scenario 7).

Both mechanisms were removed by hand once to see these fail: with ``synchronous=False``
(asynchronous replication) the paused WAL sender keeps acknowledged writes from the standby and the
killed-primary test reports them lost; with the janitor's grace after an outage removed, its leases
(6 s) run out during the ~20 s failover and the test reports the reclaims.
"""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest
from support.procs import wait_for
from support.site import Site

from arbiter.lab.hacluster import HaCluster

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def cluster():
    ha = HaCluster().start()
    yield ha
    ha.destroy()


@pytest.fixture
def site(cluster, tmp_path, request):
    name = "judge_" + request.node.name.removeprefix("test_")[:40]
    with cluster.connect() as admin:
        admin.execute(f"CREATE DATABASE {name}")
    s = Site(cluster.dsn(name), tmp_path).start()
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
