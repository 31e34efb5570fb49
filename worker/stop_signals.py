"""How a worker learns that it must stop: SIGTERM or SIGINT, taken by the main thread in plain code.

Why not a Python signal handler that sets the stop event (as the worker once did):
- CPython runs a handler on the main thread only, and only when that thread runs Python code. A
  process-directed signal may be handed by the kernel to any thread that does not block it; when it
  lands on a slot thread while the main thread sleeps in a join, the C-level handler notes it and
  nobody runs the Python one: the worker judges on and never stops (seen in CI: a two-slot worker
  alive 60 s after its SIGTERM, no "stop requested" line).
- A handler that sets a threading.Event takes the Event's lock; if it interrupts a wait on that same
  Event on the same thread, it waits for itself forever.

So the Python-level handler does nothing. The C-level handler, on whichever thread it runs, writes the
signal's number to a pipe (signal.set_wakeup_fd); the main thread does nothing but watch that pipe
(and its slot threads), and it stops the slots in ordinary code.
"""

from __future__ import annotations

import os
import select
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _noted(signum, frame) -> None:
    """The Python-level handler: nothing. The signal's number is already in the wakeup pipe."""


class StopSignals:
    """Installs itself for SIGTERM and SIGINT (on the main thread); ``wait`` reports one when it came."""

    def __init__(self):
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Every signal with a Python-level handler writes its number here, from the C-level handler.
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, _noted) for signum in STOP_SIGNALS}

    def wait(self, timeout: float) -> signal.Signals | None:
        """The stop signal received (before or within ``timeout`` seconds), or None."""
        ready, _, _ = select.select([self._read], [], [], timeout)
        if not ready:
            return None
        try:
            numbers = os.read(self._read, 512)
        except BlockingIOError:
            return None
        for number in numbers:
            if number in STOP_SIGNALS:
                return signal.Signals(number)
        return None

    def close(self) -> None:
        """Puts back what was there before (in-process tests)."""
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self._read)
        os.close(self._write)
