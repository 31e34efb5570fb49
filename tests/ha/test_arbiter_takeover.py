"""A standby arbiter takes over when the leader dies, its host goes silent or it loses the database, under a stream of
submissions, and the invariants of ``Site.check`` hold (tests/support/site.py): every submission
terminal with its program's verdict, each verdict by its newest lease once, no acknowledged result
lost, no lease reclaimed.

- The leader is killed (-9): its leader-lock session ends with the process (the kernel closes the
  connection), and the standby takes the lock on its next try (``leader_retry_secs``).
- The leader's host goes silent: the leader runs in a network namespace of its own (a host), and its
  lines are cut between it and this machine (no FIN, no RST: a cut cable, a dead host). The server learns of
  it only from TCP keepalives; the leader-lock session asks the server for them (arbiter/store/db.py),
  and without them the lock stays with the silent host for the kernel's two hours. The workers parked
  on it long-poll 25 s as a site's do; their parked connections send keepalive probes
  (worker/delivery/http_client.py), so they park on the standby within seconds rather than at the
  end of the long-poll. Removed by hand once each: without the session's keepalive options the
  standby never took over within the wait; without the workers' probes the standby's first lease
  came after the workers' long-poll ran out.

- The leader is cut from the database only (the workers still reach it): the server drops its lock
  session the same way, the standby takes the lock, and the old leader, whose statements now go
  unacknowledged, closes its connections after ``tcp_user_timeout`` (arbiter/store/db.py), drops the
  leadership and turns the workers parked on it to the next URL. Removed by hand: without
  tcp_user_timeout its check statement waited on TCP retransmission, it kept its parked workers for
  their whole long-poll (25.8 s to the standby's first lease); without the server-side keepalives
  the standby never took over.

Figures are printed (seconds from the fault to the first lease the standby granted); speed is
measured, not asserted.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from support.procs import wait_for
from support.site import Site

from arbiter.lab.devcluster import LocalCluster

pytestmark = pytest.mark.timeout(300)

# The leader's host: a namespace joined to this machine by two veth links, on subnets of their own
# (the netlab's is 10.231.0.0/24).
NETNS = "jha-arbiter-1"
LINKS = {"web": {"bridge": "jha-web-br", "host_if": "jha-web-h", "ns_if": "jha-web-n", "host_ip": "10.232.0.1",
                 "ns_ip": "10.232.0.2"},
         "db": {"bridge": "jha-db-br", "host_if": "jha-db-h", "ns_if": "jha-db-n", "host_ip": "10.232.1.1",
                "ns_ip": "10.232.1.2"}}
PARKED_LONG = {"long_poll_secs": 25.0, "request_timeout_secs": 10.0}
PARKED_LONG_ARBITER = {"long_poll_max_secs": 30.0}  # the default: the arbiter holds a 25 s long-poll whole


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def standby_takes_over(site: Site, fault, what: str, parked: bool = False) -> float:
    """Under load, ``fault`` strikes the leader; the standby's first lease is timed; the standby
    judges on; everything drains and the invariants hold. Returns the seconds to that first lease.
    ``parked``: strike when the queue has run dry and every worker is parked on the leader."""
    wait_for(lambda: site.judged() >= 6, 90, 0.5, "six submissions judged before the fault")
    if parked:
        site.hold_client.set()
        wait_for(site.idle, 60, 0.2, "the queue empty and every worker parked")
        time.sleep(1)  # each worker's next acquire is parked on the leader
    struck_at = time.time()
    fault()
    site.hold_client.clear()
    # The standby's own log says when it granted: a lease the leader committed as it was struck is not
    # a takeover.
    first = wait_for(lambda: site.first_grant_by("a2", struck_at), 60, 0.2, "a lease from the standby")
    print(f"arbiter takeover ({what}): first lease from the standby {first - struck_at:.1f} s after")
    wait_for(lambda: site.judged() >= 12, 90, 0.5, "six more submissions judged by the standby")
    site.drain()
    site.check()
    return first - struck_at


def test_a_killed_leader_is_replaced_by_the_standby(make_db, tmp_path):
    db = make_db("empty")
    site = Site(db.dsn, tmp_path, {"a1": {}, "a2": {}}).start()
    try:
        standby_takes_over(site, site.arbiters["a1"].kill9, "leader killed")
    finally:
        site.stop()


@pytest.fixture
def leader_host():
    """The leader's host: a namespace joined to this machine by two veth links, one the workers reach
    it on (web) and one it reaches the database on (db), so that either can be cut alone. Yields a
    function that takes a link down from the namespace's side; all gone afterwards."""
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)  # remains of a killed run
    for link in LINKS.values():
        subprocess.run(["ip", "link", "del", link["bridge"]], capture_output=True)
    sh("ip", "netns", "add", NETNS)
    try:
        sh("ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up")
        for link in LINKS.values():
            # This machine's address is on a bridge, the veth's near end a port of it: taking the port
            # down cuts the line while both hosts keep their interfaces and routes (below).
            sh("ip", "link", "add", link["bridge"], "type", "bridge")
            sh("ip", "addr", "add", f"{link['host_ip']}/24", "dev", link["bridge"])
            sh("ip", "link", "set", link["bridge"], "up")
            sh("ip", "link", "add", link["host_if"], "type", "veth", "peer", "name", link["ns_if"], "netns", NETNS)
            sh("ip", "link", "set", link["host_if"], "master", link["bridge"])
            sh("ip", "link", "set", link["host_if"], "up")
            sh("ip", "netns", "exec", NETNS, "ip", "addr", "add", f"{link['ns_ip']}/24", "dev", link["ns_if"])
            sh("ip", "netns", "exec", NETNS, "ip", "link", "set", link["ns_if"], "up")

        def cut(*names: str) -> None:
            # The line is cut between the two hosts (the bridge port goes down): each keeps its
            # interface and its route, so what either sends is dropped on the way without an error
            # or an answer, as on a cut cable; no FIN, no RST either way. (Taking either host's own
            # interface down instead would remove its route: its kernel would fail the sends at once,
            # or, for keepalive probes, retry them forever without counting them.)
            for name in names:
                sh("ip", "link", "set", LINKS[name]["host_if"], "down")

        yield cut
    finally:
        pids = subprocess.run(["ip", "netns", "pids", NETNS], capture_output=True, text=True).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        for link in LINKS.values():
            subprocess.run(["ip", "link", "del", link["host_if"]], capture_output=True)
            subprocess.run(["ip", "link", "del", link["bridge"]], capture_output=True)


def cluster_on_the_db_link(fast: bool) -> LocalCluster:
    """A PostgreSQL on this machine, started, that the leader's host reaches on the db link too."""
    db_link = LINKS["db"]
    cluster = LocalCluster(fast=fast, settings={"listen_addresses": f"'127.0.0.1,{db_link['host_ip']}'"}).init()
    with open(cluster.data_dir / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {db_link['ns_ip']}/32 trust\n")
    return cluster.start()


@contextlib.contextmanager
def site_led_from(leader_host_ns: str, tmp_path):
    """A PostgreSQL on this machine (also on the db link), the leader a1 in the namespace, the standby
    a2 on this machine; the workers long-poll as a site's do (25 s, and 10 s more before a request
    counts as hung) and the arbiters hold such a long-poll whole, as by default."""
    db_link = LINKS["db"]
    cluster = cluster_on_the_db_link(fast=False)
    site = None
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE judge")
        arbiters = {"a1": {"dsn": f"host={db_link['host_ip']} port={cluster.port} dbname=judge user=postgres",
                           "netns": leader_host_ns, "address": LINKS["web"]["ns_ip"], **PARKED_LONG_ARBITER},
                    "a2": PARKED_LONG_ARBITER}
        site = Site(cluster.dsn("judge"), tmp_path, arbiters, worker=PARKED_LONG).start()
        yield site
    finally:
        if site is not None:
            site.stop()
        cluster.destroy()


def test_a_leader_whose_host_goes_silent_is_replaced_by_the_standby(leader_host, tmp_path):
    with site_led_from(NETNS, tmp_path) as site:
        took = standby_takes_over(site, lambda: leader_host("web", "db"), "leader's host silent, workers parked on it",
                                  parked=True)
    # Not a speed bound: the order of events. The workers parked on the silent leader learned it was
    # gone from their connections' keepalive probes and parked on the standby, rather than at the end
    # of their long-poll.
    assert took < PARKED_LONG["long_poll_secs"], f"the standby's first lease came {took:.1f} s after"


def test_a_leader_cut_from_the_database_only_is_replaced_by_the_standby(leader_host, tmp_path):
    """The workers still reach the leader; the leader no longer reaches the database. The server drops
    its lock session (keepalives), the standby takes the lock, and the old leader, with no database,
    sends the workers parked on it to the next URL rather than holding them."""
    with site_led_from(NETNS, tmp_path) as site:
        took = standby_takes_over(site, lambda: leader_host("db"), "leader cut from the database, workers parked on it",
                                  parked=True)
    assert took < PARKED_LONG["long_poll_secs"], f"the standby's first lease came {took:.1f} s after"


# A leader-lock session as the arbiter opens it (arbiter/store/db.py connect_session), from the
# leader's host: it takes the lock, listens on a channel and waits (this machine's NOTIFYs keep the
# server sending to it).
LOCK_HOLDER = """
import sys, time
from arbiter.server.config import ArbiterSettings
from arbiter.store import db
conn = db.connect_session(ArbiterSettings(dsn=sys.argv[1]))
conn.execute("SELECT pg_advisory_lock(4242)")
conn.execute("LISTEN chatter")
print("locked", flush=True)
time.sleep(600)
"""


def test_a_lock_session_cut_while_the_server_awaits_an_ack_is_dropped_within_seconds(leader_host):
    """The line to the leader is cut while the server is sending to its lock session (here: a stream of
    NOTIFYs; in a site, the answer to the leader's check, whose ACK the leader's kernel delays).
    Keepalives probe only a connection with nothing unacknowledged: the server would retransmit for
    about 15 minutes, holding the lock, and no standby could lead (a CI run met this once: the
    standby waited 60 s and more). The session's tcp_user_timeout drops it in seconds instead."""
    db_link = LINKS["db"]
    cluster = cluster_on_the_db_link(fast=True)
    holder = None
    chatter_stops = threading.Event()
    try:
        holder = subprocess.Popen(["ip", "netns", "exec", NETNS, sys.executable, "-c", LOCK_HOLDER,
                                   f"host={db_link['host_ip']} port={cluster.port} dbname=postgres user=postgres"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert holder.stdout.readline().strip() == "locked"

        def chatter() -> None:
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                while not chatter_stops.wait(0.005):
                    conn.execute("NOTIFY chatter, 'x'")

        talking = threading.Thread(target=chatter, daemon=True)
        talking.start()
        time.sleep(0.5)
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            assert conn.execute("SELECT pg_try_advisory_lock(4242)").fetchone() == (False,)
            leader_host("db")
            cut_at = time.monotonic()
            # A standby's try: free once the server has dropped the session.
            wait_for(lambda: conn.execute("SELECT pg_try_advisory_lock(4242)").fetchone() == (True,), 40, 0.5,
                     "the server to drop the cut lock session")
            print(f"lock session dropped {time.monotonic() - cut_at:.1f} s after the cut")
    finally:
        chatter_stops.set()
        if holder is not None:
            holder.kill()
            holder.wait(10)
        cluster.destroy()
