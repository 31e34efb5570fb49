"""The contest-day metrics: verdicts by verdict and worker, system_error by cause, the judging time
and the queue's wait as histograms, the queue's depth and its oldest pending age read from the
database at each scrape. A real arbiter and a real worker judge real programs; promtool parses the
exposition."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest
from support.procs import WorkerProcess, aplusb_site, wait_for
from support.programs import PROGRAMS

from arbiter.server.metrics import Metrics
from arbiter.store import leases

WORKER_FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
               "backoff_max_secs": 2.0}


def samples(text: str, name: str) -> dict[str, float]:
    """Every sample of one metric: its label text ("" when none) -> value."""
    found = {}
    for labels, value in re.findall(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.M):
        found[labels] = float(value)
    return found


def test_a_histogram_is_cumulative_and_prometheus_reads_it():
    m = Metrics()
    for secs in (0.03, 0.3, 7.0, 7200.0):
        m.observe("arbiter_judging_seconds", secs, kind="home")
    text = m.render()
    buckets = samples(text, "arbiter_judging_seconds_bucket")
    assert buckets['kind="home",le="0.05"'] == 1 and buckets['kind="home",le="0.5"'] == 2
    assert buckets['kind="home",le="10"'] == 3 and buckets['kind="home",le="3600"'] == 3
    assert buckets['kind="home",le="+Inf"'] == 4
    assert samples(text, "arbiter_judging_seconds_count") == {'kind="home"': 4}
    assert samples(text, "arbiter_judging_seconds_sum") == {'kind="home"': 7207.33}
    promtool = shutil.which("promtool")
    if promtool:
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_arbiter_exports_verdicts_times_and_the_queue_as_the_database_has_them(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn)
    _, text = a.get("/metrics")
    assert samples(text, "arbiter_system_errors_total") == {'cause="attempts"': 0, 'cause="releases"': 0,
                                                            'cause="worker"': 0}, "exported at 0 from the start"
    # Work waits with no worker: the queue's depth and its oldest pending age come from the database.
    with db.connect() as conn:
        ac = leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"])
        wa = leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["WA"])
    time.sleep(1.2)
    _, text = a.get("/metrics")
    assert samples(text, "arbiter_queue_submissions")['status="pending"'] == 2
    assert samples(text, "arbiter_oldest_pending_seconds")[""] >= 1.0

    worker = WorkerProcess(tmp_path, "home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url],
                           credential=site.cred, **WORKER_FAST).start()
    try:
        wait_for(lambda: _decided(db, ac, wa), 90, 0.2, "both judged")
    finally:
        worker.stop()
    _, text = a.get("/metrics")
    assert samples(text, "arbiter_verdicts_total") == {'verdict="AC",worker="home-1"': 1,
                                                       'verdict="WA",worker="home-1"': 1}
    judging = samples(text, "arbiter_judging_seconds_count")
    assert judging == {'kind="home"': 2}, judging
    waited = samples(text, "arbiter_queue_wait_seconds_sum")['kind="home"']
    assert samples(text, "arbiter_queue_wait_seconds_count") == {'kind="home"': 2}
    assert waited >= 2 * 1.2, f"both waited at least the 1.2 s before the worker came: {waited}"
    assert samples(text, "arbiter_queue_submissions")['status="pending"'] == 0
    assert samples(text, "arbiter_oldest_pending_seconds")[""] == 0
    # home-1 was heard from seconds ago and holds no lease now.
    assert samples(text, "arbiter_workers") == {'state="busy"': 0, 'state="idle"': 1, 'state="silent"': 0,
                                                'state="paused"': 0, 'state="revoked"': 0}


def _decided(db, *sids) -> bool:
    with db.connect() as conn:
        rows = conn.execute("SELECT status FROM submissions WHERE id = ANY(%s)", (list(sids),)).fetchall()
    return all(status not in ("pending", "judging") for (status,) in rows)


@pytest.mark.parametrize("how", ["release", "verdict"])
def test_each_way_to_system_error_is_counted_by_its_cause(db, arbiters, tmp_path, how):
    """A submission handed back max_releases times is cause "releases" (it was counted as an accepted
    release only); a worker's own system_error verdict is cause "worker"."""
    import json
    import urllib.request

    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, max_releases=1)
    with db.connect() as conn:
        sid = leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"])
        lease = leases.acquire(conn, worker_id="home-1", kind="home", request_id="r1", languages=["python3"],
                               unconfirmed_secs=30, legacy=None)
    assert lease.submission_id == sid
    path, body = (("release", {"lease_token": str(lease.lease_token), "reason": "sandbox will not start"})
                  if how == "release" else ("result", {"lease_token": str(lease.lease_token), "verdict": "system_error"}))
    request = urllib.request.Request(f"{a.url}/v1/leases/{sid}/{path}", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {site.cred}",
                                              "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    with db.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone() == ("system_error",)
    _, text = a.get("/metrics")
    cause = "releases" if how == "release" else "worker"
    assert samples(text, "arbiter_system_errors_total")[f'cause="{cause}"'] == 1
    assert sum(samples(text, "arbiter_system_errors_total").values()) == 1
