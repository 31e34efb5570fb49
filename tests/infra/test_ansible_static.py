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
PLAYBOOKS = ["site.yml", "stage1.yml", "stage2.yml", "stage3.yml", "stage4.yml", "rollback.yml", "preflight.yml",
             "upgrade.yml", "db_ha.yml", "db_switchover.yml", "monitoring.yml"]

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
        for group in ("db", "etcd", "arbiter", "workers", "home_workers", "production_workers"):
            assert groups.get(group, {}).get("hosts") or groups.get(group, {}).get("children"), (inventory, group)


def test_no_secret_is_committed_in_an_inventory():
    for path in (ANSIBLE / "inventories").rglob("*"):
        if path.is_file() and path.name != "vault.yml.example":
            text = path.read_text()
            assert "password:" not in text.lower() and "judge_worker_credentials" not in text, path


# -- Self-contained roles --------------------------------------------------------------------------------
ROLES = sorted(p.name for p in (ANSIBLE / "roles").iterdir() if p.is_dir())
# What a role may read without declaring it: Ansible's own names, the groups, and what the role itself
# registers or sets as a fact while it runs.
ANSIBLE_NAMES = {"ansible_check_mode", "ansible_managed", "ansible_host", "ansible_playbook_python",
                 "ansible_failed_result", "inventory_hostname", "groups", "hostvars", "playbook_dir", "item", "omit"}


def _role_files(role: str) -> list[Path]:
    base = ANSIBLE / "roles" / role
    return [p for d in ("tasks", "handlers", "templates") for p in sorted((base / d).glob("*")) if p.is_file()]


def _produced_by(role: str) -> set[str]:
    import re

    names = set()
    for path in _role_files(role):
        text = path.read_text()
        names |= set(re.findall(r"^\s*register:\s*(\w+)", text, re.M))
        names |= set(re.findall(r"set_fact:\s*\n\s+(\w+):", text))
    return names


@pytest.mark.parametrize("role", ROLES)
def test_a_role_reads_only_variables_of_its_own_prefix_all_declared(role):
    """Every variable the role's tasks, handlers and templates use carries the role's prefix and is
    declared in its defaults/ and in each entry point of meta/argument_specs.yml (or is one the role
    registers itself, or Ansible's own)."""
    import re

    import yaml

    base = ANSIBLE / "roles" / role
    defaults = set(yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {})
    specs = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    produced = _produced_by(role)
    used = set()
    for path in _role_files(role):
        for expr in re.findall(r"{{(.*?)}}|{%(.*?)%}|(?:when|until|changed_when|failed_when|that):\s*(.+)",
                               path.read_text()):
            used |= set(re.findall(r"\b(judge_\w+)\b", " ".join(expr)))
    # Role names (include_role: name: judge_common) and other roles' inputs passed as include vars.
    used -= set(ROLES) | {"judge_legacy_worker"}
    other_roles_inputs = {name for name in used if any(name.startswith(r + "_") for r in ROLES if r != role)}
    foreign = {name for name in used - produced - other_roles_inputs if not name.startswith(role + "_")}
    assert foreign == set(), f"{role} reads variables of no prefix of its own: {sorted(foreign)}"
    undeclared = sorted(name for name in used - produced - other_roles_inputs if name not in defaults)
    assert undeclared == [], f"{role} reads variables its defaults do not declare: {undeclared}"
    assert set(specs["main"]["options"]) == defaults, set(specs["main"]["options"]) ^ defaults
    for entry, spec in specs.items():  # an entry point that runs on its own may declare less
        assert set(spec["options"]) <= defaults, (role, entry, set(spec["options"]) - defaults)


@pytest.mark.parametrize("role", ROLES)
def test_nothing_a_role_registers_overwrites_an_input(role):
    """A registered result or a fact named like an input replaces the input for the rest of the play
    (judge_common once registered judge_common_venv, the virtualenv's path, and the next task ran
    '{changed: True, ...}/bin/pip')."""
    import yaml

    inputs = set(yaml.safe_load((ANSIBLE / "roles" / role / "defaults" / "main.yml").read_text()) or {})
    inputs |= set(yaml.safe_load((ANSIBLE / "group_vars" / "all.yml").read_text()))
    assert _produced_by(role) & inputs == set()


def _jinja(**kwargs):
    """Jinja as Ansible has it, for what these templates use: strict, with Ansible's dirname filter."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, **kwargs)
    env.filters["dirname"] = os.path.dirname
    return env


def _defaults(role: str) -> dict:
    """The role's defaults with their templates resolved against each other."""
    import jinja2
    import yaml

    values = yaml.safe_load((ANSIBLE / "roles" / role / "defaults" / "main.yml").read_text())
    env = _jinja()
    for _ in range(5):
        for key, value in values.items():
            if isinstance(value, str) and "{{" in value:
                try:
                    values[key] = env.from_string(value).render(**values)
                except jinja2.TemplateError:  # depends on inventory facts (playbook_dir, ansible_host)
                    pass
    return values


@pytest.mark.parametrize("role,template,reference", [
    ("judge_arbiter", "judge-arbiter.service.j2", "systemd/judge-arbiter.service"),
    ("judge_worker", "judge-worker-supervisord.service.j2", "systemd/judge-worker-supervisord.service"),
    ("judge_worker", "judge-worker.conf.j2", "worker/supervisor/judge-worker.conf"),
])
def test_a_role_renders_the_reference_file_with_its_defaults(role, template, reference):
    """The units and the worker's supervisor program are templates inside their roles (they follow the
    role's paths); systemd/ and worker/supervisor/ keep the reference for hand installs and for
    systemd-analyze, and the two cannot drift apart."""
    import jinja2

    env = _jinja(loader=jinja2.FileSystemLoader(ANSIBLE / "roles" / role / "templates"))
    rendered = env.get_template(template).render(**_defaults(role))
    assert rendered == (ANSIBLE.parent / reference).read_text()


def test_a_role_file_never_comes_from_outside_its_role():
    """No task copies a file from the checkout (judge_repo_root) or runs a script by its path in it."""
    for role in ROLES:
        for path in _role_files(role):
            text = path.read_text()
            assert "judge_repo_root" not in text and "playbook_dir" not in text, path
