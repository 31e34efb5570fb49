"""Canaries: known programs with a known verdict, judged through the real path and credited to nobody.

A canary is a submission (``canary_expect`` set) of the sum-of-two-integers program in one language
on the built-in problem ``judge-canary``, whose test data ships with the worker package. It takes
every arrow a real submission takes (acquire or legacy claim, heartbeats, sandbox, outbox, result,
fencing); only the first pass and XP are left out. Two users: the cutover gate (``judgectl canary
run``, pinned to the switched worker) and the arbiter's standing probe (unpinned, one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

from arbiter.store.leases import TERMINAL
from arbiter.store.sqlfiles import Statements

Q = Statements("queries.sql")

EXPECTED = "AC"
PROGRAMS = {
    "c": '#include <stdio.h>\nint main(void) {\n    long long a, b;\n    if (scanf("%lld %lld", &a, &b) != 2) '
         'return 1;\n    printf("%lld\\n", a + b);\n    return 0;\n}\n',
    "cpp": '#include <iostream>\nint main() {\n    long long a, b;\n    if (!(std::cin >> a >> b)) return 1;\n'
           '    std::cout << a + b << "\\n";\n    return 0;\n}\n',
    "python3": "a, b = map(int, input().split())\nprint(a + b)\n",
}


@dataclass(frozen=True)
class Outcome:
    submission_id: int
    status: str
    expected: str
    worker_id: str | None
    via_arbiter: bool | None
    queued_s: float | None
    judging_s: float | None
    total_s: float
    decided_at: float | None  # DB time, Unix seconds
    detail: dict | None

    @property
    def decided(self) -> bool:
        return self.status in TERMINAL

    @property
    def transport(self) -> str | None:
        if self.via_arbiter is None:
            return None
        return "arbiter" if self.via_arbiter else "direct"

    @property
    def as_expected(self) -> bool:
        return self.status == self.expected

    def timings(self) -> str:
        def fmt(value):
            return "-" if value is None else f"{value:.2f}s"
        return f"queued->leased {fmt(self.queued_s)}, leased->decided {fmt(self.judging_s)}, total {fmt(self.total_s)}"


def submit(conn: psycopg.Connection, language: str, pinned_worker: str | None = None) -> int:
    """(none) -> pending: one canary in ``language``, pinned to a worker or anyone's."""
    if language not in PROGRAMS:
        raise ValueError(f"no canary program for language {language!r} (known: {', '.join(sorted(PROGRAMS))})")
    return conn.execute(Q.submit_canary, {"language": language, "source": PROGRAMS[language],
                                          "expect": EXPECTED, "pinned_worker": pinned_worker}).fetchone()[0]


def outcome(conn: psycopg.Connection, submission_id: int) -> Outcome | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.canary_outcome, {"submission_id": submission_id}).fetchone()
    if row is None:
        return None
    decided = row["status"] in TERMINAL
    return Outcome(submission_id=submission_id, status=row["status"], expected=row["canary_expect"],
                   worker_id=row["judged_by"] or row["worker_id"],
                   via_arbiter=row["via_arbiter"] if decided and row["judged_by"] else None,
                   queued_s=row["queued_s"], judging_s=row["judging_s"], total_s=row["total_s"],
                   decided_at=row["decided_at"], detail=row["detail"])


def withdraw(conn: psycopg.Connection, submission_id: int) -> bool:
    """pending -> system_error for a canary nobody took in time (it must not wait for a worker forever)."""
    return conn.execute(Q.withdraw_canary, {"submission_id": submission_id}).fetchone() is not None


def last_probe_success(conn: psycopg.Connection) -> float | None:
    """When (DB time, Unix seconds) a probe canary last got its expected verdict; None if never."""
    return conn.execute(Q.last_probe_success).fetchone()[0]


def open_probes(conn: psycopg.Connection) -> list[int]:
    return [row[0] for row in conn.execute(Q.open_probe_canaries).fetchall()]


def forget_old(conn: psycopg.Connection, keep_secs: float, batch: int = 500) -> int:
    """Decided canaries older than ``keep_secs`` go (each worker's last one stays)."""
    with conn.transaction():
        ids = [row[0] for row in conn.execute(Q.old_canaries, {"keep_secs": keep_secs, "batch": batch}).fetchall()]
        if not ids:
            return 0
        conn.execute(Q.forget_canary_history, {"submission_ids": ids})
        conn.execute(Q.forget_canary_grants, {"submission_ids": ids})  # the janitor's: stage 1 on
        return len(conn.execute(Q.forget_canaries, {"submission_ids": ids}).fetchall())
