"""The words both sides use: verdicts, languages, worker ids (docs/protocol.md).

Defined here once; the arbiter checks what a worker sends against them, the worker's config and judge
use the same ones, and the database's CHECK constraints (sql/migrations) spell the same lists.
"""

from __future__ import annotations

import enum
import re


class VerdictCode(enum.StrEnum):
    """A judgement of one submission. A StrEnum: each member is its own string on the wire and in SQL."""

    AC = "AC"  # accepted
    WA = "WA"  # wrong answer
    TLE = "TLE"  # time limit exceeded
    MLE = "MLE"  # memory limit exceeded
    RE = "RE"  # runtime error (non-zero exit or a signal)
    CE = "CE"  # compile error
    OLE = "OLE"  # output limit exceeded
    system_error = "system_error"  # the judge could not judge it: never the program's doing


VERDICTS = frozenset(code.value for code in VerdictCode)

# The languages a worker can judge and a submission can be in.
LANGUAGES = ("c", "cpp", "python3")

# A worker's id: the first half of its credential ("<worker_id>.<secret>") and its name in logs.
WORKER_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")
