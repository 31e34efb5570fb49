"""Wires one arbiter process together: pool, DB health, leader lock, dispatcher, janitor, stuck monitor
(``Runtime``, the dispatching process), or only what lease traffic needs (``LeaseRuntime``, a process
on ``lease_bind``: see arbiter/server/roles.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from arbiter.server import sdnotify
from arbiter.server.credential_cache import CredentialCache, CredentialWatch, LastSeen
from arbiter.server.group_commit import GroupCommit
from arbiter.server.loops.canary_probe import CanaryProbe
from arbiter.server.loops.dispatcher import Dispatcher
from arbiter.server.loops.janitor import Janitor
from arbiter.server.loops.leader import LeaderLock
from arbiter.server.loops.probes import StuckMonitor
from arbiter.server.metrics import METRICS
from arbiter.store import db, leases

log = logging.getLogger("arbiter.runtime")


URGENT_THREADS = 8
# Batches of heartbeats, and of results, written at once (arbiter/server/group_commit.py), each kind
# on up to this many of the urgent lane's threads: the rest is for releases and credential checks.
GROUP_COMMIT_IN_FLIGHT = 3
# A statement's share: heartbeats are small; results carry their detail (up to max_body_bytes each).
HEARTBEATS_PER_BATCH = 500
RESULTS_PER_BATCH = 100
RESULT_BYTES_PER_BATCH = 4 * 1024 * 1024


class _Serving:
    """What every serving process has: the settings, the database's health, the pool and the threads
    that run requests' database calls."""

    def __init__(self, settings):
        self.settings = settings
        self.health = db.DbHealth()
        # Requests' database calls run on threads (the state machine is one synchronous module, shared
        # with the loops and judgectl). Two lanes: heartbeats, results and releases never queue
        # behind a burst of acquires or status reads. The pool has a connection for every thread.
        self.db_threads = ThreadPoolExecutor(settings.db_threads, thread_name_prefix="db")
        self.db_threads_urgent = ThreadPoolExecutor(URGENT_THREADS, thread_name_prefix="db-urgent")
        self.pool = db.make_pool(settings, self.health, max_size=settings.db_threads + URGENT_THREADS + 2)
        # Workers' verified credentials, trusted while judgectl's changes are heard (a session apart).
        self.credentials = CredentialCache(settings.credential_cache_secs)
        self.last_seen = LastSeen()
        self.credential_watch = CredentialWatch(settings, self.credentials, self.last_seen)
        # Heartbeats and results, each kind written in batches (one statement for those that came together).
        self.heartbeat_writes = GroupCommit("heartbeat", self._write_heartbeats, self._on_urgent_thread,
                                            max_batch=HEARTBEATS_PER_BATCH,
                                            max_in_flight=GROUP_COMMIT_IN_FLIGHT)
        self.result_writes = GroupCommit("result", self._write_results, self._on_urgent_thread,
                                         max_batch=RESULTS_PER_BATCH, max_weight=RESULT_BYTES_PER_BATCH,
                                         max_in_flight=GROUP_COMMIT_IN_FLIGHT)

    def _write_heartbeats(self, beats: list[leases.HeartbeatWrite]) -> list[leases.HeartbeatResult]:
        with self.pool.connection() as conn:
            return leases.heartbeats(conn, beats, lease_secs=self.settings.lease_secs)

    def _write_results(self, reports: list[leases.ResultWrite]) -> list[leases.ResultRecord]:
        with self.pool.connection() as conn:
            return leases.record_results(conn, reports)

    def _on_urgent_thread(self, fn):
        return self.db(fn, urgent=True)

    async def db(self, fn, *args, urgent: bool = False):
        """``fn(*args)`` on a database thread; the calling coroutine waits without holding one."""
        executor = self.db_threads_urgent if urgent else self.db_threads
        return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))

    def _close_threads_and_pool(self) -> None:
        self.credential_watch.stop()
        self.db_threads.shutdown(wait=False, cancel_futures=True)
        self.db_threads_urgent.shutdown(wait=False, cancel_futures=True)
        self.pool.close()


class Runtime(_Serving):
    """The dispatching process (on ``bind``): parks acquires, and leads when it holds the leader lock."""

    role = "dispatch"

    def __init__(self, settings, counters=None):
        super().__init__(settings)
        # The lease processes' counters, which /metrics adds to this process's (None: there are none).
        self.counters = counters
        self.notifier = sdnotify.Notifier()
        self.leader = LeaderLock(settings, self.health, on_gain=self._on_gain, on_lose=self._on_lose)
        self.janitor = Janitor(settings, self.health, is_leader=lambda: self.leader.is_leader)
        self.dispatcher = Dispatcher(settings, self.health, is_leader=lambda: self.leader.is_leader,
                                     notifier=self.notifier, on_granted=self.janitor.wake)
        self.monitor = StuckMonitor(settings, self)
        self.probe = CanaryProbe(settings, self.pool, is_leader=lambda: self.leader.is_leader)

    def _on_gain(self) -> None:
        self.janitor.owe_grace()
        self.dispatcher.on_leadership_gained()

    def _on_lose(self) -> None:
        self.dispatcher.cancel_all()

    def start(self) -> "Runtime":
        self.credential_watch.start()
        self.leader.start()
        self.dispatcher.start()
        self.janitor.start()
        self.monitor.start()
        self.probe.start()
        log.info("arbiter started", extra={"db_threads": self.settings.db_threads,
                                                 "max_parked": self.settings.max_parked})
        return self

    def stop(self) -> None:
        self.notifier.stopping()
        self.probe.stop()
        self.monitor.stop()
        self.janitor.stop()
        self.dispatcher.cancel_all()
        self.dispatcher.stop()
        self.leader.stop()
        self._close_threads_and_pool()


class LeaseRuntime(_Serving):
    """A lease-serving process (on ``lease_bind``): heartbeats, results, releases and test data. It
    holds no parked request and runs no loop of the leader's, so any number of them may run: each
    request is one fenced statement that reads nothing from memory. Its counters reach the
    dispatching process's /metrics through ``publisher`` (arbiter/server/metrics.py)."""

    role = "lease"

    def __init__(self, settings, publisher=None):
        super().__init__(settings)
        self.publisher = publisher
        self._stop = threading.Event()
        # Nothing else would find the database back after an outage (the dispatching process's loops
        # do it there): while it is down, requests get 503 at once and this asks every second.
        self._watch = threading.Thread(target=self._watch_database, name="db-health", daemon=True)

    def _check_database(self) -> None:
        try:
            with self.pool.connection() as conn:
                db.ping(conn)
            self.health.mark_up()
        except db.UNAVAILABLE as exc:
            self.health.mark_down(exc)

    def _watch_database(self) -> None:
        while not self._stop.wait(1.0):
            if not self.health.up:
                self._check_database()
            METRICS.set_gauge("arbiter_db_up", 1 if self.health.up else 0)
            if self.publisher is not None:
                self.publisher.publish()

    def start(self) -> "LeaseRuntime":
        # Before the process serves (the app is loaded after this): a process that a worker's lease
        # traffic reaches knows the database answers, instead of saying 503 until its first check.
        self._check_database()
        self._watch.start()
        self.credential_watch.start()
        log.info("lease process started", extra={"db_threads": self.settings.db_threads})
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watch.join(timeout=5)
        if self.publisher is not None:
            self.publisher.publish()  # the last counts of a process that stops
        self._close_threads_and_pool()
