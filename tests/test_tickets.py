"""The parked-ticket state machine (arbiter/server/loops/tickets.py), transition by transition, and the
interleavings of a request leaving, a retry, a match and a leadership loss.

The first part needs nothing but the lot; the last part runs the real dispatcher in this process
(no gunicorn) against a real database, with its acquire transaction held open at will."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.parking import leave, unpark
from support.procs import add_worker, wait_for

from arbiter.server import faults
from arbiter.server.config import ArbiterSettings
from arbiter.server.loops.dispatcher import Dispatcher
from arbiter.server.loops.tickets import Overloaded, ParkingLot, Ticket, TicketState, TooManyParked, WorkerIdentity
from arbiter.store.db import DbHealth

HOME1 = WorkerIdentity("home-1", "home", ("python3",))
HOME2 = WorkerIdentity("home-2", "home", ("python3",))
class _Lease:  # what a lease holds does not matter to the lot
    submission_id = 1


LEASE = _Lease()


def ticket(worker=HOME1, request_id="r1") -> Ticket:
    return Ticket(worker=worker, request_id=request_id, languages=worker.languages)


def test_parked_matched_leased_then_the_request_takes_the_lease():
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    assert t.state is TicketState.PARKED and lot.parked() == [t]
    assert lot.begin_match(t) and t.state is TicketState.MATCHING
    assert lot.parked() == [], "a ticket being matched is not offered to the round again"
    lot.finish_match(t, LEASE)
    assert t.state is TicketState.LEASED and t.event.is_set()
    assert leave(lot, t, 0) is LEASE
    assert len(lot) == 0


def test_no_work_puts_the_ticket_back_to_wait():
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    assert lot.begin_match(t)
    lot.finish_match(t, None)
    assert t.state is TicketState.PARKED and lot.parked() == [t] and not t.event.is_set()


def test_a_request_that_leaves_is_withdrawn_and_never_matched_later():
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    assert leave(lot, t, 0) is None
    assert t.state is TicketState.WITHDRAWN and len(lot) == 0
    assert not lot.begin_match(t), "a round holding an old snapshot must not match it"


def test_a_request_leaving_during_the_match_gets_the_lease_if_it_comes_in_time():
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    assert lot.begin_match(t)
    threading.Timer(0.1, lot.finish_match, (t, LEASE)).start()
    assert leave(lot, t, 5.0) is LEASE
    assert t.state is TicketState.LEASED and not t.abandoned and len(lot) == 0


def test_a_request_that_cannot_wait_for_its_match_leaves_no_place_taken():
    """Formerly: unpark gave up after 5 s and the ticket stayed in the lot for good."""
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    assert lot.begin_match(t)
    assert leave(lot, t, 0.01) is None
    assert len(lot) == 0 and t.abandoned
    lot.finish_match(t, None)
    assert t.state is TicketState.WITHDRAWN, "never back to PARKED once its request left"
    assert lot.parked() == [] and len(lot) == 0


def test_a_lease_granted_after_the_request_left_is_final_and_flagged():
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    lot.begin_match(t)
    leave(lot, t, 0.01)
    lot.finish_match(t, LEASE)
    assert t.state is TicketState.LEASED and t.abandoned and len(lot) == 0


def test_a_retry_takes_the_place_of_a_parked_ticket():
    lot, first, retry = ParkingLot(1, 1), ticket(), ticket()
    lot.park(first)
    lot.park(retry)  # the lot is full (capacity 1, one per worker): a retry still fits
    assert first.state is TicketState.WITHDRAWN and first.event.is_set()
    assert lot.parked() == [retry] and len(lot) == 1
    assert not lot.begin_match(first)


def test_a_retry_during_the_match_does_not_undo_the_match():
    """Formerly: park marked the matching ticket cancelled and the match then overwrote that."""
    lot, first, retry = ParkingLot(10, 4), ticket(), ticket()
    lot.park(first)
    assert lot.begin_match(first)
    lot.park(retry)
    assert first.state is TicketState.MATCHING and first.leaving
    assert lot.parked() == [retry]
    lot.finish_match(first, LEASE)
    assert first.state is TicketState.LEASED and first.event.is_set()
    assert retry.state is TicketState.PARKED and lot.parked() == [retry]
    # and when the match found nothing, the superseded ticket ends, it does not wait on
    first2, retry2 = ticket(request_id="r2"), ticket(request_id="r2")
    lot.park(first2)
    lot.begin_match(first2)
    lot.park(retry2)
    lot.finish_match(first2, None)
    assert first2.state is TicketState.WITHDRAWN and first2.event.is_set()
    assert {t.request_id for t in lot.parked()} == {"r1", "r2"} and retry2 in lot


def test_leadership_lost_answers_every_waiting_request_and_a_match_in_flight_ends():
    lot, waiting, matched, unmatched = ParkingLot(10, 4), ticket(), ticket(request_id="m"), ticket(HOME2, "n")
    for t in (waiting, matched, unmatched):
        lot.park(t)
    lot.begin_match(matched)
    lot.begin_match(unmatched)
    lot.withdraw_all()
    assert len(lot) == 0 and lot.parked() == []
    assert waiting.state is TicketState.WITHDRAWN and waiting.event.is_set()
    lot.finish_match(matched, LEASE)
    lot.finish_match(unmatched, None)
    assert matched.state is TicketState.LEASED and unmatched.state is TicketState.WITHDRAWN
    assert leave(lot, matched, 0) is LEASE and leave(lot, unmatched, 0) is None


def test_a_refused_retry_is_withdrawn_flagged_and_a_ticket_no_longer_parked_is_left_alone():
    lot = ParkingLot(10, 4)
    t = ticket(HOME1, "r")
    lot.park(t)
    lot.refuse(t)
    assert t.state is TicketState.WITHDRAWN and t.earlier_gone and t.event.is_set()
    assert lot.begin_leave(t) == (True, None)
    matching = ticket(HOME1, "s")
    lot.park(matching)
    assert lot.begin_match(matching)
    lot.refuse(matching)  # a round's own match in flight: refuse is for parked tickets only
    assert matching.state is TicketState.MATCHING and not matching.earlier_gone


def test_capacity_and_the_per_worker_share():
    lot = ParkingLot(3, 2)
    lot.park(ticket(HOME1, "a"))
    lot.park(ticket(HOME1, "b"))
    with pytest.raises(TooManyParked):
        lot.park(ticket(HOME1, "c"))
    lot.park(ticket(HOME2, "a"))
    with pytest.raises(Overloaded):
        lot.park(ticket(HOME2, "b"))
    leaving = lot.parked()[0]
    leave(lot, leaving, 0)
    lot.park(ticket(HOME1, "c"))  # a place freed by a request that left is free again
    assert len(lot) == 3


def test_finish_match_without_begin_is_a_bug_not_a_silent_change():
    lot, t = ParkingLot(10, 4), ticket()
    lot.park(t)
    with pytest.raises(RuntimeError):
        lot.finish_match(t, None)


# -- the request's side as the server runs it: a coroutine on an event loop ---------------------------
def _on_a_loop(coroutine_fn):
    """Run ``coroutine_fn()`` on a fresh event loop, with a ticker that proves the loop never blocks."""
    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        try:
            result = await coroutine_fn()
        finally:
            stop.set()
            await tick_task
        return result, ticks

    return asyncio.run(main())


# The coroutine tests below share a shape (park, signal from another thread, wait on the loop, count
# its ticks) on purpose: each spells out one interleaving whole, so a failure names its own steps.
def test_a_parked_coroutine_is_woken_by_a_lease_set_from_another_thread():
    lot = ParkingLot(10, 4)

    async def request():
        t = ticket()  # made on the loop: its signal wakes this loop
        lot.park(t)

        def dispatch_thread():
            assert lot.begin_match(t)
            lot.finish_match(t, LEASE)

        threading.Timer(0.2, dispatch_thread).start()
        t0 = time.monotonic()
        woke = await t.event.wait_async(5.0)
        waited = time.monotonic() - t0
        done, lease = lot.begin_leave(t)
        return woke, waited, done, lease

    (woke, waited, done, lease), ticks = _on_a_loop(request)
    assert woke and done and lease is LEASE and len(lot) == 0
    assert waited < 2.5, "woken by the wait's timeout (5 s), not by the signal"
    assert ticks >= 10, "the loop was blocked while the request waited"


def test_a_coroutine_leaving_during_its_match_waits_without_blocking_the_loop_then_takes_the_lease():
    lot = ParkingLot(10, 4)

    async def request():
        t = ticket()
        lot.park(t)
        assert lot.begin_match(t)  # a round is running its acquire transaction
        threading.Timer(0.3, lot.finish_match, (t, LEASE)).start()
        done, lease = lot.begin_leave(t)  # its long-poll ran out meanwhile
        assert not done and lease is None and len(lot) == 0, "out of the lot at once, outcome pending"
        t0 = time.monotonic()
        await t.event.wait_async(5.0)
        return lot.end_leave(t), t, time.monotonic() - t0

    (lease, t, waited), ticks = _on_a_loop(request)
    assert lease is LEASE and t.state is TicketState.LEASED and not t.abandoned
    assert waited < 2.5, "woken by the wait's timeout (5 s), not by the signal"
    assert ticks >= 15, "the loop was blocked while the request waited for the match"


def test_a_coroutine_that_cannot_wait_abandons_the_match_and_a_late_lease_is_counted():
    lot = ParkingLot(10, 4)

    async def request():
        t = ticket()
        lot.park(t)
        assert lot.begin_match(t)
        lot.begin_leave(t)
        await t.event.wait_async(0.05)
        return lot.end_leave(t), t

    (lease, t), _ = _on_a_loop(request)
    assert lease is None and t.abandoned
    lot.finish_match(t, LEASE)  # the transaction commits after the request gave up
    assert t.state is TicketState.LEASED and len(lot) == 0


def test_a_signal_set_after_its_loop_closed_is_harmless():
    async def make():
        return ticket()

    t, _ = _on_a_loop(make)
    t.event.set()  # e.g. leadership lost after the request's loop went away
    assert t.event.is_set()


def test_close_answers_every_parked_request_and_nothing_parks_again():
    from arbiter.server.loops.tickets import Stopping

    lot = ParkingLot(10, 4)
    waiting = [ticket(HOME1, "a"), ticket(HOME2, "b")]
    for t in waiting:
        lot.park(t)
    lot.close()
    assert all(t.state is TicketState.WITHDRAWN and t.event.is_set() for t in waiting) and len(lot) == 0
    with pytest.raises(Stopping):
        lot.park(ticket(HOME1, "c"))


# -- the real dispatcher in this process, against a real database ---------------------------------
class HeldCommit:
    """The fault hook inside the acquire transaction: the round stops there until released."""

    def __init__(self):
        self.inside = threading.Event()
        self.release = threading.Event()

    def __call__(self):
        self.inside.set()
        assert self.release.wait(30)


@pytest.fixture
def dispatcher(db, monkeypatch):
    with db.connect() as conn:
        seed_problem(conn)
        add_worker(conn, "home-1")
    settings = ArbiterSettings(dsn=db.dsn)
    d = Dispatcher(settings, DbHealth(), is_leader=lambda: True)
    d._work = db.connect()
    held = HeldCommit()
    monkeypatch.setattr(faults, "before_commit_hook", lambda: held)
    yield d, held, db
    held.release.set()
    d._work.close()


def _round_in_thread(d: Dispatcher) -> threading.Thread:
    thread = threading.Thread(target=d.round)
    thread.start()
    return thread


def test_a_request_that_leaves_while_its_lease_commits_holds_no_place_and_is_not_matched_again(dispatcher):
    d, held, db = dispatcher
    with db.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    t = ticket()
    d.park(t)
    round_ = _round_in_thread(d)
    assert held.inside.wait(10)
    assert unpark(d, t, wait_if_matching=0.05) is None  # the request could not wait any longer
    assert len(d.lot) == 0
    held.release.set()
    round_.join(10)
    assert t.state is TicketState.LEASED and t.abandoned
    # A later round has nothing to give it, and the lease stays unconfirmed (it expires on its own).
    d.round()
    assert len(d.lot) == 0 and d.parked_snapshot() == []
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM lease_grants").fetchone() == (1,)
        assert conn.execute("SELECT status, lease_confirmed_at FROM submissions WHERE id = %s",
                            (sid,)).fetchone() == ("judging", None)


def test_a_retry_of_the_request_id_during_the_commit_gets_the_same_lease_and_no_second_one(dispatcher):
    d, held, db = dispatcher
    with db.connect() as conn:
        seed_submissions(conn, 2)
    first, retry = ticket(), ticket()
    d.park(first)
    round_ = _round_in_thread(d)
    assert held.inside.wait(10)
    d.park(retry)  # the worker's retry arrives while the first attempt's transaction is open
    held.release.set()
    round_.join(10)
    assert first.state is TicketState.LEASED
    d.round()
    assert retry.state is TicketState.LEASED
    assert retry.lease.lease_token == first.lease.lease_token
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM lease_grants").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM submissions WHERE status = 'judging'").fetchone() == (1,)
    assert unpark(d, retry) is retry.lease and len(d.lot) == 0


def test_leadership_lost_during_a_commit_answers_everyone_and_the_lease_is_not_lost(dispatcher):
    d, held, db = dispatcher
    with db.connect() as conn:
        seed_submissions(conn, 1)
        add_worker(conn, "home-2")
    matched, waiting = ticket(), ticket(HOME2, "w")
    d.park(matched)
    round_ = _round_in_thread(d)
    assert held.inside.wait(10)
    d.park(waiting)
    d.cancel_all()
    assert waiting.event.is_set() and waiting.state is TicketState.WITHDRAWN
    held.release.set()
    round_.join(10)
    assert matched.state is TicketState.LEASED  # the lease it committed reaches its request
    assert unpark(d, matched) is matched.lease and unpark(d, waiting) is None
    assert len(d.lot) == 0


# -- batch dispatch (acquire_leases): many parked requests, one statement -----------------------------
@pytest.fixture
def batch_dispatcher(db):
    with db.connect() as conn:
        seed_problem(conn)
    d = Dispatcher(ArbiterSettings(dsn=db.dsn, dispatch_batch_size=500), DbHealth(), is_leader=lambda: True)
    d._work = db.connect()
    yield d, db
    d._close()


def _workers(conn, prefix: str, count: int, kind: str, languages=("python3",)) -> list[WorkerIdentity]:
    for i in range(count):
        add_worker(conn, f"{prefix}-{i:03d}", kind, languages)
    return [WorkerIdentity(f"{prefix}-{i:03d}", kind, tuple(sorted(languages))) for i in range(count)]


def test_retries_in_a_batch_get_their_earlier_lease_or_410_and_the_rest_new_leases(batch_dispatcher):
    """A round matches first and looks up request_ids after (only for what it did not lease): a retry
    in a batch makes the batch's grant rows collide, nothing is written, and the batch goes one by
    one: the retry of a live lease gets that lease, the retry of a finished one is refused (410),
    the new request gets new work."""
    from arbiter.store import leases

    d, db = batch_dispatcher
    with db.connect() as conn:
        live_w, dead_w, new_w = _workers(conn, "w", 3, "home")
        sids = seed_submissions(conn, 4)
        live = leases.acquire(conn, worker_id=live_w.worker_id, kind="home", request_id="again", languages=["python3"],
                              unconfirmed_secs=10, legacy=None)
        dead = leases.acquire(conn, worker_id=dead_w.worker_id, kind="home", request_id="again", languages=["python3"],
                              unconfirmed_secs=10, legacy=None)
        conn.execute("UPDATE submissions SET status = 'AC', lease_token = NULL WHERE id = %s", (dead.submission_id,))
    retried_live, retried_dead, fresh = ticket(live_w, "again"), ticket(dead_w, "again"), ticket(new_w, "new")
    for t in (retried_live, retried_dead, fresh):
        d.park(t)
    d.round()
    assert retried_live.state is TicketState.LEASED and retried_live.retried
    assert retried_live.lease.lease_token == live.lease_token
    assert retried_dead.state is TicketState.WITHDRAWN and retried_dead.earlier_gone
    assert fresh.state is TicketState.LEASED and fresh.lease.submission_id not in (live.submission_id,
                                                                                    dead.submission_id)
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM lease_grants").fetchone() == (3,), "one new grant"
        assert conn.execute("SELECT count(*) FROM submissions WHERE status = 'pending'").fetchone() == (1,)
    assert len(sids) == 4


def test_one_round_leases_a_burst_in_one_statement_home_first_oldest_first(batch_dispatcher):
    """300 parked requests (200 production parked first, then 100 home) and 150 pending: one round,
    one acquire_leases statement; every home request is served, the production ones share the rest,
    each submission leased exactly once, the oldest submissions to the home workers."""
    d, db = batch_dispatcher
    with db.connect() as conn:
        prods = _workers(conn, "prod", 200, "production")
        homes = _workers(conn, "home", 100, "home")
        sids = seed_submissions(conn, 150)
    tickets = [ticket(w, f"r-{w.worker_id}") for w in prods + homes]
    for t in tickets:
        d.park(t)
    from arbiter.server.metrics import METRICS

    batches_before = METRICS.get("arbiter_dispatch_batches_total")
    d.round()
    assert METRICS.get("arbiter_dispatch_batches_total") - batches_before == 1
    leased = [t for t in tickets if t.state is TicketState.LEASED]
    assert len(leased) == 150
    assert all(t.state is TicketState.LEASED for t in tickets if t.worker.kind == "home")
    assert sorted(t.lease.submission_id for t in leased) == sids
    assert max(t.lease.submission_id for t in tickets if t.worker.kind == "home") < \
        min(t.lease.submission_id for t in leased if t.worker.kind == "production")
    with db.connect() as conn:
        rows = conn.execute("SELECT s.worker_id, g.worker_id, g.request_id FROM submissions s "
                            "JOIN lease_grants g ON g.lease_token = s.lease_token").fetchall()
        assert len(rows) == 150 and all(w == gw and r == f"r-{w}" for w, gw, r in rows)
        assert conn.execute("SELECT count(*) FROM workers WHERE last_lease_at IS NOT NULL").fetchone() == (150,)
    assert len(d.parked_snapshot()) == 150  # the others wait on


def test_batches_respect_languages_and_pins(batch_dispatcher):
    """Requests of two language sets, and a canary pinned to one worker: each gets only work it can
    judge, the pinned canary goes to its worker only."""
    from arbiter.store import canary

    d, db = batch_dispatcher
    with db.connect() as conn:
        py = _workers(conn, "py", 3, "home", ("python3",))
        cc = _workers(conn, "cc", 3, "home", ("c",))
        py_work = seed_submissions(conn, 2, language="python3")
        c_work = seed_submissions(conn, 2, language="c", source="int main(){return 0;}")
        pinned = canary.submit(conn, "python3", pinned_worker="py-002")
    tickets = [ticket(w, "r") for w in py + cc]
    for t in tickets:
        d.park(t)
    d.round()
    got = {t.worker.worker_id: t.lease.submission_id for t in tickets if t.state is TicketState.LEASED}
    assert got["py-002"] == pinned
    assert sorted(got[w.worker_id] for w in py if w.worker_id != "py-002" and w.worker_id in got) == py_work
    assert sorted(v for k, v in got.items() if k.startswith("cc-")) == c_work


def test_a_request_id_served_before_makes_the_batch_match_one_by_one(batch_dispatcher):
    """A retried request_id inside a batch (its lease was granted by another arbiter) gets that same
    lease; the others are still matched, and no submission is leased twice."""
    from arbiter.store import leases

    d, db = batch_dispatcher
    with db.connect() as conn:
        workers = _workers(conn, "home", 5, "home")
        seed_submissions(conn, 6)  # one for the earlier grant, five for the batch
        earlier = leases.acquire(conn, worker_id="home-003", kind="home", request_id="r", languages=["python3"],
                                 unconfirmed_secs=10, legacy=None)
    tickets = [ticket(w, "r") for w in workers]
    for t in tickets:
        d.park(t)
    d.round()
    assert all(t.state is TicketState.LEASED for t in tickets)
    assert tickets[3].lease.lease_token == earlier.lease_token
    assert len({t.lease.submission_id for t in tickets}) == 5
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM lease_grants").fetchone() == (5,)
        assert conn.execute("SELECT count(*) FROM submissions WHERE status = 'judging'").fetchone() == (5,)


# -- the work known from one round to the next (Dispatcher._look) -------------------------------------
def _looks(kind: str) -> float:
    from arbiter.server.metrics import METRICS

    return METRICS.get("arbiter_dispatch_looks_total", look=kind)


def test_a_deep_queue_is_counted_once_then_known_and_a_new_pin_is_still_seen(batch_dispatcher):
    """Work for many rounds: the first round counts the queue (claimable_work), the next rounds go by
    what it counted less what they granted (only the pinned canaries are read again), and a canary
    pinned to a parked worker meanwhile still goes to that worker in the next round. Once the known
    work no longer covers the parked requests, the queue is counted again."""
    from arbiter.store import canary

    d, db = batch_dispatcher
    d._connect()  # LISTEN: the rounds below hear the NOTIFYs as the loop would (_wait_for_wake)
    with db.connect() as conn:
        workers = _workers(conn, "home", 4, "home")
        seed_submissions(conn, 10)
    d._wait_for_wake()
    full, pins = _looks("full"), _looks("pins")

    def park_all(tag: str) -> list:
        tickets = [ticket(w, f"{tag}-{w.worker_id}") for w in workers]
        for t in tickets:
            d.park(t)
        return tickets

    first = park_all("a")
    d.round()
    assert all(t.state is TicketState.LEASED for t in first)
    assert (_looks("full") - full, _looks("pins") - pins) == (1, 0)
    with db.connect() as conn:
        pinned = canary.submit(conn, "python3", pinned_worker="home-002")
    second = park_all("b")
    # The canary's NOTIFYs (its language, and 'pinned') come after its commit, as they would to the loop.
    wait_for(lambda: d._wait_for_wake() or d._pins_stale, 10, what="the pinned canary's NOTIFY")
    d.round()
    assert (_looks("full") - full, _looks("pins") - pins) == (1, 1)  # 6 known for 4 requests
    assert second[2].lease.submission_id == pinned
    assert all(t.state is TicketState.LEASED for t in second)
    third = park_all("c")  # 3 real ones left, known: fewer than the 4 requests
    d.round()
    assert (_looks("full") - full, _looks("pins") - pins) == (2, 1)
    assert sum(t.state is TicketState.LEASED for t in third) == 3


def test_known_work_that_was_taken_elsewhere_costs_one_statement_and_then_a_look(batch_dispatcher):
    """The known work can be wrong (an operator's change, another leader): a round that acts on it
    and finds less marks it exhausted, and the next round counts the queue again."""
    d, db = batch_dispatcher
    with db.connect() as conn:
        workers = _workers(conn, "home", 2, "home")
        seed_submissions(conn, 6)
    tickets = [ticket(w, f"a-{w.worker_id}") for w in workers]
    for t in tickets:
        d.park(t)
    d.round()  # counted 6, granted 2: 4 known
    with db.connect() as conn:
        conn.execute("UPDATE submissions SET status = 'CE' WHERE status = 'pending'")
    full, known = _looks("full"), _looks("known")
    tickets = [ticket(w, f"b-{w.worker_id}") for w in workers]
    for t in tickets:
        d.park(t)
    d._dirty = True
    d.round()  # no statement before the acquire: no pinned canary was announced
    assert (_looks("full"), _looks("known")) == (full, known + 1)
    assert not any(t.state is TicketState.LEASED for t in tickets)
    d._dirty = True
    d.round()
    assert _looks("full") == full + 1


# -- the dispatcher's loop after a database outage ---------------------------------------------------
def test_leadership_gained_ends_the_dispatchers_back_off_at_once(db, monkeypatch):
    """A database failover: the dispatcher's rounds fail and it backs off; the leader lock is taken
    again on the new primary, and the next round runs at once, not when the back-off ends (a
    minute here, so that only the cut-short wait can pass within the 15 s below)."""
    import dataclasses

    from arbiter.server.loops import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "RETRY_FIRST_SECS", 60.0)
    monkeypatch.setattr(dispatcher_module, "RETRY_MAX_SECS", 60.0)
    with socket.socket() as unused:  # a port nothing listens on: the database away
        unused.bind(("127.0.0.1", 0))
        away = f"host=127.0.0.1 port={unused.getsockname()[1]} dbname=x user=x connect_timeout=2"
    health = DbHealth()
    health.mark_up()
    d = Dispatcher(ArbiterSettings(dsn=away), health, is_leader=lambda: True)
    d.start()
    try:
        wait_for(lambda: not health.up, 10, what="the first failed round")
        d.settings = dataclasses.replace(d.settings, dsn=db.dsn)  # the new primary answers
        time.sleep(0.5)
        assert d.rounds == 0, "the dispatcher must still be in its back-off"
        d.on_leadership_gained()
        wait_for(lambda: d.rounds > 0, 15, what="a dispatch round right after leadership was gained")
        assert health.up
    finally:
        d.stop()
