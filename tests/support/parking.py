"""Leaving the parking lot from a plain thread, as the tests drive it (the arbiter's requests are
coroutines and leave with ``Dispatcher.unpark_async``): the same begin_leave / end_leave steps,
with a blocking wait for a match in progress."""

from __future__ import annotations


def leave(lot, ticket, wait_if_matching: float):
    """Out of the lot now; the ticket's lease if it got one (waiting up to ``wait_if_matching`` for a
    round that is matching it)."""
    done, lease = lot.begin_leave(ticket)
    if done:
        return lease
    ticket.event.wait(wait_if_matching)
    return lot.end_leave(ticket)


def unpark(dispatcher, ticket, wait_if_matching: float = 5.0):
    return leave(dispatcher.lot, ticket, wait_if_matching)
