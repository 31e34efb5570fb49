"""Migration runner: idempotent, reversible stage by stage, refuses gaps and edited files."""

import shutil
import subprocess
import sys

import psycopg
import pytest

from arbiter.store import migrations
from arbiter.store.sqlfiles import sql_root


def judgectl(db, *args):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=60)


def tables(conn):
    return {r[0] for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}


def test_migrate_twice_applies_nothing_the_second_time(make_db):
    db = make_db("empty")
    first = judgectl(db, "migrate")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("applied") == 5
    second = judgectl(db, "migrate")
    assert second.returncode == 0, second.stderr
    assert "applied" not in second.stdout
    assert "nothing to do" in second.stdout


def test_stage1_to_stage4_and_back_to_baseline(make_db):
    db = make_db("empty")
    with db.connect() as conn:
        assert migrations.migrate(conn, "stage1") == ["applied 001_baseline", "applied 002_stage0_canaries",
                                                      "applied 003_stage1_expand"]
        assert {"workers", "lease_grants", "judge_dispatch_state"} <= tables(conn)
        assert migrations.migrate(conn, "stage4") == ["applied 004_stage4_contract", "applied 005_worker_pauses"]
        assert "judge_dispatch_state" not in tables(conn) and "worker_pauses" in tables(conn)
        assert migrations.migrate(conn, "baseline") == ["rolled back 005_worker_pauses",
                                                        "rolled back 004_stage4_contract",
                                                        "rolled back 003_stage1_expand",
                                                        "rolled back 002_stage0_canaries"]
        assert "judge_dispatch_state" in tables(conn) and "workers" not in tables(conn)
        assert conn.execute("SELECT id FROM judge_dispatch_state").fetchall() == [(1,)]
        cols = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'submissions'").fetchall()}
        assert "lease_token" not in cols and "canary_expect" not in cols
        assert migrations.current_version(conn) == 1


def test_stage4_rollback_keeps_data_and_recreates_the_global_lock_row(db):
    with db.connect() as conn:
        conn.execute("INSERT INTO users (name) VALUES ('u')")
        migrations.migrate(conn, "stage1")
        assert conn.execute("SELECT rr_last_home FROM judge_dispatch_state WHERE id = 1").fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM users").fetchone()[0] == 1


def test_tampered_migration_file_is_refused(make_db, tmp_path, monkeypatch):
    db = make_db("stage1")
    copy = tmp_path / "sql"
    shutil.copytree(sql_root(), copy)
    path = copy / "migrations" / "003_stage1_expand.up.sql"
    path.write_text(path.read_text() + "\n-- a harmless-looking edit\n")
    monkeypatch.setattr(migrations, "sql_root", lambda: copy)
    with db.connect() as conn:
        before = conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0]
        with pytest.raises(migrations.MigrationError, match="003_stage1_expand.up.sql was changed"):
            migrations.migrate(conn)
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == before


def test_tampered_file_refused_by_the_cli_with_one_line(make_db):
    db = make_db("stage4")
    with db.connect() as conn:
        conn.execute("UPDATE schema_migrations SET checksum = 'deadbeef' WHERE version = 1")
    result = judgectl(db, "migrate")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "001_baseline.up.sql was changed after it was applied" in result.stderr


def test_ledger_gap_is_refused(make_db):
    db = make_db("stage4")
    with db.connect() as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = 2")
        with pytest.raises(migrations.MigrationError, match="gap"):
            migrations.migrate(conn)


def test_file_gap_is_refused(tmp_path):
    (tmp_path / "001_a.up.sql").write_text("SELECT 1")
    (tmp_path / "001_a.down.sql").write_text("SELECT 1")
    (tmp_path / "003_c.up.sql").write_text("SELECT 1")
    (tmp_path / "003_c.down.sql").write_text("SELECT 1")
    with pytest.raises(migrations.MigrationError, match="expected 002, found 003"):
        migrations.load_migrations(tmp_path)


def test_unknown_target_is_one_clear_error(make_db):
    db = make_db("empty")
    result = judgectl(db, "migrate", "--to", "stage9")
    assert result.returncode == 1
    assert "unknown migration target 'stage9'" in result.stderr
    with db.connect() as conn:
        assert "users" not in tables(conn)


def test_failed_migration_leaves_nothing_half_done(make_db, tmp_path, monkeypatch):
    db = make_db("empty")
    copy = tmp_path / "sql"
    shutil.copytree(sql_root(), copy)
    following = f"{len(migrations.load_migrations()) + 1:03d}"  # the next migration, whatever the last is
    (copy / "migrations" / f"{following}_broken.up.sql").write_text("CREATE TABLE ok_table (x int); SELECT 1/0;")
    (copy / "migrations" / f"{following}_broken.down.sql").write_text("DROP TABLE ok_table;")
    monkeypatch.setattr(migrations, "sql_root", lambda: copy)
    with db.connect() as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            migrations.migrate(conn)
        assert "ok_table" not in tables(conn)
        assert "users" not in tables(conn)  # the whole run is one transaction
