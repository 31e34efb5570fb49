"""The CI chaos run: at least 100 real faults of every kind, then the checker must find nothing in
the database, the exchanges or the logs.

The long run is the same code with more faults: ``python tests/chaos/run.py --seed 7 --faults 2000``.
"""

import os

import pytest
from run import run

SEED = int(os.environ.get("JUDGE_CHAOS_SEED", "20261202"))
FAULTS = int(os.environ.get("JUDGE_CHAOS_FAULTS", "100"))


@pytest.mark.timeout(900)
def test_chaos_run_has_no_violations(tmp_path):
    said: list[str] = []
    report = run(SEED, FAULTS, submissions=max(60, FAULTS // 2), workdir=tmp_path, log=said.append)
    print("\n".join(said))
    print(report.figures)
    # The run says how to run it again, and names every fault with its time.
    assert said[0].startswith(f"chaos run: seed {SEED}, {FAULTS} faults"), said[:1]
    assert len([line for line in said if line.startswith("fault ")]) == report.figures["faults"]
    assert report.figures["faults"] >= FAULTS
    assert len(report.figures["faults_by_kind"]) >= 6, "every kind of fault should have been drawn"
    assert report.figures["faults_by_kind"].get("clock_jump", 0) >= 3, "the clock nemesis must have struck"
    assert report.figures["faults_by_kind"].get("failover", 0) >= 1, "each run begins with a database failover"
    assert report.figures["faults_by_kind"].get("power_loss", 0) >= 1, "and a worker host's power loss"
    for kind in ("partition_worker", "partition_db"):
        assert report.figures["faults_by_kind"].get(kind, 0) >= 1, f"the partition nemesis takes turns: {kind}"
    assert report.figures["log_lines"] > 0, "the log checker read the processes' logs"
    assert report.figures["reclaims"] > 0, "a run where no lease was ever lost tested little"
    assert report.figures["test_files_fetched"] > 0, "the workers fetch every data set into their small disk"
    assert report.violations == []
