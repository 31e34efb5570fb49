"""A rolling upgrade of the arbiters under a stream of submissions: the standby is stopped and
started again (its new release), the leader is stopped and the standby leads, the old leader starts
again (its new release) and waits as the standby; then the same once more the other way round.
``ansible/upgrade-arbiters.yml`` does these steps on a site; here they run on processes of this
machine so that the gap can be read lease by lease.

Two mechanisms make the hand-over quick, each removed by hand once to see this test fail:
- the standby waits on the lock itself (arbiter/server/loops/leader.py), so it leads the moment the
  lock is free, not at its next try. Checked in order, not by speed: before each hand-over the
  standby's session is seen waiting on the lock in pg_locks (with the previous loop, which tried
  ``pg_try_advisory_lock`` every ``leader_retry_secs``, it never is, and the test fails; the gap
  then measured 0.99 s, by the luck of the standby's phase);
- the leader's stop gives the lock up before anything else (arbiter/server/serving.py), not once its
  requests in flight are done: here a worker's result upload is half-way over a slow link when the
  stop comes (the arbiter waits ``body_timeout_secs`` for the rest). Without it the lock stayed with
  the stopping arbiter for those 10 s: the new leader's first leases 11.1 and 10.1 s after the
  stops, and the test failed.
Workers parked on the old leader are answered "stopping" and go to the next URL, where the standby,
leading or about to (``handover_wait_secs``), parks them. The invariants of ``Site.check`` hold
(nothing lost, nothing judged twice, no lease reclaimed) and no worker logs an error.

Measured, printed: the longest gap between two leases while work was queued, during the upgrade and,
for comparison, over as long a while before it. Asserted only against the standby's retry period
(``leader_retry_secs``, 3 s as by default).
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from support.procs import wait_for
from support.site import Site

pytestmark = pytest.mark.timeout(300)

RETRY = 3.0  # leader_retry_secs, the default
ARBITER = {"leader_retry_secs": RETRY, "long_poll_max_secs": 20.0, "body_timeout_secs": 10.0}
WORKER = {"long_poll_secs": 15.0, "request_timeout_secs": 5.0}


def waiting_on_the_lock(site: Site, name: str) -> bool:
    """Whether arbiter ``name``'s session waits on an advisory lock (the leader lock) right now."""
    with site.connect() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' "
            "AND NOT l.granted AND a.application_name = %s", (f"judge-arbiter-{name}",)).fetchone()[0] == 1


def slow_upload(site: Site, url: str) -> socket.socket:
    """A worker's result upload half-way over a slow link: the headers and a few bytes of the body."""
    credential = site.credentials["home-1"]
    body = json.dumps({"lease_token": "x" * 64, "verdict": "AC", "detail": {}}).encode()
    head = (f"POST /v1/leases/1/result HTTP/1.1\r\nHost: arbiter\r\nAuthorization: Bearer {credential}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    sock.sendall(head + body[:5])
    return sock


def hand_over(site: Site, old: str, new: str) -> float:
    """Upgrade the standby ``new``, hand the lock over from ``old``, upgrade ``old``; return the DB time
    the old leader's stop began."""
    standby, leader = site.arbiters[new], site.arbiters[old]
    standby.stop()
    standby.start(wait_ready=False)
    wait_for(lambda: waiting_on_the_lock(site, new), 10, 0.1, f"{new}'s session waiting on the leader lock")
    upload = slow_upload(site, leader.url)
    try:
        stopped_at = site.db_time()
        leader.stop()
    finally:
        upload.close()
    standby.wait_ready(10)
    leader.start(wait_ready=False)
    return stopped_at


def test_a_rolling_arbiter_upgrade_hands_over_without_a_gap(make_db, tmp_path):
    db = make_db("empty")
    site = Site(db.dsn, tmp_path, {"a1": ARBITER, "a2": ARBITER}, worker=WORKER, slow=False).start()
    try:
        wait_for(lambda: site.judged() >= 20, 90, 0.5, "twenty submissions judged before the upgrade")
        before = site.db_time()
        time.sleep(8)
        started = site.db_time()
        firsts = []
        for old, new in (("a1", "a2"), ("a2", "a1")):
            stopped_at = hand_over(site, old, new)
            judged = site.judged()
            wait_for(lambda: site.judged() >= judged + 10, 60, 0.2, f"ten submissions judged by {new}")  # noqa: B023
            firsts.append(site.first_grant_by(new, stopped_at) - stopped_at)
            status, body = site.arbiters[old].get("/readyz")
            assert status == 503 and "not the leader" in body["reasons"], (old, status, body)
        ended = site.db_time()

        gap = site.longest_grant_gap(started, ended)
        usual = site.longest_grant_gap(before, started)
        print(f"rolling arbiter upgrade: longest gap between two leases {gap:.2f} s (over as long before it: "
              f"{usual:.2f} s); the new leader's first lease {', '.join(f'{f:.2f}' for f in firsts)} s after "
              "the old leader's stop began")
        assert gap < RETRY, f"a {gap:.1f} s gap: the hand-over waited for something"
        site.drain()
        site.check()
        assert not site.worker_errors(), site.worker_errors()
    finally:
        site.stop()
