"""The arbiter's connection pool (arbiter/store/db.py): a connection back for less than
CHECK_IF_IDLE_SECS is handed out again unchecked (a busy arbiter saves a round trip per request); one
idle longer is checked first, so a connection the server dropped meanwhile (a restart, a
pg_terminate_backend) is replaced, never handed to a request."""

from __future__ import annotations

import time

import psycopg
import pytest

from arbiter.server.config import ArbiterSettings
from arbiter.store import db as store_db


@pytest.fixture
def pool(db):
    settings = ArbiterSettings(dsn=db.dsn)
    made = store_db.make_pool(settings, store_db.DbHealth(), max_size=1)
    made.wait(timeout=10)
    yield made
    made.close()


def _backend_pid(pool) -> int:
    with pool.connection() as conn:
        return conn.info.backend_pid


def _terminate(db, pid: int) -> None:
    with db.connect() as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]


def test_a_connection_idle_longer_than_the_check_interval_is_checked_and_replaced(db, pool):
    pid = _backend_pid(pool)
    _terminate(db, pid)
    time.sleep(store_db.CHECK_IF_IDLE_SECS + 0.2)
    with pool.connection() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.info.backend_pid != pid


def test_a_connection_back_within_the_check_interval_is_handed_out_unchecked(db, pool):
    # The other side of the saving: no check, so a connection killed within the interval reaches the
    # caller, whose error then marks the database down (a request answers 503, the next one works).
    pid = _backend_pid(pool)
    _terminate(db, pid)
    with pytest.raises(psycopg.OperationalError):
        with pool.connection() as conn:
            conn.execute("SELECT 1")
    with pool.connection() as conn:  # the broken one was not put back
        assert conn.execute("SELECT 1").fetchone() == (1,)
