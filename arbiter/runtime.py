"""Wires one arbiter process together: pool, DB health, leader lock, dispatcher, janitor, stuck monitor."""

from __future__ import annotations

import logging

from . import db, sdnotify
from .canary_probe import CanaryProbe
from .dispatcher import Dispatcher
from .janitor import Janitor
from .leader import LeaderLock
from .probes import StuckMonitor

log = logging.getLogger("arbiter.runtime")


class Runtime:
    def __init__(self, settings):
        self.settings = settings
        self.health = db.DbHealth()
        self.notifier = sdnotify.Notifier()
        self.pool = db.make_pool(settings, self.health, max_size=min(settings.threads, 32))
        self.leader = LeaderLock(settings, self.health, on_gain=self._on_gain, on_lose=self._on_lose)
        self.dispatcher = Dispatcher(settings, self.health, is_leader=lambda: self.leader.is_leader,
                                     notifier=self.notifier)
        self.janitor = Janitor(settings, self.health, is_leader=lambda: self.leader.is_leader)
        self.monitor = StuckMonitor(settings, self)
        self.probe = CanaryProbe(settings, self.pool, is_leader=lambda: self.leader.is_leader)

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
        log.info("arbiter started", extra={"threads": self.settings.threads, "max_parked": self.settings.max_parked})
        return self

    def stop(self) -> None:
        self.notifier.stopping()
        self.probe.stop()
        self.monitor.stop()
        self.janitor.stop()
        self.dispatcher.cancel_all()
        self.dispatcher.stop()
        self.leader.stop()
        self.pool.close()
