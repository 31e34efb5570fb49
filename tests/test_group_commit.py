"""Group commit (arbiter/server/group_commit.py): how writes form batches, and what each request hears.

The batching itself is database-free (a batch is a list handed to a function on a thread), so the
interleavings are driven here with plain functions; the last test runs it in a real arbiter, whose
statements are the real ones (tests/test_lease_batches.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid

import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, request_bytes

from arbiter.server.group_commit import GroupCommit, PendingWrite, WriteState
from arbiter.store import leases


class Recorder:
    """write_batch: answers each write with its double; records the batches; can be held on a gate."""

    def __init__(self, poison=None):
        self.batches: list[list] = []
        self.gate = threading.Event()
        self.gate.set()
        self.poison = poison

    def __call__(self, writes: list) -> list:
        self.gate.wait(10)
        self.batches.append(list(writes))
        if self.poison is not None and self.poison in writes:
            raise ValueError(f"refused {self.poison}")
        return [w * 2 for w in writes]


def commit(recorder, **limits) -> GroupCommit:
    async def run(fn):
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    settings = {"max_batch": 100, "max_weight": 1000, "max_in_flight": 2, **limits}
    return GroupCommit("test", recorder, run, **settings)


async def settle_until(predicate, secs: float = 5.0) -> None:
    for _ in range(int(secs / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not settled")


def test_writes_that_arrive_together_are_written_as_one_batch():
    async def scenario():
        recorder = Recorder()
        group = commit(recorder)
        answers = await asyncio.gather(*(group.write(i) for i in range(10)))
        assert answers == [i * 2 for i in range(10)]
        assert recorder.batches == [list(range(10))]

    asyncio.run(scenario())


def test_writes_that_come_while_batches_are_in_flight_go_together_in_the_next():
    async def scenario():
        recorder = Recorder()
        recorder.gate.clear()  # the first batches stand still in their statement
        group = commit(recorder, max_in_flight=2)
        first = asyncio.ensure_future(group.write(1))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(group.write(2))
        await asyncio.sleep(0.05)
        later = [asyncio.ensure_future(group.write(i)) for i in range(10, 15)]
        await asyncio.sleep(0.05)
        assert group.queued == 5  # both slots busy: they wait
        recorder.gate.set()
        assert await asyncio.gather(first, second, *later) == [2, 4, 20, 22, 24, 26, 28]
        assert sorted(map(sorted, recorder.batches)) == [[1], [2], [10, 11, 12, 13, 14]]

    asyncio.run(scenario())


def test_a_batch_takes_at_most_max_batch_writes_and_max_weight_but_always_one():
    async def scenario():
        recorder = Recorder()
        group = commit(recorder, max_batch=3, max_weight=10, max_in_flight=1)
        writes = [group.write(i, weight=1) for i in range(7)] + [group.write(99, weight=50), group.write(7, weight=6),
                                                                group.write(8, weight=6)]
        await asyncio.gather(*writes)
        assert recorder.batches == [[0, 1, 2], [3, 4, 5], [6], [99], [7], [8]]

    asyncio.run(scenario())


def test_without_max_weight_only_max_batch_bounds_a_batch():
    async def scenario():
        recorder = Recorder()
        group = commit(recorder, max_batch=3, max_weight=None, max_in_flight=1)
        await asyncio.gather(*(group.write(i, weight=10**9) for i in range(5)))
        assert recorder.batches == [[0, 1, 2], [3, 4]]

    asyncio.run(scenario())


def test_a_write_that_fails_its_batch_is_the_only_one_to_fail():
    async def scenario():
        recorder = Recorder(poison=3)
        group = commit(recorder)
        answers = await asyncio.gather(*(group.write(i) for i in range(6)), return_exceptions=True)
        assert [a for i, a in enumerate(answers) if i != 3] == [0, 2, 4, 8, 10]
        assert isinstance(answers[3], ValueError) and "refused 3" in str(answers[3])
        # One statement for all, then one for each, once the batch failed.
        assert recorder.batches == [list(range(6))] + [[i] for i in range(6)]

    asyncio.run(scenario())


def test_a_request_that_goes_away_leaves_its_write_done_and_the_others_answered():
    async def scenario():
        recorder = Recorder()
        recorder.gate.clear()
        group = commit(recorder)
        gone = asyncio.ensure_future(group.write(1))
        stays = asyncio.ensure_future(group.write(2))
        await asyncio.sleep(0.05)
        gone.cancel()
        recorder.gate.set()
        assert await stays == 4
        assert recorder.batches == [[1, 2]]  # written all the same: it had been sent
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(scenario())


def test_a_pending_write_moves_only_along_its_arrows():
    async def scenario():
        loop = asyncio.get_running_loop()
        answered = PendingWrite("w", 0, loop.create_future())
        with pytest.raises(AssertionError):
            answered.settle("early")  # QUEUED: not written yet
        answered.taken()
        with pytest.raises(AssertionError):
            answered.taken()  # taken twice
        answered.settle("done")
        assert answered.state is WriteState.ANSWERED and answered.answer.result() == "done"
        abandoned = PendingWrite("w", 0, loop.create_future())
        abandoned.taken()
        abandoned.answer.cancel()  # the request went away while it was written
        abandoned.settle("done")
        assert abandoned.state is WriteState.ABANDONED

    asyncio.run(scenario())


def test_a_real_arbiter_writes_heartbeats_that_arrive_together_in_few_statements(db, arbiters):
    with db.connect() as conn:
        seed_problem(conn)
        credential = add_worker(conn, "home-1", languages=("python3",))
        seed_submissions(conn, 40)
        held = [leases.acquire(conn, worker_id="home-1", kind="home", request_id=str(uuid.uuid4()),
                               languages=["python3"], unconfirmed_secs=60, legacy=None) for _ in range(40)]
    arbiter = arbiters.start(db.dsn)
    before = (arbiter.metric("arbiter_group_commit_batches_total"), arbiter.metric("arbiter_group_commit_writes_total"))
    sockets = [socket.create_connection(("127.0.0.1", arbiter.port), timeout=10) for _ in held]
    with db.connect() as blocker:
        # The first batches wait on a row this transaction holds (under a second: lock_timeout is 2 s),
        # so what arrives meanwhile waits for them, as under load, and goes in the next statement.
        with blocker.transaction():
            blocker.execute("SELECT 1 FROM submissions WHERE id = %s FOR UPDATE", (held[0].submission_id,))
            for sock, lease in zip(sockets, held):
                sock.sendall(request_bytes(f"/v1/leases/{lease.submission_id}/heartbeat",
                                           {"lease_token": str(lease.lease_token)}, credential))
            threading.Event().wait(0.8)
    for sock in sockets:
        assert sock.recv(4096).split(b" ", 2)[1] == b"200"
        sock.close()
    batches = arbiter.metric("arbiter_group_commit_batches_total") - before[0]
    writes = arbiter.metric("arbiter_group_commit_writes_total") - before[1]
    assert writes == 40 and batches <= 8, (writes, batches)
    with db.connect() as conn:
        confirmed = conn.execute("SELECT count(*) FROM submissions WHERE lease_confirmed_at IS NOT NULL").fetchone()[0]
    assert confirmed == 40
