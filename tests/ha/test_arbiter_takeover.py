"""A standby arbiter takes over when the leader dies or its host goes silent, under a stream of
submissions, and the invariants of ``Site.check`` hold (tests/support/site.py): every submission
terminal with its program's verdict, each verdict by its newest lease once, no acknowledged result
lost, no lease reclaimed.

- The leader is killed (-9): its leader-lock session ends with the process (the kernel closes the
  connection), and the standby takes the lock on its next try (``leader_retry_secs``).
- The leader's host goes silent: the leader runs in a network namespace of its own (a host), and its
  link goes down without a word (no FIN, no RST: a pulled cable, a dead host). The server learns of
  it only from TCP keepalives; the leader-lock session asks the server for them (arbiter/store/db.py),
  and without them the lock stays with the silent host for the kernel's two hours. The workers parked
  on it long-poll 25 s as a site's do; their parked connections send keepalive probes
  (worker/delivery/http_client.py), so they park on the standby within seconds rather than at the
  end of the long-poll. Removed by hand once each: without the session's keepalive options the
  standby never took over within the wait; without the workers' probes the standby's first lease
  came after the workers' long-poll ran out.

Figures are printed (seconds from the fault to the first lease the standby granted); speed is
measured, not asserted.
"""

from __future__ import annotations

import subprocess
import time

import psycopg
import pytest
from support.procs import wait_for
from support.site import Site

from arbiter.lab.devcluster import LocalCluster

pytestmark = pytest.mark.timeout(300)

# The silent host: a namespace joined to this machine by a veth pair, on a subnet of its own (the
# netlab's is 10.231.0.0/24).
NETNS = "jha-arbiter-1"
HOST_SIDE, NS_SIDE = "jha-h0", "jha-n0"
HOST_IP, NS_IP = "10.232.0.1", "10.232.0.2"
PARKED_LONG = {"long_poll_secs": 25.0, "request_timeout_secs": 10.0}


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
def silent_host_net():
    """A namespace host joined to this machine by a veth pair; gone afterwards."""
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)  # a remain of a killed run
    sh("ip", "netns", "add", NETNS)
    try:
        sh("ip", "link", "add", HOST_SIDE, "type", "veth", "peer", "name", NS_SIDE, "netns", NETNS)
        sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_SIDE)
        sh("ip", "link", "set", HOST_SIDE, "up")
        for cmd in (["ip", "addr", "add", f"{NS_IP}/24", "dev", NS_SIDE], ["ip", "link", "set", NS_SIDE, "up"],
                    ["ip", "link", "set", "lo", "up"]):
            sh("ip", "netns", "exec", NETNS, *cmd)
        yield
    finally:
        pids = subprocess.run(["ip", "netns", "pids", NETNS], capture_output=True, text=True).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        subprocess.run(["ip", "link", "del", HOST_SIDE], capture_output=True)


def test_a_leader_whose_host_goes_silent_is_replaced_by_the_standby(silent_host_net, tmp_path):
    cluster = LocalCluster(fast=False, settings={"listen_addresses": f"'127.0.0.1,{HOST_IP}'"}).init()
    with open(cluster.data_dir / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {NS_IP}/32 trust\n")
    cluster.start()
    site = None
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE judge")
        arbiters = {"a1": {"dsn": f"host={HOST_IP} port={cluster.port} dbname=judge user=postgres",
                           "netns": NETNS, "address": NS_IP},
                    "a2": {}}
        # The workers long-poll as a site's do (25 s, and 10 s more before a request counts as hung).
        site = Site(cluster.dsn("judge"), tmp_path, arbiters, worker=PARKED_LONG).start()
        # The cable is pulled on the leader's side: its link goes down, so nothing it sends leaves and
        # what the server sends it is dropped without an answer.
        took = standby_takes_over(site, lambda: sh("ip", "netns", "exec", NETNS, "ip", "link", "set", NS_SIDE, "down"),
                                  "leader's host silent, workers parked on it", parked=True)
        # Not a speed bound: the order of events. The workers parked on the silent leader learned it was
        # gone from their connections' keepalive probes and parked on the standby, rather than at the
        # end of their long-poll.
        assert took < PARKED_LONG["long_poll_secs"], f"the standby's first lease came {took:.1f} s after"
    finally:
        if site is not None:
            site.stop()
        cluster.destroy()
