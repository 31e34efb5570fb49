"""Test harness: every test talks to a real PostgreSQL server.

One server per session (testcontainers if a Docker engine is reachable,
otherwise a cluster started here); each test gets a fresh database cloned from
a template migrated to the stage it asks for. ``own_cluster`` gives a test a
server of its own that it may stop, kill and restart.
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from arbiter.lab import devcluster
from arbiter.store import migrations

sys.path.insert(0, str(Path(__file__).resolve().parent))

STAGE_VERSIONS = {"empty": 0, **migrations.STAGES}
_counter = itertools.count()


def _template_name(stage: str) -> str:
    return f"judge_tpl_{stage}"


@pytest.fixture(scope="session")
def pg_server():
    base = tempfile.mkdtemp(prefix="judge-test-pg-")
    server = devcluster.shared_server(base)
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            for stage, version in STAGE_VERSIONS.items():
                name = _template_name(stage)
                admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
                admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
                with psycopg.connect(server.dsn(name), autocommit=True) as conn:
                    migrations.migrate(conn, str(version))
                admin.execute(f"ALTER DATABASE \"{name}\" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false")
        yield server
    finally:
        server.destroy()


class Database:
    def __init__(self, server, name: str):
        self.server = server
        self.name = name
        self.dsn = server.dsn(name)

    def connect(self, **kwargs) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn, **kwargs)


def _create_database(server, stage: str) -> Database:
    name = f"judge_t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{_template_name(stage)}"')
    return Database(server, name)


def _drop_database(server, name: str) -> None:
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def make_db(pg_server):
    made: list[Database] = []

    def make(stage: str = "stage4") -> Database:
        database = _create_database(pg_server, stage)
        made.append(database)
        return database

    yield make
    for database in made:
        _drop_database(pg_server, database.name)


@pytest.fixture
def db(make_db) -> Database:
    """A fresh database at the latest stage (stage 4: arbiter only)."""
    return make_db("stage4")


@pytest.fixture
def conn(db):
    with db.connect() as connection:
        yield connection


@pytest.fixture
def own_cluster():
    """A PostgreSQL server of this test's own, migrated to the latest stage; may be stopped and restarted."""
    # Durable settings: this cluster gets crashed, and a crash must not lose committed transactions.
    cluster = devcluster.LocalCluster(fast=False).init().start()
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE judge")
        with psycopg.connect(cluster.dsn("judge"), autocommit=True) as c:
            migrations.migrate(c)
        cluster.judge_dsn = cluster.dsn("judge")
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def arbiters(tmp_path):
    from support.procs import Arbiters

    group = Arbiters(tmp_path)
    yield group
    group.stop_all()


@pytest.fixture
def workers(tmp_path):
    from support.procs import WorkerProcess

    started: list = []

    def start(*args, **kwargs):
        proc = WorkerProcess(tmp_path, *args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
