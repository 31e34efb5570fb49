"""Database access for the arbiter: a connection pool and a shared "is the DB reachable" flag."""

from __future__ import annotations

import logging
import threading
import time
import weakref

import psycopg
import psycopg_pool

log = logging.getLogger("arbiter.db")

# Errors meaning "the database is not reachable right now" (as opposed to a bug or bad input). A
# read-only session is a standby: the primary moved (a failover or a switchover) and this connection
# was made before, or without target_session_attrs=read-write; the next connection finds the primary.
UNAVAILABLE = (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.errors.AdminShutdown,
               psycopg.errors.ReadOnlySqlTransaction)


def connect_kwargs(settings, session: bool = False) -> dict:
    """libpq settings of the arbiter's connections. ``session``: a connection whose session matters
    (LISTEN, the leader's advisory lock): it goes to ``session_dsn`` when one is set. The others go
    to ``dsn``, which may then be a transaction pooler (PgBouncer): no server-side prepared
    statements (a pooler in transaction mode cannot keep them) and no ``options`` startup
    parameter (it refuses it): the timeouts are then the role's settings (docs/runbook.md)."""
    # A statement that hangs longer than this is a stuck database, not work; sent data left
    # unacknowledged as long is a dead link.
    stuck_ms = int(settings.db_timeout_secs * 1000) * 2
    kwargs = {
        "autocommit": True,
        "connect_timeout": max(1, int(settings.db_timeout_secs)),
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
        # Keepalives probe an idle connection; a statement sent on a dead link is not idle, and the
        # kernel would retransmit it for about 15 minutes while the thread that sent it (the leader's
        # check, a dispatch round) waits. Sent data left unacknowledged this long closes the
        # connection instead: an arbiter cut from the database notices, drops the lock it can no longer
        # use and turns its parked workers away (a slow statement is not affected: it was acknowledged).
        "tcp_user_timeout": stuck_ms,
        "application_name": f"judge-arbiter{('-' + settings.instance_name) if settings.instance_name else ''}",
        "options": f"-c statement_timeout={stuck_ms} -c lock_timeout=2000",
    }
    if session:
        # The server's side of keepalives: an arbiter host that dies without closing its connections
        # (power, a cut link) would hold the leader lock until the server's TCP noticed, two hours by
        # the kernel's default; with these the server drops the session, and the lock, about 6 s after
        # the host's last word and a standby arbiter takes over (docs/operations.md). Tighter than the
        # client's own: a false drop costs only a hand-over of the lock (it decides efficiency, never
        # correctness), a late one costs the site its dispatch.
        kwargs["options"] += " -c tcp_keepalives_idle=3 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3"
        # Keepalives probe only a connection with nothing unacknowledged: cut as the server had just
        # answered (the answer's ACK delayed, or lost with the line), the server would retransmit it for
        # about 15 minutes and keep the lock all that while. Data unacknowledged as long as the
        # keepalives take (6 s) closes the session too.
        kwargs["options"] += " -c tcp_user_timeout=6000"
    if settings.session_dsn and not session:
        del kwargs["options"]
        kwargs["prepare_threshold"] = None
    return kwargs


def connect(settings) -> psycopg.Connection:
    """A connection for statements (``dsn``; possibly through a transaction pooler)."""
    return psycopg.connect(settings.dsn, **connect_kwargs(settings))


def connect_session(settings) -> psycopg.Connection:
    """A connection whose session must stay one server session: LISTEN, the leader lock."""
    return psycopg.connect(settings.session_dsn or settings.dsn, **connect_kwargs(settings, session=True))


def ping(conn: psycopg.Connection) -> None:
    """The cheapest statement the server must answer: is it there?"""
    conn.execute("SELECT 1")


class DbHealth:
    """Whether the database answered lately. Flipped down by any failed call, up by a good one."""

    def __init__(self):
        self._lock = threading.Lock()
        self.up = False
        self.down_since: float | None = time.monotonic()
        self.generation = 0  # bumps on every down -> up transition

    def mark_up(self) -> bool:
        """Returns True when this call ends an outage."""
        with self._lock:
            if self.up:
                return False
            self.up = True
            self.down_since = None
            self.generation += 1
        log.info("database reachable")
        return True

    def mark_down(self, error: BaseException) -> None:
        with self._lock:
            if not self.up:
                return
            self.up = False
            self.down_since = time.monotonic()
        log.warning("database unreachable", extra={"error": type(error).__name__})


# A connection back in the pool for less than this is not checked again when taken out: a busy
# arbiter saves a round trip per request; one idle longer (a database restart may have broken it)
# is checked first.
CHECK_IF_IDLE_SECS = 1.0


class _ArbiterPool(psycopg_pool.ConnectionPool):
    """psycopg's pool, plus when each connection came back: one taken out again within
    CHECK_IF_IDLE_SECS is not checked. The time is noted here, in the thread that returns the
    connection, and not by the pool's ``reset`` callback: the pool runs that on its maintenance
    thread, a second thread hop per statement (about 8 % of a lease process's CPU, measured)."""

    def __init__(self, *args, **kwargs):
        self._returned_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._returned_lock = threading.Lock()
        super().__init__(*args, check=self._check_if_idle, **kwargs)

    def putconn(self, conn: psycopg.Connection) -> None:
        with self._returned_lock:
            self._returned_at[conn] = time.monotonic()
        super().putconn(conn)

    def _check_if_idle(self, conn: psycopg.Connection) -> None:
        with self._returned_lock:
            at = self._returned_at.get(conn)
        if at is None or time.monotonic() - at > CHECK_IF_IDLE_SECS:
            psycopg_pool.ConnectionPool.check_connection(conn)


def make_pool(settings, health: DbHealth, max_size: int) -> psycopg_pool.ConnectionPool:
    pool = _ArbiterPool(
        settings.dsn,
        min_size=1,
        max_size=max_size,
        kwargs=connect_kwargs(settings),
        timeout=settings.db_timeout_secs,
        reconnect_timeout=0,  # keep trying forever; requests meanwhile get 503
        name="arbiter",
        open=False,
    )
    pool.open(wait=False)
    return pool
