"""Fault hooks for the fault-injection tests. Inert unless JUDGE_WORKER_FAULTS is set.

  crash_after_outbox_write   SIGKILL ourselves right after a result reached the outbox, before delivery
  term_after_assignment      SIGTERM ourselves right after taking an assignment, before judging it
                             (a stop that lands between a claim and its judging)
"""

from __future__ import annotations

import os
import signal

ACTIVE = set(filter(None, (p.strip() for p in os.environ.get("JUDGE_WORKER_FAULTS", "").split(","))))


def after_outbox_write() -> None:
    if "crash_after_outbox_write" in ACTIVE:
        os.kill(os.getpid(), signal.SIGKILL)


def after_assignment() -> None:
    if "term_after_assignment" in ACTIVE:
        os.kill(os.getpid(), signal.SIGTERM)
