"""Parked acquire requests ("tickets") and their lifecycle: an explicit state machine.

A ticket is one waiting ``POST /v1/acquire``. Two parties touch it: the request (it parks, and
leaves when answered, timed out, or superseded) and the dispatch loop (it matches parked tickets
with work, one acquire transaction each). Every change of state is one named transition of the
ParkingLot below, under its lock:

    park           (new)     -> PARKED      the request waits in the lot
    begin_match    PARKED    -> MATCHING    a round runs the acquire transaction for it
    finish_match   MATCHING  -> LEASED      it got a lease (the request answers with it)
                   MATCHING  -> PARKED      no work for it this round; it waits on
                   MATCHING  -> WITHDRAWN   no work, and its request left meanwhile
    withdraw       PARKED    -> WITHDRAWN   its request left, was superseded by a retry with the
                                            same request_id, leadership was lost, or the arbiter
                                            is stopping (close: nothing parks after that)
    refuse         PARKED    -> WITHDRAWN   its request_id was served before and that lease is gone
                                            (the request answers 410)

A round looks up in lease_grants the request_ids of the newly parked tickets it did not lease
(``checked``), after it matched: a retried request whose earlier lease is live gets that lease
(begin_match, finish_match with it: ``retried``), one whose lease is gone is refused; the others
wait for work. (A retry inside a batch collides with its earlier grant row, and the batch goes one
request at a time: the dispatcher's _match gives it its earlier lease or parks it again.)

LEASED and WITHDRAWN are final. The lot holds only tickets whose request still waits: a ticket
leaves the lot the moment its request leaves, whatever its state, so no place is ever held for a
request that is gone. A request that leaves while its ticket is MATCHING waits a moment for the
transaction; if it cannot wait longer, the ticket is marked abandoned, and a lease granted after
that is simply never confirmed (it expires after unconfirmed_secs, or the worker's retry of the
same request_id gets it back through lease_grants).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from dataclasses import dataclass, field

from arbiter.errors import ArbiterError
from arbiter.server.metrics import METRICS
from arbiter.store import leases

log = logging.getLogger("arbiter.tickets")


class Overloaded(ArbiterError):
    """All parking places are taken; the caller should answer 503 with Retry-After."""


class TooManyParked(ArbiterError):
    """This worker already has its share of parking places; the caller should answer 429."""


class Stopping(ArbiterError):
    """The arbiter is shutting down: nothing parks any more; the caller should answer 503."""


@dataclass(frozen=True)
class WorkerIdentity:
    worker_id: str
    kind: str  # home | production
    languages: tuple[str, ...]
    slots: int = 1  # its judge slots (workers.slots): each may park its share of requests


class TicketState(enum.Enum):
    PARKED = "parked"
    MATCHING = "matching"
    LEASED = "leased"
    WITHDRAWN = "withdrawn"


class TicketSignal:
    """"Look again": set by whichever thread moves the ticket to LEASED or WITHDRAWN (the dispatch
    thread, a request, a signal), awaited by the request's coroutine on the event loop, which holds
    no thread while it waits. Also waitable from a plain thread (unit tests, tools).

    Each wait is a future of its own that ``set`` resolves on the loop: the waiting coroutine runs
    again in the loop's next pass (no task in between), and a wait ended by something else (the
    client gone) leaves nothing behind for the next one."""

    def __init__(self):
        self._flag = threading.Event()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._waiters: list[asyncio.Future] = []

    def set(self) -> None:
        self._flag.set()
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._wake_waiters)
            except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
                pass

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    def is_set(self) -> bool:
        return self._flag.is_set()

    def wait(self, timeout: float | None) -> bool:
        """From a thread that is not the ticket's event loop."""
        return self._flag.wait(timeout)

    async def wait_async(self, timeout: float | None, or_until: asyncio.Future | None = None) -> bool:
        """From the coroutine that created the ticket: costs no thread. Returns whether the signal
        is set; ends also at ``timeout`` or when ``or_until`` is done, whichever comes first."""
        if self._flag.is_set():
            return True
        # A set() from another thread after the check above has its wake-up still to run on this
        # loop, after the append: it resolves this waiter.
        waiter = self._loop.create_future()
        self._waiters.append(waiter)

        def end_wait(_) -> None:
            if not waiter.done():
                waiter.set_result(False)

        if or_until is not None:
            or_until.add_done_callback(end_wait)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            if or_until is not None:
                or_until.remove_done_callback(end_wait)
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return self._flag.is_set()


@dataclass(eq=False)
class Ticket:
    worker: WorkerIdentity
    request_id: str
    languages: tuple[str, ...]
    slot: int = 0  # the worker's judge slot that asks (recorded with the lease)
    parked_at: float = field(default_factory=time.monotonic)
    state: TicketState = TicketState.PARKED
    lease: leases.Lease | None = None
    # Its request has left (or been superseded) while a round was matching it.
    leaving: bool = False
    # Its request stopped waiting for the match: a lease granted now reaches nobody.
    abandoned: bool = False
    # Set whenever the request should look again: LEASED, WITHDRAWN.
    event: TicketSignal = field(default_factory=TicketSignal)
    # A round looked its request_id up in lease_grants (the dispatch loop's own mark).
    checked: bool = False
    # Its lease is the one an earlier request with this request_id got (LEASED by a round's look).
    retried: bool = False
    # Refused: its request_id was served before and that lease is gone.
    earlier_gone: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.worker.worker_id, self.request_id


class ParkingLot:
    """The tickets whose requests still wait, and the transitions above. Thread-safe."""

    def __init__(self, capacity: int, per_worker: int):
        """``per_worker``: parking places of each judge slot of a worker (a worker with N slots gets N times as many)."""
        self.capacity = capacity
        self.per_worker = per_worker
        self._lock = threading.Lock()
        self._tickets: dict[tuple[str, str], Ticket] = {}
        self._per_worker: dict[str, int] = {}
        # Parked requests per (worker, slot) of workers with several judge slots: a slot with one
        # parked is idle, waiting for work (metric arbiter_slot_parked_requests).
        self._per_slot: dict[tuple[str, int], int] = {}
        self._closed = False

    # -- the request's side ------------------------------------------------------
    def park(self, ticket: Ticket) -> None:
        """(new) -> PARKED. A retry of the same request_id takes the earlier ticket's place."""
        with self._lock:
            if self._closed:
                raise Stopping()
            previous = self._tickets.get(ticket.key)
            if previous is not None:
                self._remove(previous)
                self._withdraw(previous)
            elif len(self._tickets) >= self.capacity:
                raise Overloaded()
            elif self._per_worker.get(ticket.worker.worker_id, 0) >= self.per_worker * ticket.worker.slots:
                raise TooManyParked()
            ticket.state = TicketState.PARKED
            self._tickets[ticket.key] = ticket
            self._per_worker[ticket.worker.worker_id] = self._per_worker.get(ticket.worker.worker_id, 0) + 1
            self._count_slot(ticket, +1)
            self._gauge()

    def begin_leave(self, ticket: Ticket) -> tuple[bool, leases.Lease | None]:
        """Out of the lot now. (True, lease or None) when the outcome is known; (False, None) while a
        round is matching it: wait on ``ticket.event``, then call ``end_leave``."""
        with self._lock:
            self._remove(ticket)
            if ticket.state is TicketState.PARKED:
                self._withdraw(ticket)
            if ticket.state is not TicketState.MATCHING:
                return True, (ticket.lease if ticket.state is TicketState.LEASED else None)
            ticket.leaving = True
            return False, None

    def end_leave(self, ticket: Ticket) -> leases.Lease | None:
        """After waiting for the match: its lease, or None; a match still running is abandoned."""
        with self._lock:
            if ticket.state is TicketState.MATCHING:
                ticket.abandoned = True
                return None
            return ticket.lease if ticket.state is TicketState.LEASED else None

    # -- the dispatch loop's side -------------------------------------------------
    def begin_match(self, ticket: Ticket) -> bool:
        """PARKED -> MATCHING; False if the ticket is no longer PARKED (its request left)."""
        with self._lock:
            if ticket.state is not TicketState.PARKED:
                return False
            ticket.state = TicketState.MATCHING
            return True

    def finish_match(self, ticket: Ticket, lease: leases.Lease | None) -> None:
        """MATCHING -> LEASED | PARKED | WITHDRAWN."""
        with self._lock:
            if ticket.state is not TicketState.MATCHING:
                raise RuntimeError(f"finish_match on a {ticket.state.value} ticket")
            if lease is not None:
                ticket.lease = lease
                ticket.state = TicketState.LEASED
                ticket.event.set()
                if ticket.abandoned:
                    METRICS.inc("arbiter_leases_unanswered_total")
                    log.warning("lease granted to a request that has left; it expires unconfirmed unless the "
                                "worker repeats the request_id",
                                extra={"submission_id": lease.submission_id, "worker_id": ticket.worker.worker_id})
            elif ticket.leaving:
                ticket.state = TicketState.WITHDRAWN
                ticket.event.set()
            else:
                ticket.state = TicketState.PARKED

    def refuse(self, ticket: Ticket) -> None:
        """PARKED -> WITHDRAWN, flagged ``earlier_gone``: its request_id was served before, and that
        lease is no longer live. Nothing for a ticket that is no longer PARKED (its request left)."""
        with self._lock:
            if ticket.state is TicketState.PARKED:
                ticket.earlier_gone = True
                self._withdraw(ticket)

    def withdraw_all(self) -> None:
        """Leadership lost: every waiting request is answered now (it will retry elsewhere or later).
        A ticket being matched ends when its transaction does, LEASED or WITHDRAWN."""
        with self._lock:
            for ticket in list(self._tickets.values()):
                self._remove(ticket)
                self._withdraw(ticket)
            self._gauge()

    def close(self) -> None:
        """The arbiter is stopping: every waiting request is answered now, and nothing parks again."""
        with self._lock:
            self._closed = True
        self.withdraw_all()

    # -- looking ---------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def parked(self) -> list[Ticket]:
        """The tickets a round may match, oldest first."""
        with self._lock:
            return [t for t in self._tickets.values() if t.state is TicketState.PARKED]

    def __len__(self) -> int:
        with self._lock:
            return len(self._tickets)

    def __contains__(self, ticket: Ticket) -> bool:
        with self._lock:
            return self._tickets.get(ticket.key) is ticket

    # -- under the lock ------------------------------------------------------------------
    def _withdraw(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.PARKED:
            ticket.state = TicketState.WITHDRAWN
            ticket.event.set()
        elif ticket.state is TicketState.MATCHING:
            ticket.leaving = True

    def _remove(self, ticket: Ticket) -> None:
        if self._tickets.get(ticket.key) is ticket:
            del self._tickets[ticket.key]
            left = self._per_worker[ticket.worker.worker_id] - 1
            if left:
                self._per_worker[ticket.worker.worker_id] = left
            else:
                del self._per_worker[ticket.worker.worker_id]
            self._count_slot(ticket, -1)
            self._gauge()

    def _count_slot(self, ticket: Ticket, change: int) -> None:
        if ticket.worker.slots == 1:
            return  # one series per parked worker would swamp /metrics at contest scale
        key = (ticket.worker.worker_id, ticket.slot)
        count = self._per_slot.get(key, 0) + change
        self._per_slot[key] = count
        METRICS.set_gauge("arbiter_slot_parked_requests", count, worker=key[0], slot=str(key[1]))

    def _gauge(self) -> None:
        METRICS.set_gauge("arbiter_parked_requests", len(self._tickets))
