"""The submission state machine: a thin Python layer over the named statements.

Every function here is one arrow (or one read that explains an arrow that
touched nothing) and runs in its own transaction on a connection opened with
``autocommit=True``. The conditions live in ``sql/queries.sql``; this module
only turns row counts into outcomes.
"""

from __future__ import annotations

import contextlib
import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from arbiter.errors import ArbiterError
from arbiter.protocol import vocabulary
from arbiter.store.sqlfiles import arbiter_statements

Q = arbiter_statements()

TERMINAL = vocabulary.VERDICTS


@dataclass(frozen=True)
class Lease:
    submission_id: int
    lease_token: uuid.UUID
    lease_gen: int
    expires_at: datetime
    problem_id: int
    problem_slug: str
    language: str
    source: str
    attempt: int
    time_limit_ms: int
    memory_limit_kb: int
    comparer: str = "tokens"
    checker_sha256: str | None = None
    data_digest: str | None = None
    # From the submission to this grant (DB time): the queue wait, for a first lease (lease_gen 1).
    queue_wait_secs: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "submission_id": self.submission_id,
            "lease_token": str(self.lease_token),
            "lease_gen": self.lease_gen,
            "expires_at": self.expires_at.isoformat(),
            "problem": {
                "id": self.problem_id,
                "slug": self.problem_slug,
                "time_limit_ms": self.time_limit_ms,
                "memory_limit_kb": self.memory_limit_kb,
                "comparer": self.comparer,
                "checker_sha256": self.checker_sha256,
                "data_digest": self.data_digest,
            },
            "language": self.language,
            "source": self.source,
            "attempt": self.attempt,
        }


def _atomic(conn: psycopg.Connection):
    """Around one statement: on an autocommit connection the statement is its own transaction (no
    BEGIN/COMMIT round trips); on any other, a transaction block of its own."""
    return contextlib.nullcontext() if conn.autocommit else conn.transaction()


def _lease_from_row(row: dict[str, Any]) -> Lease:
    return Lease(
        submission_id=row["submission_id"],
        lease_token=row["lease_token"],
        lease_gen=row["lease_gen"],
        expires_at=row["lease_expires_at"],
        problem_id=row["problem_id"],
        problem_slug=row["problem_slug"],
        language=row["language"],
        source=row["source"],
        attempt=row["judge_attempts"],
        time_limit_ms=row["time_limit_ms"],
        memory_limit_kb=row["memory_limit_kb"],
        comparer=row["comparer"],
        checker_sha256=row["checker_sha256"],
        data_digest=row["data_digest"],
        queue_wait_secs=row.get("queue_wait_secs"),
    )


class WriteOutcome(enum.Enum):
    """What a heartbeat or a result did. Only ACCEPTED and DUPLICATE wrote (or had written) anything."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # this token already decided the submission: answer as the first time
    GONE = "gone"  # the token is not (or no longer) the current lease: 410
    NOT_YOURS = "not_yours"  # the current lease belongs to another worker: 403
    NOT_FOUND = "not_found"  # no such submission: 404


@dataclass(frozen=True)
class HeartbeatResult:
    outcome: WriteOutcome
    expires_at: datetime | None = None


@dataclass(frozen=True)
class ReleaseResult:
    outcome: WriteOutcome
    status: str | None = None  # 'pending', or 'system_error' at the last allowed release


@dataclass(frozen=True)
class ResultRecord:
    outcome: WriteOutcome
    verdict: str | None = None
    seq: int | None = None
    xp_granted: bool = False
    judging_secs: float | None = None  # from the grant to this result (DB time); a first write only


class GrantState(enum.Enum):
    LIVE = "live"
    DEAD = "dead"


def _as_uuid(token: str | uuid.UUID) -> uuid.UUID | None:
    if isinstance(token, uuid.UUID):
        return token
    try:
        return uuid.UUID(token)
    except (ValueError, TypeError, AttributeError):
        return None


# The largest source a submission may have (UTF-8 bytes). A lease carries the source, so this bounds
# every lease body a worker receives; docs/protocol.md, "Limits".
MAX_SOURCE_BYTES = 64 * 1024


class SourceRefused(ArbiterError, ValueError):
    """A source no worker should be handed: too large, or text PostgreSQL cannot store (one line why)."""


def check_source(source: str) -> None:
    try:
        size = len(source.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        raise SourceRefused("the source is not valid UTF-8 text") from None
    if size > MAX_SOURCE_BYTES:
        raise SourceRefused(f"the source is {size} bytes; the limit is {MAX_SOURCE_BYTES} bytes")
    if "\x00" in source:
        raise SourceRefused("the source contains a NUL byte, which cannot be stored")


def submit(conn: psycopg.Connection, user_id: int, problem_id: int, language: str, source: str) -> int:
    """(none) -> pending. Raises SourceRefused (nothing stored) for a source past MAX_SOURCE_BYTES or
    one that is not storable text."""
    check_source(source)
    with conn.transaction():
        row = conn.execute(
            Q.submit, {"user_id": user_id, "problem_id": problem_id, "language": language, "source": source}
        ).fetchone()
    return row[0]


@dataclass(frozen=True)
class LegacyRules:
    """The legacy scheme's yield rules, honoured by the arbiter while judge_dispatch_state exists.

    ``arbiter_workers`` are the workers parked here (the arbiter orders those itself; only legacy
    workers are yielded to); ``fresh_secs`` is how recent a legacy node's poll must be to count as
    idle (the legacy workers' own rule); ``yield_secs`` bounds how long work waits for a legacy turn.
    """

    arbiter_workers: tuple[str, ...]
    fresh_secs: float  # ArbiterSettings.legacy_fresh_secs
    yield_secs: float  # ArbiterSettings.legacy_yield_secs


class LegacyTurn(ArbiterError):
    """By the legacy yield rules a legacy worker goes first; this worker waits for a later round."""


def find_grant(conn: psycopg.Connection, worker_id: str, request_id: str) -> tuple[GrantState, Lease] | None:
    """The lease an earlier acquire with this request_id got (idempotent acquire), or None."""
    return find_grants(conn, [(worker_id, request_id)]).get((worker_id, request_id))


def find_grants(conn: psycopg.Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[GrantState, Lease]]:
    """The leases earlier acquires with these (worker_id, request_id) got, by key, and whether each is
    still live: only those served before have an entry."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(Q.find_lease_grants, {"worker_ids": [w for w, _ in keys],
                                                 "request_ids": [r for _, r in keys]}).fetchall()
    return {(row["worker_id"], row["request_id"]): (GrantState.LIVE if row["live"] else GrantState.DEAD,
                                                    _lease_from_row(row)) for row in rows}


def acquire(
    conn: psycopg.Connection,
    *,
    worker_id: str,
    kind: str,
    request_id: str,
    languages: list[str],
    unconfirmed_secs: float,
    legacy: LegacyRules | None,
    slot: int = 0,
    before_commit=None,
) -> Lease | None:
    """pending -> judging for the oldest claimable submission, or None when there is none.

    With ``legacy`` (stages 1-3) the legacy global lock is taken first and its yield rules are
    honoured: :class:`LegacyTurn` is raised when a legacy worker goes first.
    ``before_commit`` is a test hook called inside the transaction after the
    write (fault injection for "crash before COMMIT").
    """
    with conn.transaction():
        if legacy is not None:
            rr_last_home = conn.execute(Q.legacy_take_global_lock).fetchone()[0]
            if conn.execute(Q.legacy_turn_is_elsewhere, {
                    "worker_id": worker_id, "kind": kind, "rr_last_home": rr_last_home, "arbiter_workers": list(legacy.arbiter_workers),
                    "languages": list(languages), "fresh_secs": legacy.fresh_secs,
                    "yield_secs": legacy.yield_secs}).fetchone()[0]:
                raise LegacyTurn(worker_id)
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                Q.acquire_lease,
                {
                    "worker_id": worker_id,
                    "request_id": request_id,
                    "slot": slot,
                    "languages": list(languages),
                    "unconfirmed_secs": unconfirmed_secs,
                },
            ).fetchone()
        if row is None:
            return None
        if legacy is not None:
            conn.execute(Q.legacy_note_claim, {"worker_id": worker_id, "kind": kind})
        if before_commit is not None:
            before_commit()
    return _lease_from_row(row)


def acquire_many(
    conn: psycopg.Connection,
    *,
    requests: list[tuple[str, str]],
    languages: list[str],
    unconfirmed_secs: float,
    before_commit=None,
    slots: list[int] | None = None,
) -> dict[tuple[str, str], Lease]:
    """pending -> judging for up to ``len(requests)`` submissions in one statement (batch dispatch).

    ``requests`` are (worker_id, request_id) in fairness order (``slots``: each one's judge slot, 0 if
    not given), sharing ``languages``; the oldest
    claimable unpinned work goes to the first of them. Returns the leases by request. Not for
    stages 1-3 (the legacy turn rule is one worker's question; :func:`acquire` answers it).
    A request_id served before raises UniqueViolation and nothing is written."""
    # One statement: atomic by itself, unless a fault hook must run inside its transaction.
    with (conn.transaction() if before_commit is not None else _atomic(conn)):
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(Q.acquire_leases, {
                "worker_ids": [w for w, _ in requests], "request_ids": [r for _, r in requests],
                "slots": list(slots) if slots is not None else [0] * len(requests),
                "languages": list(languages), "k": len(requests), "unconfirmed_secs": unconfirmed_secs,
            }).fetchall()
        if rows and before_commit is not None:
            before_commit()
    return {(row["worker_id"], row["request_id"]): _lease_from_row(row) for row in rows}


def _explain_miss(conn: psycopg.Connection, worker_id: str, submission_id: int, token: uuid.UUID | None) -> WriteOutcome:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q.describe_lease, {"submission_id": submission_id}).fetchone()
    if row is None:
        return WriteOutcome.NOT_FOUND
    if (token is not None and row["status"] == "judging" and row["lease_token"] == token
            and row["worker_id"] != worker_id):
        return WriteOutcome.NOT_YOURS
    return WriteOutcome.GONE


def _fenced_write(conn: psycopg.Connection, statement: str, params: dict[str, Any], *, worker_id: str,
                  submission_id: int, lease_token: str | uuid.UUID) -> tuple[WriteOutcome, tuple | None]:
    """One statement conditional on (submission, token, worker): (ACCEPTED, its row), or the miss
    explained (GONE, NOT_YOURS, NOT_FOUND) with nothing written."""
    token = _as_uuid(lease_token)
    if token is None:
        return _explain_miss(conn, worker_id, submission_id, None), None
    with _atomic(conn):
        row = conn.execute(statement, {**params, "submission_id": submission_id, "lease_token": token,
                                       "worker_id": worker_id}).fetchone()
    if row is not None:
        return WriteOutcome.ACCEPTED, row
    return _explain_miss(conn, worker_id, submission_id, token), None


@dataclass(frozen=True)
class HeartbeatWrite:
    """One heartbeat request: extend this lease, if it is still this worker's."""
    worker_id: str
    submission_id: int
    lease_token: str | uuid.UUID


def heartbeats(conn: psycopg.Connection, beats: list[HeartbeatWrite], *, lease_secs: float) -> list[HeartbeatResult]:
    """judging -> judging for each heartbeat of a batch, one statement; the outcomes in the batch's
    order. A miss is explained as for a heartbeat alone (GONE, NOT_YOURS, NOT_FOUND), nothing written;
    the same heartbeat twice in a batch (a retry) is accepted twice, as it would be one after the other."""
    keyed = _first_of_each(beats)
    extended: dict[tuple[int, uuid.UUID, str], datetime] = {}
    if keyed:
        with _atomic(conn):
            rows = conn.execute(Q.heartbeat_lease, {**_key_arrays(keyed), "lease_secs": lease_secs}).fetchall()
        extended = {(submission_id, token, worker_id): expires_at
                    for submission_id, token, worker_id, expires_at in rows}
    results = []
    for beat in beats:
        key = _key(beat)
        if key in extended:
            results.append(HeartbeatResult(WriteOutcome.ACCEPTED, extended[key]))
        else:
            results.append(HeartbeatResult(_explain_miss(conn, beat.worker_id, beat.submission_id, key and key[1])))
    return results


def heartbeat(
    conn: psycopg.Connection, *, worker_id: str, submission_id: int, lease_token: str | uuid.UUID, lease_secs: float
) -> HeartbeatResult:
    """judging -> judging: confirm (first call) or extend the lease (a batch of one)."""
    return heartbeats(conn, [HeartbeatWrite(worker_id, submission_id, lease_token)], lease_secs=lease_secs)[0]


def _key(write) -> tuple[int, uuid.UUID, str] | None:
    """What a batch statement matches a write by; None for a malformed token (never sent)."""
    token = _as_uuid(write.lease_token)
    return None if token is None else (write.submission_id, token, write.worker_id)


def _first_of_each(writes: list) -> dict[tuple[int, uuid.UUID, str], Any]:
    """The writes a batch statement carries: the first of each key, sorted by submission, the order
    the statement locks their rows in (so that batches never deadlock each other)."""
    first: dict[tuple[int, uuid.UUID, str], Any] = {}
    for write in writes:
        key = _key(write)
        if key is not None:
            first.setdefault(key, write)
    return dict(sorted(first.items(), key=lambda item: item[0][0]))


def _key_arrays(keyed: dict[tuple[int, uuid.UUID, str], Any]) -> dict[str, list]:
    """The keys of a batch as its statement's arrays, in the batch's (lock) order."""
    return {"submission_ids": [key[0] for key in keyed], "lease_tokens": [key[1] for key in keyed],
            "worker_ids": [key[2] for key in keyed]}


def release(
    conn: psycopg.Connection, *, worker_id: str, submission_id: int, lease_token: str | uuid.UUID, reason: str,
    max_releases: int,
) -> ReleaseResult:
    """judging -> pending (or system_error at the max_releases-th time): the holder hands its lease back."""
    outcome, row = _fenced_write(conn, Q.release_lease, {"reason": reason, "max_releases": max_releases},
                                 worker_id=worker_id, submission_id=submission_id, lease_token=lease_token)
    return ReleaseResult(outcome, row[1] if row else None)


@dataclass(frozen=True)
class ResultWrite:
    """One result request: decide this submission under this lease."""
    worker_id: str
    submission_id: int
    lease_token: str | uuid.UUID
    verdict: str
    time_ms: int | None = None
    memory_kb: int | None = None
    detail: dict[str, Any] | None = None
    data_digest: str | None = None


def record_results(conn: psycopg.Connection, reports: list[ResultWrite]) -> list[ResultRecord]:
    """judging -> verdict for each result of a batch, one statement; the records in the batch's order.
    A result that decided nothing is answered as record_result() would: a repeat of a token that
    already decided (DUPLICATE, also a second copy in the same batch), or the miss explained."""
    for report in reports:
        if report.verdict not in vocabulary.VERDICTS:
            raise ValueError(f"unknown verdict {report.verdict!r}")
    keyed = _first_of_each(reports)
    decided: dict[tuple[int, uuid.UUID, str], ResultRecord] = {}
    if keyed:
        sent = list(keyed.values())
        with _atomic(conn):
            rows = conn.execute(Q.record_result, {
                **_key_arrays(keyed), "verdicts": [r.verdict for r in sent],
                "times_ms": [r.time_ms for r in sent], "memories_kb": [r.memory_kb for r in sent],
                "details": [Jsonb(r.detail or {}) for r in sent], "data_digests": [r.data_digest for r in sent],
            }).fetchall()
        for submission_id, token, worker_id, seq, xp_granted, judging_secs in rows:
            key = (submission_id, token, worker_id)
            decided[key] = ResultRecord(WriteOutcome.ACCEPTED, keyed[key].verdict, seq, xp_granted, judging_secs)
    records = []
    for report in reports:
        key = _key(report)
        if key in decided and keyed[key] is report:
            records.append(decided[key])
        else:  # decided nothing: a repeat (also a copy later in this batch), or a miss
            records.append(_result_missed(conn, report, key and key[1]))
    return records


def _result_missed(conn: psycopg.Connection, report: ResultWrite, token: uuid.UUID | None) -> ResultRecord:
    if token is None:
        return ResultRecord(_explain_miss(conn, report.worker_id, report.submission_id, None))
    with conn.cursor(row_factory=dict_row) as cur:
        earlier = cur.execute(Q.find_decision_by_lease,
                              {"submission_id": report.submission_id, "lease_token": token}).fetchone()
    if earlier is not None:
        if earlier["worker_id"] != report.worker_id:
            return ResultRecord(WriteOutcome.NOT_YOURS)
        return ResultRecord(WriteOutcome.DUPLICATE, earlier["verdict"], earlier["seq"])
    return ResultRecord(_explain_miss(conn, report.worker_id, report.submission_id, token))


def record_result(
    conn: psycopg.Connection,
    *,
    worker_id: str,
    submission_id: int,
    lease_token: str | uuid.UUID,
    verdict: str,
    time_ms: int | None = None,
    memory_kb: int | None = None,
    detail: dict[str, Any] | None = None,
    data_digest: str | None = None,
) -> ResultRecord:
    """judging -> verdict under this token (a batch of one); a repeat of the same token answers as the
    first time."""
    return record_results(conn, [ResultWrite(worker_id, submission_id, lease_token, verdict, time_ms, memory_kb,
                                             detail, data_digest)])[0]


@dataclass(frozen=True)
class Reclaimed:
    submission_id: int
    new_status: str
    worker_id: str | None


def reclaim_expired(conn: psycopg.Connection, *, max_attempts: int, batch: int = 500) -> list[Reclaimed]:
    """judging -> pending / system_error for leases whose expiry (DB time) has passed."""
    with _atomic(conn):
        rows = conn.execute(Q.reclaim_expired, {"max_attempts": max_attempts, "batch": batch}).fetchall()
    return [Reclaimed(r[0], r[1], r[2]) for r in rows]


def grant_grace_period(conn: psycopg.Connection, *, grace_secs: float) -> int:
    """Give every live lease at least a full lease period from now (DB time)."""
    with conn.transaction():
        cur = conn.execute(Q.grant_grace_period, {"grace_secs": grace_secs})
        return cur.rowcount


def lease_horizon(conn: psycopg.Connection) -> tuple[datetime, float | None]:
    """The database's now() and the seconds until the first arbiter lease expires (None: none live)."""
    now, secs = conn.execute(Q.lease_horizon).fetchone()
    return now, secs


def database_now(conn: psycopg.Connection) -> datetime:
    return conn.execute(Q.database_now).fetchone()[0]


def rejudge(conn: psycopg.Connection, submission_ids: list[int]) -> list[tuple[int, int]]:
    """terminal -> pending with a new generation; returns (id, new lease_gen) of those that moved."""
    with conn.transaction():
        return [tuple(r) for r in conn.execute(Q.rejudge, {"submission_ids": list(submission_ids)}).fetchall()]


class ClaimableWork:
    """Which languages have pending work, and for whom: one cheap look before a dispatch round.

    Unpinned work is anyone's; a canary pinned to a worker is that worker's alone.
    """

    def __init__(self, rows):
        # rows: (language, pinned_worker) or (language, pinned_worker, how many pending)
        self._pairs = {(row[0], row[1]) for row in rows}
        self._counts = {(row[0], row[1]): (row[2] if len(row) > 2 else 1) for row in rows}

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def _reachable(self, worker_id: str, languages) -> set[tuple[str, str | None]]:
        return {(lang, pinned) for lang, pinned in self._pairs if lang in languages and pinned in (None, worker_id)}

    def languages_for(self, worker_id: str, languages) -> set[str]:
        return {lang for lang, _ in self._reachable(worker_id, languages)}

    def unpinned_count(self, languages) -> int:
        """How much unpinned work (as of the look) is in these languages: a batch needs no more
        requests than that."""
        return sum(n for (lang, pinned), n in self._counts.items()
                   if pinned is None and lang in languages and (lang, pinned) in self._pairs)

    def has_pins(self) -> bool:
        return any(pinned is not None for _, pinned in self._pairs)

    def pinned_for(self, worker_id: str, languages) -> bool:
        """Is a canary pinned to this worker waiting (in one of these languages)?"""
        return any(pinned == worker_id for _, pinned in self._reachable(worker_id, languages))

    def exhausted(self, worker_id: str, languages) -> None:
        """An acquire for this worker found nothing: none of this is left for anyone it would have reached."""
        self._pairs -= self._reachable(worker_id, languages)

    # -- kept from one round to the next (the dispatcher's known work) ------------------------------
    def took(self, language: str) -> None:
        """A lease was granted in ``language``: one fewer of its unpinned work (a pinned canary's
        grant counts here too: an understatement, which the next full look mends)."""
        left = self._counts.get((language, None), 0) - 1
        self._counts[(language, None)] = max(left, 0)
        if left <= 0:
            self._pairs.discard((language, None))

    def hint(self, language: str) -> None:
        """A NOTIFY named ``language``: at least one of its rows is pending (one notification may
        stand for a whole transaction's rows, PostgreSQL folds repeats: at least, not how many)."""
        self._pairs.add((language, None))
        self._counts[(language, None)] = max(self._counts.get((language, None), 0), 1)

    def covers(self, tickets) -> bool:
        """Is there, as far as known, unpinned work for every one of these parked requests?"""
        wanting: dict[tuple[str, ...], int] = {}
        for ticket in tickets:
            wanting[ticket.languages] = wanting.get(ticket.languages, 0) + 1
        return all(self.unpinned_count(languages) >= n for languages, n in wanting.items())

    def with_pins(self, rows) -> "ClaimableWork":
        """The pinned canaries as ``pinned_work`` has them now, in place of those known before."""
        self._pairs = {pair for pair in self._pairs if pair[1] is None} | {(r[0], r[1]) for r in rows}
        self._counts = {pair: n for pair, n in self._counts.items() if pair[1] is None} | {
            (r[0], r[1]): r[2] for r in rows}
        return self


def claimable_work(conn: psycopg.Connection) -> ClaimableWork:
    return ClaimableWork(conn.execute(Q.claimable_work).fetchall())


# Payloads of the submission_pending channel besides a language (the trigger's, for a row that became
# pending): sent by submit_canary for a pinned canary, and by pause_worker/resume_worker.
NOTIFY_PINNED = "pinned"
NOTIFY_PAUSES = "paused"


def pinned_work(conn: psycopg.Connection) -> list[tuple[str, str, int]]:
    """The canaries pinned to a worker that wait, as (language, worker, how many): claimable_work's
    pinned rows alone, which a partial index of the few pending canaries answers."""
    return conn.execute(Q.pinned_work).fetchall()


def claimable_real_languages(conn: psycopg.Connection) -> set[str]:
    """Languages with pending real (non-canary) work: what the stuck alert watches."""
    return {row[0] for row in conn.execute(Q.claimable_real_languages).fetchall()}


def dispatch_tables_present(conn: psycopg.Connection) -> tuple[bool, bool]:
    """(the legacy scheme's tables, the worker pauses' table) are in the schema."""
    legacy, pauses = conn.execute(Q.dispatch_tables_present).fetchone()
    return bool(legacy), bool(pauses)


def worker_pauses_present(conn: psycopg.Connection) -> bool:
    return bool(conn.execute(Q.worker_pauses_present).fetchone()[0])


def paused_workers(conn: psycopg.Connection) -> frozenset[str]:
    return frozenset(r[0] for r in conn.execute(Q.paused_workers).fetchall())
