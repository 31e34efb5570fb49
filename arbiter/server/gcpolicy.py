"""When a serving process (either role) runs Python's full garbage collections, and what each costs.

A full collection walks every object the process holds, all the while its event loop stands still:
with 10,000 workers connected that is 0.1-0.6 s (measured: docs/benchmarks.md (q)). Python starts
one whenever a quarter as many objects as the oldest generation holds have been promoted into it,
and a request in flight while a young collection runs is promoted, garbage or not: under 10,000
busy workers' heartbeats a lease process paused for 0.35 s every few seconds. A request here leaves
no reference cycle behind (arbiter/server/http/app.py ``ClientGone``; tests/test_gcpolicy.py checks
it against a running arbiter), so those collections find almost nothing. Therefore:

- what the process loaded before it serves is frozen (``gc.freeze``): never walked again;
- the young generations are collected as Python does, the full collection every
  ``gc_full_collection_secs`` instead of when the promotions say (0: Python's own rule);
- every collection's pause and the objects it freed are counted (``arbiter_gc_pause_seconds``,
  ``arbiter_gc_collected_objects_total``, by role and generation), so a change that brings cycles
  back shows on /metrics as objects collected.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

from arbiter.server.metrics import METRICS, Metrics

log = logging.getLogger("arbiter.gc")

# gc.set_threshold's third value: the young collections never start a full one on their own.
NO_AUTOMATIC_FULL = 1 << 30
PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class CollectionWatch:
    """``gc.callbacks`` entry: each collection's generation, pause and objects freed, kept until
    ``publish`` moves them to the metrics. A collection can start at any allocation, also while this
    thread holds the metrics' lock: the callback itself takes no lock, it only appends."""

    def __init__(self, role: str):
        self.role = role
        self._started = 0.0
        self._done: list[tuple[int, float, int]] = []

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._done.append((info["generation"], time.perf_counter() - self._started, info["collected"]))

    def publish(self, metrics: Metrics = METRICS) -> None:
        done, self._done = self._done, []  # one swap: an append meanwhile lands in ``done``
        for generation, pause, collected in done:
            metrics.observe("arbiter_gc_pause_seconds", pause, buckets=PAUSE_BUCKETS, role=self.role,
                            generation=str(generation))
            metrics.inc("arbiter_gc_collected_objects_total", collected, role=self.role, generation=str(generation))


class CollectionPolicy:
    """Installed once per serving process, after its app is loaded (arbiter/server/asgi.py)."""

    def __init__(self, role: str, full_collection_secs: float, clock=time.monotonic):
        self.watch = CollectionWatch(role)
        self.full_collection_secs = full_collection_secs
        self.clock = clock
        self._last_full = clock()
        self._saved_threshold = gc.get_threshold()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-policy", daemon=True)

    def install(self, start_thread: bool = True) -> "CollectionPolicy":
        gc.callbacks.append(self.watch)
        gc.freeze()
        if self.full_collection_secs > 0:
            young, older, _ = self._saved_threshold
            gc.set_threshold(young, older, NO_AUTOMATIC_FULL)
        self._last_full = self.clock()
        if start_thread:
            self._thread.start()
        return self

    def uninstall(self) -> None:
        """Python's own rule again (tests)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.watch in gc.callbacks:
            gc.callbacks.remove(self.watch)
        gc.set_threshold(*self._saved_threshold)
        gc.unfreeze()

    def tick(self) -> bool:
        """A full collection if one is due; True if it ran."""
        if self.full_collection_secs <= 0 or self.clock() - self._last_full < self.full_collection_secs:
            return False
        gc.collect()
        self._last_full = self.clock()
        return True

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()
            self.watch.publish()
