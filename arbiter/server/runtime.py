"""Wires one arbiter process together: pool, DB health, leader lock, dispatcher, janitor, stuck monitor."""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor

from arbiter.server import sdnotify
from arbiter.server.loops.canary_probe import CanaryProbe
from arbiter.server.loops.dispatcher import Dispatcher
from arbiter.server.loops.janitor import Janitor
from arbiter.server.loops.leader import LeaderLock
from arbiter.server.loops.probes import StuckMonitor
from arbiter.store import db

log = logging.getLogger("arbiter.runtime")


URGENT_THREADS = 8


class Runtime:
    def __init__(self, settings):
        self.settings = settings
        self.health = db.DbHealth()
        self.notifier = sdnotify.Notifier()
        # Requests' database calls run on threads (the state machine is one synchronous module, shared
        # with the loops and judgectl). Two lanes: heartbeats, results and releases never queue
        # behind a burst of acquires or status reads. The pool has a connection for every thread.
        self.db_threads = ThreadPoolExecutor(settings.db_threads, thread_name_prefix="db")
        self.db_threads_urgent = ThreadPoolExecutor(URGENT_THREADS, thread_name_prefix="db-urgent")
        self.pool = db.make_pool(settings, self.health, max_size=settings.db_threads + URGENT_THREADS + 2)
        self.leader = LeaderLock(settings, self.health, on_gain=self._on_gain, on_lose=self._on_lose)
        self.janitor = Janitor(settings, self.health, is_leader=lambda: self.leader.is_leader)
        self.dispatcher = Dispatcher(settings, self.health, is_leader=lambda: self.leader.is_leader,
                                     notifier=self.notifier, on_granted=self.janitor.wake)
        self.monitor = StuckMonitor(settings, self)
        self.probe = CanaryProbe(settings, self.pool, is_leader=lambda: self.leader.is_leader)

    async def db(self, fn, *args, urgent: bool = False):
        """``fn(*args)`` on a database thread; the calling coroutine waits without holding one."""
        executor = self.db_threads_urgent if urgent else self.db_threads
        return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))

    def _on_gain(self) -> None:
        self.janitor.owe_grace()
        self.dispatcher.on_leadership_gained()

    def _on_lose(self) -> None:
        self.dispatcher.cancel_all()

    def start(self) -> "Runtime":
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
        self.db_threads.shutdown(wait=False, cancel_futures=True)
        self.db_threads_urgent.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
