"""Scenario 8: the arbiter is up but its dispatch loop is stuck: /readyz goes unready, the alert fires."""

import threading

from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, wait_for

from worker.delivery.http_client import ArbiterClient


def test_wedged_dispatch_loop_is_seen_by_readyz_and_the_stuck_alert(db, arbiters, tmp_path):
    wedge = tmp_path / "wedge"
    with db.connect() as conn:
        seed_problem(conn)
        cred = add_worker(conn, "home-1")
    a = arbiters.start(db.dsn, env={"JUDGE_ARBITER_FAULTS": f"wedge_file={wedge}"}, long_poll_max_secs=20.0,
                       stuck_alert_secs=3.0, ready_max_round_age_secs=2.0)
    assert a.get("/readyz")[0] == 200
    wedge.write_text("stuck")
    box = {}
    c = ArbiterClient([a.url], cred)
    t = threading.Thread(target=lambda: box.setdefault("reply", c.acquire("r", None, 20)))
    t.start()
    with db.connect() as conn:
        seed_submissions(conn, 1)
    # The process is up and /healthz answers, but readiness follows the real dispatch path.
    wait_for(lambda: a.get("/readyz")[0] == 503, 10, what="readyz to go unready")
    assert a.get("/healthz")[0] == 200
    assert any("last dispatch round" in r for r in a.get("/readyz")[1]["reasons"])
    wait_for(lambda: "arbiter_stuck_dispatch 1" in a.get("/metrics")[1], 15, what="stuck alert metric")
    wait_for(lambda: "dispatch stuck" in a.log_text(), 5, what="alert log line")
    wedge.unlink()
    t.join(20)
    assert box["reply"].status == 200
    wait_for(lambda: a.get("/readyz")[0] == 200, 10, what="ready again")
    assert "arbiter_stuck_dispatch 0" in a.get("/metrics")[1]
