"""judgectl against a real database: submit, rejudge, status, worker credentials; clear errors."""

import subprocess
import sys

from arbiter.store import credentials, leases


def judgectl(db, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
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
    assert judgectl(db, "worker", "add", "Bad Id", "--kind", "home").returncode == 2
    bad_lang = judgectl(db, "worker", "add", "w1", "--kind", "home", "--languages", "c,cobol")
    assert bad_lang.returncode == 2 and "cobol" in bad_lang.stderr
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
    assert bad.returncode == 2 and "unknown problem 'nope'" in bad.stderr

    not_terminal = judgectl(db, "rejudge", str(sid))
    assert not_terminal.returncode == 1 and "not rejudged" in not_terminal.stderr
    with db.connect() as conn:
        conn.execute("INSERT INTO workers (worker_id, kind, secret_sha256) VALUES ('w', 'home', 'x')")
        lease = leases.acquire(conn, worker_id="w", kind="home", request_id="r1", languages=["python3"],
                               unconfirmed_secs=10, legacy=None)
        leases.record_result(conn, worker_id="w", submission_id=sid, lease_token=lease.lease_token, verdict="WA")
    ok = judgectl(db, "rejudge", str(sid))
    assert ok.returncode == 0 and f"{sid} pending (lease_gen 2)" in ok.stdout


def test_no_dsn_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("JUDGE_DSN", raising=False)
    result = subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "status"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == "judgectl: error: no database given: pass --dsn or set JUDGE_DSN\n"


def test_unreachable_database_is_one_clear_error():
    result = subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", "host=127.0.0.1 port=1 dbname=x",
                             "status"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("judgectl: error: cannot connect to the database")


def _role_name(db, suffix: str) -> str:
    # Roles are cluster-wide and the test server is shared: one name per test database.
    return f"{db.name}_{suffix}"


def test_scram_verifier_math_agrees_with_the_server(db):
    from arbiter.store import dbroles

    role = _role_name(db, "scram")
    with db.connect() as conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(f'CREATE ROLE "{role}" LOGIN PASSWORD \'s3cret-pw\'')
        try:
            stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()[0]
        finally:
            conn.execute(f'DROP ROLE "{role}"')
    assert dbroles.verifier_matches(stored, "s3cret-pw")
    assert not dbroles.verifier_matches(stored, "s3cret-pX")
    assert dbroles.verifier_matches(dbroles.scram_verifier("x"), "x")


def test_dbrole_ensure_and_drop_converge_and_say_what_they_did(db, tmp_path):
    role = _role_name(db, "home1")
    try:
        first = judgectl(db, "dbrole", "ensure", role, "--member-of", "judge_legacy_worker", "--password-file", "-",
                         stdin="pw-one\n")
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"created role {role}"
        assert "pw-one" not in first.stdout + first.stderr
        again = judgectl(db, "dbrole", "ensure", role, "--member-of", "judge_legacy_worker", "--password-file", "-",
                         stdin="pw-one\n")
        assert again.stdout.strip() == f"unchanged role {role}"
        changed = judgectl(db, "dbrole", "ensure", role, "--member-of", "judge_legacy_worker", "--password-file", "-",
                           stdin="pw-two\n")
        assert changed.stdout.strip() == f"updated role {role}"
        with db.connect() as conn:
            assert conn.execute("SELECT pg_has_role(%s, 'judge_legacy_worker', 'MEMBER')", (role,)).fetchone() == (True,)
            stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()[0]
        from arbiter.store import dbroles

        assert dbroles.verifier_matches(stored, "pw-two") and "pw-two" not in stored
        empty = judgectl(db, "dbrole", "ensure", role, "--password-file", "-", stdin="\n")
        assert empty.returncode == 1 and "empty" in empty.stderr
        assert judgectl(db, "dbrole", "drop", role).stdout.strip() == f"dropped role {role}"
        assert judgectl(db, "dbrole", "drop", role).stdout.strip() == f"absent role {role}"
    finally:
        with db.connect() as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_dbrole_ensure_arbiter_grants_every_table(db):
    role = _role_name(db, "arb")
    try:
        first = judgectl(db, "dbrole", "ensure", role, "--arbiter", "--password-file", "-", stdin="pw\n")
        assert first.stdout.strip() == f"created role {role}", first.stderr
        with db.connect() as conn:
            assert conn.execute("SELECT bool_and(has_table_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE')) "
                                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                "WHERE n.nspname = 'public' AND c.relkind = 'r'", (role,)).fetchone() == (True,)
        assert judgectl(db, "dbrole", "ensure", role, "--arbiter", "--password-file", "-",
                        stdin="pw\n").stdout.strip() == f"unchanged role {role}"
    finally:
        with db.connect() as conn:
            conn.execute("SELECT 1")
            for stmt in (f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"',
                         f'REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM "{role}"', f'DROP ROLE IF EXISTS "{role}"'):
                conn.execute(stmt)


def test_worker_ensure_is_idempotent_and_refuses_a_foreign_credential(db):
    cred = credentials.format_credential("home-1", credentials.new_secret())
    assert judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-",
                    stdin=cred).stdout.strip() == "created worker home-1"
    assert judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-",
                    stdin=cred).stdout.strip() == "unchanged worker home-1"
    foreign = credentials.format_credential("home-2", credentials.new_secret())
    refused = judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-", stdin=foreign)
    assert refused.returncode == 1 and "not of the form" in refused.stderr
    with db.connect() as conn:
        assert conn.execute("SELECT secret_sha256 FROM workers WHERE worker_id = 'home-1'").fetchone()[0] == \
            credentials.hash_secret(cred.partition(".")[2])
    rotated = credentials.format_credential("home-1", credentials.new_secret())
    assert judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-",
                    stdin=rotated).stdout.strip().startswith("updated worker home-1: credential rotated")


def test_contest_day_verbs_show_what_happened_and_rejudge_by_status(db, tmp_path):
    """submission show/list, rejudge --status --since, worker list, problem list/show; --dsn after the
    sub-command as before it; no token printed."""
    assert judgectl(db, "problem", "add", "aplusb").returncode == 0
    src = tmp_path / "a.py"
    src.write_text("print(1)\n")
    sids = [int(judgectl(db, "submit", "--user", "bob", "--problem", "aplusb", "--language", "python3",
                         str(src)).stdout) for _ in range(2)]
    with db.connect() as conn:
        conn.execute("INSERT INTO workers (worker_id, kind, secret_sha256, slots) VALUES ('w', 'home', 'x', 2)")
        lease = leases.acquire(conn, worker_id="w", kind="home", request_id="r1", languages=["python3"],
                               unconfirmed_secs=10, legacy=None)
        leases.record_result(conn, worker_id="w", submission_id=lease.submission_id, lease_token=lease.lease_token,
                             verdict="WA", time_ms=12, memory_kb=3456)
        token = str(lease.lease_token)
    wa = lease.submission_id

    # --dsn after the sub-command (the helper passes it before; here only after).
    shown = subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "submission", "show", str(wa), "--dsn", db.dsn],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"submission #{wa} by bob: aplusb in python3" in shown.stdout
    assert "status      WA" in shown.stdout
    assert "#1 gen 1 WA           by w/0 (worker) 12 ms 3456 KiB; leased " in shown.stdout, shown.stdout
    assert token not in shown.stdout and token.replace("-", "") not in shown.stdout

    listed = judgectl(db, "submission", "list", "--status", "WA", "--problem", "aplusb", "--since", "1h")
    assert listed.returncode == 0 and f"#{wa} " in listed.stdout and "1 submission(s)" in listed.stdout, listed.stdout
    assert "0 submission(s)" in judgectl(db, "submission", "list", "--since", "2099-01-01T00:00:00+00:00").stdout
    assert judgectl(db, "submission", "list", "--status", "nonsense").returncode == 2

    rejudged = judgectl(db, "rejudge", "--status", "WA", "--since", "10m")
    assert rejudged.returncode == 0 and rejudged.stdout == f"{wa} pending (lease_gen 2)\n", rejudged.stdout
    nothing = judgectl(db, "rejudge", "--status", "WA", "--since", "10m")
    assert nothing.returncode == 0 and "nothing to rejudge" in nothing.stdout
    for bad in (("--status", "pending"), ("--status", "WA", str(sids[0])), ("--since", "1h"),
                ("--status", "WA", "--since", "yesterday")):
        refused = judgectl(db, "rejudge", *bad)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (bad, refused.stderr)

    workers = judgectl(db, "worker", "list")
    assert workers.returncode == 0 and "w                home       silent" in workers.stdout, workers.stdout
    problems = judgectl(db, "problem", "list")
    assert problems.returncode == 0 and "aplusb" in problems.stdout and "pending 2" in problems.stdout, problems.stdout
    one = judgectl(db, "problem", "show", "aplusb")
    assert one.returncode == 0 and "submissions pending 2" in one.stdout, one.stdout
    assert judgectl(db, "problem", "show", "nope").returncode == 2
    assert judgectl(db, "submission", "show", "999999").returncode == 2


def test_bad_names_and_files_are_one_line_and_exit_2_and_store_nothing(db, tmp_path):
    with db.connect() as conn:
        before = conn.execute("SELECT (SELECT count(*) FROM problems), (SELECT count(*) FROM users), "
                              "(SELECT count(*) FROM submissions)").fetchone()
    ok = tmp_path / "ok.c"
    ok.write_text("int main(void) { return 0; }\n")
    nul = tmp_path / "nul.c"
    nul.write_bytes(b"int main(void) { return 0; }\0\n")
    latin1 = tmp_path / "latin1.c"
    latin1.write_bytes(b"/* \xe9t\xe9 */ int main(void) { return 0; }\n")
    not_tar = tmp_path / "hostname"
    not_tar.write_text("judge-1\n")
    cases = [
        (("problem", "add", "bad slug!"), "bad problem slug"),
        (("problem", "add", "x" * 65), "bad problem slug"),
        (("submit", "--user", "u" * 5000, "--problem", "aplusb", "--language", "c", str(ok)), "bad user name"),
        (("submit", "--user", "tab\there", "--problem", "aplusb", "--language", "c", str(ok)), "bad user name"),
        (("submit", "--user", "bob", "--problem", "aplusb", "--language", "c", str(nul)), "NUL"),
        (("submit", "--user", "bob", "--problem", "aplusb", "--language", "c", str(latin1)), "not UTF-8"),
        (("submit", "--user", "bob", "--problem", "aplusb", "--language", "c", str(tmp_path / "none.c")),
         "cannot read source"),
        (("problem", "data", "aplusb", str(not_tar)), "not a tar archive"),
        (("canary", "run", "--worker", "nosuch", "--timeout", "120"), "no active worker 'nosuch'"),
    ]
    for argv, said in cases:
        result = judgectl(db, *argv)
        assert result.returncode == 2, (argv, result.returncode, result.stderr)
        assert result.stderr.startswith("judgectl: error: ") and result.stderr.count("\n") == 1, (argv, result.stderr)
        assert said in result.stderr, (argv, result.stderr)
        assert "Traceback" not in result.stderr
    with db.connect() as conn:
        assert conn.execute("SELECT (SELECT count(*) FROM problems), (SELECT count(*) FROM users), "
                            "(SELECT count(*) FROM submissions)").fetchone() == before
