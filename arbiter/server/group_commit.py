"""Group commit of a serving process's lease writes: the heartbeats (or the results) that arrive
together are written by one statement (arbiter/store/leases.py ``heartbeats``, ``record_results``).

A write waits for no timer: the first one of an idle moment starts a batch on the next turn of the
event loop (so the requests read in the same turn join it) and is written at once; the ones that come
while ``max_in_flight`` batches are being written wait for the next, which takes all of them (up to
``max_batch`` writes or ``max_weight`` of their bodies). Under light load a batch is one write, as
before; under a contest's load a statement carries tens of them, and the process spends one thread
hop, one round trip and one commit on them all (docs/decisions.md "Group commit").

A batch that fails for any reason but the database's absence (a deadlock PostgreSQL broke, a value it
refused) is written again one write at a time, so only a write that fails alone gets an error: one
bad write never costs the others theirs. The database's absence is every waiting request's 503.

Each write's own lifecycle (``WriteState``): QUEUED until its batch is taken, WRITING while the
statement runs, then ANSWERED (outcome or error set) or, if its request went away meanwhile,
ABANDONED (the write still happens: it was sent; nobody hears the answer).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from arbiter.server.metrics import METRICS
from arbiter.store import db

WriteT = TypeVar("WriteT")  # a write (HeartbeatWrite, ResultWrite)
OutcomeT = TypeVar("OutcomeT")  # its outcome (HeartbeatResult, ResultRecord)


class WriteState(enum.Enum):
    QUEUED = "queued"
    WRITING = "writing"
    ANSWERED = "answered"
    ABANDONED = "abandoned"


@dataclass(eq=False)
class PendingWrite(Generic[WriteT]):
    write: WriteT
    weight: int
    answer: asyncio.Future
    state: WriteState = field(default=WriteState.QUEUED)

    def taken(self) -> None:
        assert self.state is WriteState.QUEUED, self.state
        self.state = WriteState.WRITING

    def cancel(self) -> None:
        """WRITING -> ABANDONED: this process stops; nobody waits for the answer any more."""
        self.answer.cancel()
        self.state = WriteState.ABANDONED

    def settle(self, outcome: Any = None, error: BaseException | None = None) -> None:
        """WRITING -> ANSWERED, or ABANDONED when the request went away (its future was cancelled)."""
        assert self.state is WriteState.WRITING, self.state
        if self.answer.done():
            self.state = WriteState.ABANDONED
            return
        if error is not None:
            self.answer.set_exception(error)
        else:
            self.answer.set_result(outcome)
        self.state = WriteState.ANSWERED


class GroupCommit(Generic[WriteT, OutcomeT]):
    """Writes of one kind, batched. ``write_batch(writes)`` runs a batch (on a database thread, given
    by ``run``) and returns one outcome per write, in order."""

    def __init__(self, kind: str, write_batch: Callable[[list[WriteT]], list[OutcomeT]],
                 run: Callable[[Callable[[], list[OutcomeT]]], Awaitable[list[OutcomeT]]], *, max_batch: int,
                 max_in_flight: int, max_weight: int | None = None):
        """``max_weight``: a bound on the sum of a batch's writes' weights (their bodies' bytes), or None
        for writes that weigh nothing worth bounding (heartbeats)."""
        self.kind = kind
        self._write_batch = write_batch
        self._run = run
        self.max_batch = max_batch
        self.max_weight = max_weight
        self.max_in_flight = max_in_flight
        self._queued: list[PendingWrite[WriteT]] = []
        self._in_flight = 0
        self._starting = False  # a batch's start is scheduled for the loop's next turn
        self._writing: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    async def write(self, write: WriteT, weight: int = 0) -> OutcomeT:
        """The write's outcome, once its batch is written; its error if it failed."""
        loop = asyncio.get_running_loop()
        pending = PendingWrite(write, weight, loop.create_future())
        self._queued.append(pending)
        self._schedule(loop)
        return await pending.answer

    @property
    def queued(self) -> int:
        return len(self._queued)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._starting and self._in_flight < self.max_in_flight and self._queued:
            self._starting = True
            loop.call_soon(self._start_batch)

    def _take(self) -> list[PendingWrite[WriteT]]:
        """The next batch: the oldest queued writes, up to max_batch of them and max_weight of their
        weight (at least one, however heavy)."""
        taken, weight = 0, 0
        for pending in self._queued:
            over = self.max_weight is not None and weight + pending.weight > self.max_weight
            if taken == self.max_batch or (taken and over):
                break
            taken, weight = taken + 1, weight + pending.weight
        batch, self._queued = self._queued[:taken], self._queued[taken:]
        for pending in batch:
            pending.taken()
        return batch

    def _start_batch(self) -> None:
        self._starting = False
        if self._in_flight >= self.max_in_flight or not self._queued:
            return
        batch = self._take()
        self._in_flight += 1
        task = asyncio.ensure_future(self._write(batch))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)
        self._schedule(asyncio.get_running_loop())  # another batch may start beside it

    async def _write(self, batch: list[PendingWrite[WriteT]]) -> None:
        writes = [pending.write for pending in batch]
        try:
            outcomes = await self._run(lambda: self._write_each_if_needed(writes))
        except asyncio.CancelledError:
            for pending in batch:
                pending.cancel()
            raise
        except Exception as error:  # the database away: every request's answer (503)
            for pending in batch:
                pending.settle(error=error)
        else:
            METRICS.inc("arbiter_group_commit_batches_total", kind=self.kind)
            METRICS.inc("arbiter_group_commit_writes_total", len(batch), kind=self.kind)
            for pending, (outcome, error) in zip(batch, outcomes):
                pending.settle(outcome, error)
        finally:
            self._in_flight -= 1
            self._schedule(asyncio.get_running_loop())

    def _write_each_if_needed(self, writes: list[WriteT]) -> list[tuple[OutcomeT | None, BaseException | None]]:
        """On the database thread: the batch as one statement; if that fails (not for the database's
        absence, which fails them all), each write alone, each with its own outcome or error."""
        try:
            return [(outcome, None) for outcome in self._write_batch(writes)]
        except db.UNAVAILABLE:
            raise
        except Exception:
            if len(writes) == 1:
                raise
        METRICS.inc("arbiter_group_commit_split_total", kind=self.kind)
        answers: list[tuple[OutcomeT | None, BaseException | None]] = []
        for write in writes:
            try:
                answers.append((self._write_batch([write])[0], None))
            except db.UNAVAILABLE:
                raise
            except Exception as error:
                answers.append((None, error))
        return answers
