"""What a serving process (either role) keeps of workers' credentials: the verified ones
(``CredentialCache``), the workers seen through it (``LastSeen``), and the thread that keeps both
true to the database (``CredentialWatch``): it LISTENs for judgectl's changes and writes last_seen_at.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg

from arbiter.server.loops.tickets import WorkerIdentity
from arbiter.store import db, leases

log = logging.getLogger("arbiter.credentials")

# judgectl's statements that change a worker's credential or profile NOTIFY this with its worker_id
# (sql/operator.sql: revoke_worker, rotate_worker_secret, set_worker_profile).
CHANNEL = "worker_credentials"
# last_seen_at of the workers seen through the cache is written this often (one statement for all).
LAST_SEEN_EVERY_SECS = 5.0
# ... in statements of at most this many workers (each holds their rows' locks while it runs).
LAST_SEEN_CHUNK = 500


class CredentialCache:
    """Verified credentials, so that a heartbeat costs one statement (its own), not three.

    Trusted only while this process hears every change judgectl makes to workers (NOTIFY
    worker_credentials, ``CredentialWatch``): a revocation, a rotation or a new
    profile makes it forget that worker at once, and while it does not hear (no session yet, or the
    session lost, when changes may have gone unheard) nothing is cached or used. An entry lives
    ``ttl`` seconds at most, and no longer than the database accepts a rotated-out secret: what is
    changed by other means than judgectl takes that long. Keyed by worker_id and SHA-256 of the
    secret.
    """

    def __init__(self, ttl: float):
        self.ttl = ttl
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, WorkerIdentity]] = {}
        self._heard = False
        # Counts what made entries stale: a verification that read the database before one of these
        # must not put its (maybe stale) answer in.
        self._generation = 0

    def get(self, worker_id: str, digest: str) -> WorkerIdentity | None:
        with self._lock:
            entry = self._entries.get((worker_id, digest)) if self._heard else None
        if entry and entry[0] > time.monotonic():
            return entry[1]
        return None

    def generation(self) -> int:
        """To pass to ``put``: taken before the database is read."""
        with self._lock:
            return self._generation

    def put(self, worker_id: str, digest: str, identity: WorkerIdentity, generation: int,
            valid_secs: float | None = None) -> None:
        """``valid_secs``: how long the database still accepts this secret (a rotated-out one), if bounded."""
        ttl = self.ttl if valid_secs is None else min(self.ttl, valid_secs)
        with self._lock:
            if not self._heard or generation != self._generation:
                return
            if len(self._entries) >= 20_000:
                self._entries.clear()
            self._entries[(worker_id, digest)] = (time.monotonic() + ttl, identity)

    def forget(self, worker_id: str) -> None:
        """judgectl changed this worker: verify it again. (Rare: a scan of the entries will do.)"""
        with self._lock:
            self._generation += 1
            for key in [key for key in self._entries if key[0] == worker_id]:
                del self._entries[key]

    def hearing(self, heard: bool) -> None:
        """Whether changes are heard from now on; either way, what was cached before is dropped."""
        with self._lock:
            self._generation += 1
            self._entries.clear()
            self._heard = heard


class LastSeen:
    """The workers whose credentials came from the cache since the last take: their last_seen_at is
    written for all of them at once every few seconds (CredentialWatch), not once per request."""

    def __init__(self):
        self._lock = threading.Lock()
        self._workers: set[str] = set()

    def mark(self, worker_id: str) -> None:
        with self._lock:
            self._workers.add(worker_id)

    def take(self) -> list[str]:
        with self._lock:
            taken, self._workers = self._workers, set()
        return sorted(taken)


class CredentialWatch:
    """A thread with a session of its own: LISTEN worker_credentials, forget what a NOTIFY names,
    and every LAST_SEEN_EVERY_SECS write last_seen_at for the workers seen through the cache (which
    also proves the session alive while the cache is in use). The cache is trusted from the moment
    the LISTEN is in place until the session fails; then it is dropped, and filled again only once a
    new session listens."""

    def __init__(self, settings, cache: CredentialCache, last_seen: LastSeen, clock=time.monotonic):
        self.settings = settings
        self.cache = cache
        self.last_seen = last_seen
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="credential-watch", daemon=True)

    def start(self) -> "CredentialWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        failed = False
        while not self._stop.is_set():
            conn = None
            try:
                conn = db.connect_session(self.settings)
                conn.execute(f"LISTEN {CHANNEL}")
                self.cache.hearing(True)
                if failed:
                    log.info("listening for worker_credentials again")
                failed = False
                self._listen(conn)
            except (psycopg.Error, OSError) as exc:
                self.cache.hearing(False)
                if not failed:
                    log.warning("cannot listen for worker_credentials: every request's credential is "
                                "verified in the database until it can", extra={"error": str(exc)[:200]})
                failed = True
                self._stop.wait(1.0)
            finally:
                if conn is not None:
                    conn.close()
        self.cache.hearing(False)

    def _listen(self, conn: psycopg.Connection) -> None:
        written = self.clock()
        while not self._stop.is_set():
            for notification in conn.notifies(timeout=1.0):
                self.cache.forget(notification.payload)
            if self.clock() - written >= LAST_SEEN_EVERY_SECS:
                written = self.clock()
                seen = self.last_seen.take()
                for start in range(0, len(seen), LAST_SEEN_CHUNK):
                    conn.execute(leases.Q.touch_workers, {"worker_ids": seen[start:start + LAST_SEEN_CHUNK]})
