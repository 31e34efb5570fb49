"""Fault hooks for the fault-injection tests. Inert unless JUDGE_ARBITER_FAULTS is set.

``JUDGE_ARBITER_FAULTS`` is a comma-separated list of:
  crash_before_commit    SIGKILL ourselves inside the acquire transaction, after the write
  crash_after_commit     SIGKILL ourselves after COMMIT, before the lease reaches the worker
  wedge_file=PATH        the dispatch loop hangs while PATH exists (a stuck arbiter)
"""

from __future__ import annotations

import os
import signal
import time


def _parse(raw: str) -> dict[str, str]:
    faults = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, _, value = item.partition("=")
        faults[key] = value
    return faults


ACTIVE = _parse(os.environ.get("JUDGE_ARBITER_FAULTS", ""))


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def before_commit_hook():
    return _die if "crash_before_commit" in ACTIVE else None


def after_commit() -> None:
    if "crash_after_commit" in ACTIVE:
        _die()


def wedge_point() -> None:
    path = ACTIVE.get("wedge_file")
    while path and os.path.exists(path):
        time.sleep(0.05)
