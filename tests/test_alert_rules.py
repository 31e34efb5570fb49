"""The Prometheus alert rules and the Grafana dashboard: promtool checks the rules (and runs their unit
tests) and every dashboard expression; every metric either names is exported by a running arbiter."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

# The judge_monitoring role's files: Prometheus loads the rules, Grafana the dashboard.
RULES = Path(__file__).resolve().parent.parent / "ansible" / "roles" / "judge_monitoring" / "files"
DASHBOARD = RULES / "judge-arbiter.dashboard.json"
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


def test_the_status_pages_alerts_use_the_rules_thresholds():
    """The status page names the alerts it can see for itself with the rules' own thresholds
    (arbiter/server/http/operator_api.py): the two must not drift apart."""
    import yaml

    from arbiter.server.http import operator_api

    rules = {r["alert"]: r for g in yaml.safe_load((RULES / "judge-arbiter.rules.yml").read_text())["groups"]
             for r in g["rules"]}
    assert re.fullmatch(r"max\(arbiter_oldest_pending_seconds\) > (\d+)", rules["JudgeBacklog"]["expr"].strip()
                        ).group(1) == str(operator_api.BACKLOG_SECS)
    window = re.search(r"arbiter_system_errors_total\[(\d+)m\]", rules["JudgeSubmissionSystemError"]["expr"])
    assert window.group(1) == str(operator_api.SYSTEM_ERROR_WINDOW_MINUTES)
    assert "> 3 * max(arbiter_canary_interval_seconds)" in rules["JudgeCanaryFailing"]["expr"]


def test_every_runbook_link_points_at_a_section_that_exists():
    runbook = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()
    # GitHub-style anchors: lower case, punctuation dropped, spaces to hyphens.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, re.MULTILINE)}
    links = set(re.findall(r"docs/runbook\.md#([a-z0-9-]+)", (RULES / "judge-arbiter.rules.yml").read_text()))
    assert links and links <= anchors, f"broken runbook links: {sorted(links - anchors)}"


def dashboard_exprs() -> list[str]:
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.mark.skipif(promtool is None, reason="promtool not installed (Debian package prometheus)")
def test_every_dashboard_expression_is_valid_promql(tmp_path):
    """Each panel's query as a recording rule: promtool parses it as Prometheus would."""
    import json

    exprs = dashboard_exprs()
    assert len(exprs) >= 12
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:panel_{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.rules.yml").write_text(json.dumps(rules))  # JSON is YAML
    check = subprocess.run([promtool, "check", "rules", "dashboard.rules.yml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_metric_the_dashboard_names_is_exported_by_a_running_arbiter(db, arbiters):
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in dashboard_exprs()
            for m in re.findall(r"\b(arbiter_[a-z_]+)", e)}
    assert {"arbiter_queue_submissions", "arbiter_oldest_pending_seconds", "arbiter_verdicts_total",
            "arbiter_queue_wait_seconds", "arbiter_judging_seconds", "arbiter_workers"} <= used
    a = arbiters.start(db.dsn)
    status, text = a.get("/metrics")
    assert status == 200
    exported = set(re.findall(r"^# TYPE (arbiter_[a-z_]+) ", text, re.MULTILINE))
    assert used <= exported, f"the dashboard uses metrics the arbiter does not export: {sorted(used - exported)}"
