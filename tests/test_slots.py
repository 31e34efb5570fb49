"""Judge slots (issue 15): several concurrent judgings on one worker host, each pinned to its CPU,
every lease fenced as with one slot, one shared outbox; the slot lifecycle as a state machine."""

from __future__ import annotations

import itertools
import os
import uuid

import pytest
from support.fixtures_data import seed_problem, seed_user
from support.parking import leave
from support.procs import add_worker, problem_site, wait_for, write_testdata
from support.programs import APLUSB_TESTS

from arbiter.store import leases
from worker import config as worker_config
from worker.delivery.http_client import ArbiterClient
from worker.sandbox import cgroups
from worker.slot import TRANSITIONS, IllegalTransition, SlotLifecycle, SlotState

WORKER_FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
               "backoff_max_secs": 2.0}
TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two slots need two CPUs")

# A+B that burns CPU for a while and answers right only while the kernel keeps it on one CPU, even
# after it asks for every CPU of the machine.
PINNED_APLUSB = """import os, time
a, b = map(int, input().split())
pinned_before = len(os.sched_getaffinity(0)) == 1
try:
    os.sched_setaffinity(0, set(range(os.cpu_count())))
except OSError:
    pass
pinned = pinned_before and len(os.sched_getaffinity(0)) == 1
start = time.process_time()
while time.process_time() - start < 0.25:
    pass
print(a + b if pinned else a + b + 1)
"""
SLOW_APLUSB = "import time\na, b = map(int, input().split())\ntime.sleep(1.2)\nprint(a + b)\n"


# -- the slot lifecycle ----------------------------------------------------------------------------
def test_every_transition_goes_only_from_the_states_it_names():
    for name, (allowed, target) in TRANSITIONS.items():
        for state in SlotState:
            life = SlotLifecycle()
            life.state = state
            if state in allowed:
                assert life.go(name) is target and life.state is target
            else:
                with pytest.raises(IllegalTransition):
                    life.go(name)
                assert life.state is state, "a refused transition changed the state"


def test_the_slot_paths_a_judging_takes():
    paths = {
        "judged": ["ask", "judge", "idle"],
        "nothing came": ["ask", "idle"],
        "handed back, stepping aside": ["ask", "judge", "step_aside", "ask"],
        "sandbox broke, then works": ["ask", "judge", "break_", "recover", "ask"],
        "stopping while parked": ["ask", "idle", "stop"],
    }
    for what, steps in paths.items():
        life = SlotLifecycle()
        for step in steps:
            life.go(step)
        assert life.state is TRANSITIONS[steps[-1]][1], what
    stopped = SlotLifecycle()
    stopped.go("stop")
    with pytest.raises(IllegalTransition):
        stopped.go("ask")  # a stopped slot takes no more work


# -- configuration -----------------------------------------------------------------------------------
def test_slot_cpus_are_checked_and_chosen():
    usable = worker_config.usable_cpus()
    assert worker_config.slot_cpus_for(1, None, "arbiter") == ()  # one slot: unpinned, as always
    assert worker_config.slot_cpus_for(1, [usable[0]], "arbiter") == (usable[0],)
    assert worker_config.slot_cpus_for(len(usable), None, "arbiter") == tuple(usable)
    if len(usable) > 2:
        assert worker_config.slot_cpus_for(2, None, "arbiter") == tuple(usable[-2:])  # the first stays free
    errors = [
        (lambda: worker_config.slot_cpus_for(2, None, "direct"), "needs transport 'arbiter'"),
        (lambda: worker_config.slot_cpus_for(0, None, "arbiter"), "slots must be between 1 and 256"),
        (lambda: worker_config.slot_cpus_for(len(usable) + 1, None, "arbiter"), "each slot needs its own"),
        (lambda: worker_config.slot_cpus_for(2, [usable[0]], "arbiter"), "one CPU number per slot"),
        (lambda: worker_config.slot_cpus_for(2, [usable[0], usable[0]], "arbiter"), "must not name a CPU twice"),
        (lambda: worker_config.slot_cpus_for(1, [max(usable) + 1000], "arbiter"), "are not CPUs this worker may use"),
        (lambda: worker_config.slot_cpus_for(1, [True], "arbiter"), "one CPU number per slot"),
    ]
    for call, message in errors:
        with pytest.raises(worker_config.ConfigError, match=message):
            call()


# -- the arbiter's side ------------------------------------------------------------------------------
@pytest.fixture
def site(db, arbiters, workers, tmp_path):
    seeded = problem_site(db, tmp_path, worker_id="prod-1", kind="production", slots=2, time_limit_ms=2000)
    cred = seeded.cred

    def submit(source):
        with db.connect() as conn:
            return leases.submit(conn, seeded.user, seeded.problem, "python3", source)

    def rows(sql, *args):
        with db.connect() as conn:
            return conn.execute(sql, args).fetchall()

    def start_worker(arbiter, **extra):
        return workers("prod-1", "production", "arbiter", seeded.testdata, arbiter_urls=[arbiter.url],
                       credential=cred, slots=2, **{**WORKER_FAST, **extra}).start()

    return dict(db=db, arbiters=arbiters, cred=cred, submit=submit, rows=rows, start_worker=start_worker)


def test_an_acquire_names_one_of_the_workers_registered_slots(site):
    a = site["arbiters"].start(site["db"].dsn)
    client = ArbiterClient([a.url], site["cred"], timeout=10)
    sid = site["submit"]("print(1)")
    for bad in (2, -1, 300):
        reply = client.acquire(uuid.uuid4().hex, ["python3"], 0, slot=bad)
        assert reply.status == 422 and "registered with 2 slot(s)" in reply.body["description"], reply.body
    assert reply.status == 422 and site["rows"]("SELECT count(*) FROM lease_grants") == [(0,)], "a refused acquire wrote"
    reply = client.acquire(uuid.uuid4().hex, ["python3"], 1, slot=1)
    assert reply.status == 200 and reply.body["submission_id"] == sid
    assert site["rows"]("SELECT lease_slot FROM submissions WHERE id = %s", sid) == [(1,)]
    token = reply.body["lease_token"]
    assert client.result(sid, {"lease_token": token, "verdict": "WA", "time_ms": 1, "memory_kb": 1}).status == 200
    assert site["rows"]("SELECT slot, verdict FROM submission_judgings WHERE submission_id = %s", sid) == [(1, "WA")]


# -- a worker with two slots -------------------------------------------------------------------------
@TWO_CPUS
def test_two_slots_judge_two_submissions_at_once_each_on_its_own_cpu(site):
    if not cgroups.cpuset_available(cgroups.detect()):
        pytest.skip("no cpuset cgroup here: taskset pins the slot, but the program could widen it")
    a = site["arbiters"].start(site["db"].dsn)
    w = site["start_worker"](a)
    sids = [site["submit"](PINNED_APLUSB) for _ in range(4)]
    wait_for(lambda: site["rows"]("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')")
             == [(0,)], 120, interval=0.2, what="all judged")
    verdicts = site["rows"]("SELECT id, status FROM submissions ORDER BY id")
    assert verdicts == [(sid, "AC") for sid in sids], \
        f"a program was not kept on one CPU (or judged wrongly): {verdicts}\n{w.log_text()[-2000:]}"
    history = site["rows"]("SELECT submission_id, slot FROM submission_judgings ORDER BY seq")
    assert sorted(s for s, _ in history) == sids, "a result landed twice (or not at all)"
    assert {slot for _, slot in history} == {0, 1}, f"both slots should have judged: {history}"
    # At once: some two submissions were both leased before either was decided.
    spans = site["rows"]("SELECT g.granted_at, s.judged_at FROM lease_grants g JOIN submissions s "
                         "ON s.id = g.submission_id AND s.lease_token = g.lease_token")
    assert any(max(g1, g2) < min(j1, j2) for (g1, j1), (g2, j2) in itertools.combinations(spans, 2)), spans
    assert not w.outbox_files()


@TWO_CPUS
def test_two_slots_of_the_production_worker_beside_the_legacy_scheme(make_db, arbiters, workers, tmp_path):
    """Stage 4's switch runs with the legacy tables still there: both slots are parked when the work
    comes, and the round that marks parked workers idle for the legacy yield rule must not trip over
    one worker twice (it did: no dispatch at all while both were parked)."""
    db = make_db("stage1")  # the schema of stages 1-3: the legacy lock and turn rules still in force
    with db.connect() as conn:
        problem = seed_problem(conn, "aplusb", time_limit_ms=2000)
        user = seed_user(conn, "alice")
        cred = add_worker(conn, "prod-1", "production", slots=2)
    testdata = write_testdata(tmp_path / "testdata", problem, APLUSB_TESTS).parent
    a = arbiters.start(db.dsn)
    long_poll = 25.0
    workers("prod-1", "production", "arbiter", testdata, arbiter_urls=[a.url], credential=cred, slots=2,
            **{**WORKER_FAST, "long_poll_secs": long_poll}).start()
    wait_for(lambda: a.metric("arbiter_parked_requests") == 2, 30, what="both slots parked")
    with db.connect() as conn:
        sids = [leases.submit(conn, user, problem, "python3", SLOW_APLUSB) for _ in range(2)]
        # Both parked requests get work long before either long-poll ends (milliseconds, normally).
        wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE status <> 'pending'").fetchone() == (2,),
                 long_poll / 2, interval=0.1, what="both parked slots leased")
        wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE status = 'AC'").fetchone() == (2,),
                 60, interval=0.3, what="both judged")
        slots = conn.execute("SELECT slot, submission_id FROM submission_judgings ORDER BY slot").fetchall()
        assert [s for s, _ in slots] == [0, 1] and sorted(i for _, i in slots) == sids, slots


@TWO_CPUS
def test_kill9_of_a_two_slot_worker_mid_judging_loses_nothing(site):
    a = site["arbiters"].start(site["db"].dsn, lease_secs=4.0, unconfirmed_secs=3.0)
    w = site["start_worker"](a)
    sids = [site["submit"](SLOW_APLUSB) for _ in range(2)]
    wait_for(lambda: site["rows"]("SELECT count(*) FROM submissions WHERE status = 'judging' "
                                  "AND lease_confirmed_at IS NOT NULL") == [(2,)], 30, what="both slots judging")
    assert sorted(s for (s,) in site["rows"]("SELECT lease_slot FROM submissions")) == [0, 1]
    w.kill9()
    w.start()
    wait_for(lambda: site["rows"]("SELECT count(*) FROM submissions WHERE status = 'AC'") == [(2,)], 90,
             interval=0.3, what="both judged after the restart")
    history = site["rows"]("SELECT submission_id, verdict FROM submission_judgings WHERE decided_by = 'worker' "
                           "ORDER BY submission_id")
    assert history == [(sids[0], "AC"), (sids[1], "AC")], history
    assert site["rows"]("SELECT judge_attempts FROM submissions ORDER BY id") == [(2,), (2,)]


@TWO_CPUS
def test_the_parking_share_and_the_metric_are_per_slot():
    from arbiter.server.loops.tickets import ParkingLot, Ticket, TooManyParked, WorkerIdentity
    from arbiter.server.metrics import METRICS

    lot = ParkingLot(capacity=100, per_worker=2)
    prod = WorkerIdentity("prod-slots", "production", ("python3",), slots=2)
    home = WorkerIdentity("home-slots", "home", ("python3",))
    tickets = [Ticket(worker=prod, request_id=f"r{i}", languages=("python3",), slot=i % 2) for i in range(4)]
    for ticket in tickets:
        lot.park(ticket)  # 2 per slot x 2 slots
    with pytest.raises(TooManyParked):
        lot.park(Ticket(worker=prod, request_id="r4", languages=("python3",), slot=0))
    lot.park(Ticket(worker=home, request_id="h0", languages=("python3",)))
    with pytest.raises(TooManyParked):
        for i in range(1, 3):
            lot.park(Ticket(worker=home, request_id=f"h{i}", languages=("python3",)))
    assert METRICS.get("arbiter_slot_parked_requests", worker="prod-slots", slot="0") == 2
    leave(lot, tickets[0], 0)
    assert METRICS.get("arbiter_slot_parked_requests", worker="prod-slots", slot="0") == 1
    assert METRICS.get("arbiter_slot_parked_requests", worker="prod-slots", slot="1") == 2
    assert 'worker="home-slots"' not in METRICS.render(), "a one-slot worker gets no per-slot series"
