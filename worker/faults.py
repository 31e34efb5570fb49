"""Fault hooks for the fault-injection tests. Inert unless JUDGE_WORKER_FAULTS is set.

  crash_after_outbox_write   SIGKILL ourselves right after a result reached the outbox, before delivery
  term_after_assignment      SIGTERM ourselves right after taking an assignment, before judging it
                             (a stop that lands between a claim and its judging)
  term_between_acquires      SIGTERM ourselves after an acquire came back with nothing, before the
                             next one is sent
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("worker")

ACTIVE = set(filter(None, (p.strip() for p in os.environ.get("JUDGE_WORKER_FAULTS", "").split(","))))


def after_outbox_write() -> None:
    if "crash_after_outbox_write" in ACTIVE:
        os.kill(os.getpid(), signal.SIGKILL)


def after_assignment(stopping) -> None:
    if "term_after_assignment" in ACTIVE:
        _term_and_wait(stopping)


def between_acquires(stopping) -> None:
    if "term_between_acquires" in ACTIVE:
        log.info("fault: SIGTERM between two acquires")
        _term_and_wait(stopping)


def _term_and_wait(stopping) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    stopping.wait(10)  # the main thread takes the signal; the stop has landed when this returns
