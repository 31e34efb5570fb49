"""systemd's notify protocol (sd_notify(3)): READY=1, STATUS=… and the watchdog, fed by the dispatch loop.

The unit runs gunicorn, whose worker process holds the dispatcher, so the unit
sets ``NotifyAccess=all``: systemd accepts these datagrams from any process of
the service. Without ``NOTIFY_SOCKET`` (not under systemd) every call is a no-op.
The watchdog is fed only where the dispatch loop finishes an iteration, never by
a timer, so a wedged loop (scenario 8) starves it and systemd restarts the service.
"""

from __future__ import annotations

import os
import socket
import threading
import time


class Notifier:
    def __init__(self, environ=os.environ):
        path = environ.get("NOTIFY_SOCKET", "")
        # An abstract socket is written with a leading '@'.
        self._address = "\0" + path[1:] if path.startswith("@") else path
        usec = environ.get("WATCHDOG_USEC", "")
        # Feed at a quarter of the period: one late loop iteration must not cost a restart.
        self._min_gap = int(usec) / 4_000_000 if usec.isdigit() and int(usec) > 0 else 1.0
        self._last_fed = float("-inf")
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def send(self, message: str) -> None:
        if not self._address:
            return
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(message.encode(), self._address)
            except OSError:
                # systemd gone or restarting: nothing to tell; the next call tries a fresh socket.
                if self._sock is not None:
                    self._sock.close()
                self._sock = None

    def ready(self, status: str = "") -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def feed_watchdog(self, status: str = "") -> None:
        now = time.monotonic()
        if now - self._last_fed < self._min_gap:
            return
        self._last_fed = now
        self.send("WATCHDOG=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self.send("STOPPING=1")
