"""judgectl against a real database: submit, rejudge, status, worker credentials; clear errors."""

import subprocess
import sys

from arbiter import credentials, leases


def judgectl(db, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=60, input=stdin)


def test_worker_add_prints_credential_once_and_stores_only_its_hash(db, tmp_path):
    result = judgectl(db, "worker", "add", "home-1", "--kind", "home")
    assert result.returncode == 0, result.stderr
    credential = result.stdout.strip()
    worker_id, secret = credentials.parse_credential(credential)
    assert worker_id == "home-1"
    with db.connect() as conn:
        stored = conn.execute("SELECT secret_sha256 FROM workers WHERE worker_id = 'home-1'").fetchone()[0]
        assert secret not in stored and stored == credentials.hash_secret(secret)
    again = judgectl(db, "worker", "add", "home-1", "--kind", "home")
    assert again.returncode == 1 and "already exists" in again.stderr

    path = tmp_path / "cred"
    result = judgectl(db, "worker", "add", "prod-1", "--kind", "production", "--credential-file", str(path))
    assert result.returncode == 0
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert "prod-1." in path.read_text()
    assert path.read_text().strip() not in result.stdout

    assert judgectl(db, "worker", "revoke", "home-1").returncode == 0
    second = judgectl(db, "worker", "revoke", "home-1")
    assert second.returncode == 1 and "no active worker" in second.stderr


def test_bad_worker_input_changes_nothing(db):
    assert judgectl(db, "worker", "add", "Bad Id", "--kind", "home").returncode == 1
    bad_lang = judgectl(db, "worker", "add", "w1", "--kind", "home", "--languages", "c,cobol")
    assert bad_lang.returncode == 1 and "cobol" in bad_lang.stderr
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM workers").fetchone()[0] == 0


def test_submit_status_rejudge(db, tmp_path):
    assert judgectl(db, "problem", "add", "aplusb", "--xp", "5").returncode == 0
    src = tmp_path / "a.py"
    src.write_text("print(1)\n")
    result = judgectl(db, "submit", "--user", "bob", "--problem", "aplusb", "--language", "python3", str(src))
    assert result.returncode == 0, result.stderr
    sid = int(result.stdout)
    status = judgectl(db, "status")
    assert status.returncode == 0 and "pending" in status.stdout

    bad = judgectl(db, "submit", "--user", "bob", "--problem", "nope", "--language", "python3", str(src))
    assert bad.returncode == 1 and "unknown problem 'nope'" in bad.stderr

    not_terminal = judgectl(db, "rejudge", str(sid))
    assert not_terminal.returncode == 1 and "not rejudged" in not_terminal.stderr
    with db.connect() as conn:
        conn.execute("INSERT INTO workers (worker_id, kind, secret_sha256) VALUES ('w', 'home', 'x')")
        lease = leases.acquire(conn, worker_id="w", kind="home", request_id="r1", languages=["python3"],
                               unconfirmed_secs=10, honour_legacy_lock=False)
        leases.record_result(conn, worker_id="w", submission_id=sid, lease_token=lease.lease_token, verdict="WA")
    ok = judgectl(db, "rejudge", str(sid))
    assert ok.returncode == 0 and f"{sid} pending (lease_gen 2)" in ok.stdout


def test_no_dsn_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("JUDGE_DSN", raising=False)
    result = subprocess.run([sys.executable, "-m", "arbiter.ctl", "status"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == "judgectl: error: no database given: pass --dsn or set JUDGE_DSN\n"


def test_unreachable_database_is_one_clear_error():
    result = subprocess.run([sys.executable, "-m", "arbiter.ctl", "--dsn", "host=127.0.0.1 port=1 dbname=x",
                             "status"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("judgectl: error: cannot connect to the database")
