"""The serving processes' garbage collection (arbiter/server/gcpolicy.py): the full collection on a
schedule of its own, every collection counted, and requests that leave no reference cycle behind
(what makes the schedule safe), checked against a running arbiter."""

from __future__ import annotations

import gc
import http.client
import json
import re
import time

from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker

from arbiter.server.gcpolicy import NO_AUTOMATIC_FULL, CollectionPolicy
from arbiter.server.metrics import Metrics


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def full_collections() -> int:
    return gc.get_stats()[2]["collections"]


def test_the_full_collection_runs_on_its_schedule_and_not_on_pythons_rule():
    clock = FakeClock()
    saved = gc.get_threshold()
    policy = CollectionPolicy("dispatch", 300.0, clock=clock).install(start_thread=False)
    try:
        assert gc.get_threshold() == (saved[0], saved[1], NO_AUTOMATIC_FULL)
        assert gc.get_freeze_count() > 0, "what was loaded before serving is frozen"
        before = full_collections()
        clock.now += 299
        assert not policy.tick() and full_collections() == before
        clock.now += 1
        assert policy.tick() and full_collections() == before + 1
        assert not policy.tick(), "the next one is a whole period later"
    finally:
        policy.uninstall()
    assert gc.get_threshold() == saved and gc.get_freeze_count() == 0


def test_zero_leaves_pythons_rule_and_still_counts_the_pauses():
    saved = gc.get_threshold()
    policy = CollectionPolicy("lease", 0.0, clock=FakeClock()).install(start_thread=False)
    metrics = Metrics()
    try:
        assert gc.get_threshold() == saved
        assert not policy.tick()
        gc.collect(0)
        gc.collect(1)
        policy.watch.publish(metrics)
    finally:
        policy.uninstall()
    for generation in ("0", "1"):
        assert metrics.get("arbiter_gc_pause_seconds_count", role="lease", generation=generation) >= 1
    assert policy.watch not in gc.callbacks


def gc_samples(port: int) -> tuple[float, float]:
    """The dispatching process's young collections so far, and the objects they freed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    young = r'generation="[01]",role="dispatch"'
    collections = sum(float(v) for v in re.findall(rf"^arbiter_gc_pause_seconds_count{{{young}}} (\S+)$", text, re.M))
    freed = sum(float(v) for v in re.findall(rf"^arbiter_gc_collected_objects_total{{{young}}} (\S+)$", text, re.M))
    return collections, freed


REQUESTS = 1500


def test_requests_leave_no_reference_cycles(db, arbiters):
    """With the full collection every 5 minutes, what a request left in a cycle would stay until then
    (and make that collection long). Every request here, heartbeats and probes on one keep-alive
    connection, frees its objects when it ends: the young collections find (almost) nothing."""
    with db.connect() as conn:
        seed_problem(conn)
        credential = add_worker(conn, "home-1")
        seed_submissions(conn, 1)
    a = arbiters.start(db.dsn)
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
    conn.request("POST", "/v1/acquire", json.dumps({"request_id": "r1", "wait_secs": 5}), headers)
    reply = conn.getresponse()
    lease = json.loads(reply.read())
    assert reply.status == 200, lease
    time.sleep(1.5)  # the counts are published once a second
    collections_before, freed_before = gc_samples(a.port)
    beat = json.dumps({"lease_token": lease["lease_token"]})
    for _ in range(REQUESTS):
        conn.request("POST", f"/v1/leases/{lease['submission_id']}/heartbeat", beat, headers)
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()
    time.sleep(1.5)
    collections_after, freed_after = gc_samples(a.port)
    freed = freed_after - freed_before
    # A cycle per request would also make the young collections run (every 700 objects that outlive
    # their request), and find it: some 40 of them and thousands of objects here.
    print(f"{collections_after - collections_before:.0f} young collections, {freed:.0f} objects freed")
    assert freed < REQUESTS * 2 * 0.05, f"{freed:.0f} objects in cycles freed for {2 * REQUESTS} requests"
