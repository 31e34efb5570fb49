"""The playbooks before they touch a host: lint (production profile), syntax, inventories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent
PLAYBOOKS = ["site.yml", "stage1.yml", "stage2.yml", "stage3.yml", "stage4.yml", "rollback.yml", "preflight.yml"]

pytestmark = pytest.mark.skipif(not (BIN / "ansible-playbook").exists(), reason="ansible-core missing")


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ANSIBLE, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", NO_COLOR="1", PATH=f"{BIN}:{os.environ['PATH']}",
                                   JUDGE_LAB_DIR="/nonexistent", **(env or {})))


def test_ansible_lint_passes_the_production_profile():
    result = run(str(BIN / "ansible-lint"), "--profile", "production", "--offline", "-f", "pep8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Profile 'production' was required, and it passed" in result.stderr + result.stdout


@pytest.mark.parametrize("playbook", PLAYBOOKS)
@pytest.mark.parametrize("inventory", ["production", "lab"])
def test_playbooks_parse_against_both_inventories(playbook, inventory):
    result = run(str(BIN / "ansible-playbook"), "-i", f"inventories/{inventory}", "--syntax-check", playbook)
    assert result.returncode == 0, result.stdout + result.stderr


def test_inventories_have_the_groups_the_roles_expect():
    for inventory in ("production", "lab"):
        result = run(str(BIN / "ansible-inventory"), "-i", f"inventories/{inventory}", "--list")
        assert result.returncode == 0, result.stderr
        groups = json.loads(result.stdout)
        for group in ("db", "arbiter", "workers", "home_workers", "production_workers"):
            assert groups.get(group, {}).get("hosts") or groups.get(group, {}).get("children"), (inventory, group)


def test_no_secret_is_committed_in_an_inventory():
    for path in (ANSIBLE / "inventories").rglob("*"):
        if path.is_file() and path.name != "vault.yml.example":
            text = path.read_text()
            assert "password:" not in text.lower() and "judge_worker_credentials" not in text, path
