"""The layout's contracts (pyproject.toml, [tool.importlinter]; docs/architecture.md, "The tree").

Worker and arbiter meet at one seam, ``arbiter.protocol``; the worker's legacy transport also uses the
store; nothing in the arbiter imports the worker; the arbiter and the worker each come in layers. The
contracts are checked on this checkout, and each kind of crossing is made on a copy of it to see the
check fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH: the packages of ``root``, not the installed wheel (the copies below differ from it).
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root)), timeout=120)


def test_the_checkout_keeps_every_contract():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and "6 kept" in result.stdout, result.stdout


@pytest.mark.parametrize("module,line,contract", [
    ("worker/judging/judge.py", "from arbiter.server import serving", "The worker imports the arbiter only at the seam"),
    ("worker/slot.py", "from arbiter.store import leases", "The worker imports the arbiter only at the seam"),
    ("arbiter/store/leases.py", "from worker.delivery import outbox", "Nothing in the arbiter imports the worker"),
    ("arbiter/protocol/vocabulary.py", "from arbiter.store import sqlfiles", "The seam (arbiter.protocol) imports nothing"),
    ("arbiter/store/db.py", "from arbiter.server import metrics", "The arbiter in layers"),
    ("arbiter/server/loops/tickets.py", "from arbiter.server.http import worker_api", "The server process in layers"),
    ("worker/sandbox/cgroups.py", "from worker.judging import judge", "The sandbox knows nothing of judging"),
], ids=["worker-imports-the-server", "worker-imports-the-store", "arbiter-imports-the-worker",
        "seam-imports-the-store", "store-imports-the-server", "loops-import-http", "sandbox-imports-judging"])
def test_a_crossing_breaks_its_contract(tmp_path, module, line, contract):
    copy = tmp_path / "repo"
    copy.mkdir()
    for part in ("arbiter", "worker"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy)
    with open(copy / module, "a") as f:
        f.write(f"\n{line}  # the crossing under test\n")

    result = lint_imports(copy)

    assert result.returncode == 1, result.stdout + result.stderr
    broken = [text for text in result.stdout.split("\n\n") if "BROKEN" in text]
    assert any(contract in " ".join(text.split()) for text in broken), result.stdout


def test_a_path_tells_which_process_runs_it():
    """No module at the top of the arbiter package: each lives in the sub-package of its process
    (server, ctl, lab) or layer (store, protocol). Only the package's own errors base stays on top."""
    top = sorted(p.name for p in (REPO / "arbiter").glob("*.py"))
    assert top == ["__init__.py", "errors.py"], top
    packages = sorted(p.name for p in (REPO / "arbiter").iterdir() if (p / "__init__.py").exists())
    assert packages == ["ctl", "lab", "protocol", "server", "store"], packages
    worker_packages = sorted(p.name for p in (REPO / "worker").iterdir() if (p / "__init__.py").exists())
    assert worker_packages == ["delivery", "judging", "sandbox"], worker_packages


def test_nothing_in_the_repository_points_outside_it():
    """The design lives in docs/design.md; no file names a path above the checkout."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = []
    for name in files:
        path = REPO / name
        if name == "tests/test_layout.py" or not path.is_file() or path.suffix in (".tar", ".png", ".gz"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if "../shared" in text or "DESIGN.md" in text:
            outside.append(name)
    assert outside == []


def test_test_helpers_live_in_tests_support():
    """The suite's top level holds its conftest and test modules; every shared helper is in
    tests/support/ (and test-only code is never in arbiter/ or worker/)."""
    helpers = sorted(p.name for p in (REPO / "tests").glob("*.py")
                     if p.name != "conftest.py" and not p.name.startswith("test_"))
    assert helpers == [], helpers
    assert (REPO / "tests" / "support" / "__init__.py").exists()
