"""The Prometheus alert rules: promtool checks them and runs their unit tests; the metrics they use exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parent.parent / "ansible" / "files" / "prometheus"
promtool = shutil.which("promtool")


@pytest.mark.skipif(promtool is None, reason="promtool not installed (Debian package prometheus)")
def test_rules_are_valid_and_their_unit_tests_pass():
    check = subprocess.run([promtool, "check", "rules", "judge-arbiter.rules.yml"], cwd=RULES, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "judge-arbiter.rules.test.yml"], cwd=RULES,
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_every_metric_the_rules_use_is_exported_by_a_running_arbiter(db, arbiters):
    rules = (RULES / "judge-arbiter.rules.yml").read_text()
    used = set(re.findall(r"\b(arbiter_[a-z_]+)", rules))
    assert {"arbiter_stuck_dispatch", "arbiter_is_leader", "arbiter_db_up"} <= used
    a = arbiters.start(db.dsn)
    status, text = a.get("/metrics")
    assert status == 200
    exported = set(re.findall(r"^# TYPE (arbiter_[a-z_]+) ", text, re.MULTILINE))
    assert used <= exported, f"rules use metrics the arbiter does not export: {sorted(used - exported)}"


def test_every_runbook_link_points_at_a_section_that_exists():
    runbook = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()
    # GitHub-style anchors: lower case, punctuation dropped, spaces to hyphens.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, re.MULTILINE)}
    links = set(re.findall(r"docs/runbook\.md#([a-z0-9-]+)", (RULES / "judge-arbiter.rules.yml").read_text()))
    assert links and links <= anchors, f"broken runbook links: {sorted(links - anchors)}"
