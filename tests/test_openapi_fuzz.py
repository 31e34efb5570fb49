"""schemathesis against the live arbiter's /openapi.json: no 5xx, no response outside the schema."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker


def test_schemathesis_finds_no_server_error_and_no_schema_violation(db, arbiters, tmp_path):
    exe = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
    if not Path(exe).exists():
        pytest.fail("schemathesis is not installed (it is part of the test extras)")
    with db.connect() as conn:
        seed_problem(conn)
        seed_submissions(conn, 20)
        credential = add_worker(conn, "home-1")
    a = arbiters.start(db.dsn, long_poll_max_secs=0.5, max_parked=8)
    result = subprocess.run(
        [exe, "run", f"{a.url}/openapi.json",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_schema_conformance",
         "--max-examples", "40", "--phases", "examples,fuzzing", "--workers", "2",
         "--header", f"Authorization: Bearer {credential}", "--request-timeout", "10",
         "--suppress-health-check", "all"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    # (the coverage phase is left out: it crashes inside schemathesis on CPython 3.11.7, an AST recursion bug)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "passed" in output.lower()
