"""A worker stops on SIGTERM wherever its slots are (parked, asking, judging, delivering, between two
acquires), with one slot and with two, and whichever of its threads the kernel hands the signal to:
it exits 0 within a bound, finishes what it judges, and loses nothing.

CI once saw a two-slot worker alive 60 s after its SIGTERM, having logged nothing: the signal had
landed on a slot thread while the main thread slept in a join, so the Python handler never ran
(worker/stop_signals.py). The thread test below sends the signal to a slot thread on purpose.
"""

from __future__ import annotations

import ctypes
import os
import signal

import pytest
from support.faultproxy import FaultProxy
from support.procs import problem_site, wait_for

from arbiter.store import leases

WORKER = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 5.0, "backoff_initial_secs": 0.2,
          "backoff_max_secs": 2.0}
SLOW_APLUSB = "import time\na, b = map(int, input().split())\ntime.sleep(1.2)\nprint(a + b)\n"
# Far more than any stop at these points takes (judging 1.2 s; a parked acquire is cut short at once),
# far less than the faults below would hold a worker that missed its stop (30 s).
EXIT_BOUND_SECS = 20
HELD_SECS = 30.0
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def slot_counts():
    return [1, pytest.param(2, marks=pytest.mark.skipif(not TWO_CPUS, reason="two slots need two CPUs"))]


@pytest.fixture
def site(db, arbiters, workers, tmp_path):
    seeded = problem_site(db, tmp_path, worker_id="prod-1", kind="production", slots=2, time_limit_ms=2000)
    arbiter = arbiters.start(db.dsn)
    proxy = FaultProxy(arbiter.port)

    def submit(count):
        with db.connect() as conn:
            return [leases.submit(conn, seeded.user, seeded.problem, "python3", SLOW_APLUSB) for _ in range(count)]

    def rows(sql, *args):
        with db.connect() as conn:
            return conn.execute(sql, args).fetchall()

    def start_worker(slots, env=None):
        return workers("prod-1", "production", "arbiter", seeded.testdata, arbiter_urls=[proxy.url],
                       credential=seeded.cred, slots=slots, env=env, **WORKER).start()

    yield dict(arbiter=arbiter, proxy=proxy, submit=submit, rows=rows, start_worker=start_worker)
    proxy.close()


def stops_cleanly(w) -> str:
    """The worker exits 0 within the bound, having logged its stop; returns its log."""
    assert w.proc.wait(EXIT_BOUND_SECS) == 0, w.log_text()[-3000:]
    log = w.log_text()
    assert '"event": "stop requested"' in log and '"event": "worker stopped"' in log, log[-3000:]
    return log


def judged_once_each(site, w, sids) -> None:
    assert site["rows"]("SELECT id, status FROM submissions ORDER BY id") == [(s, "AC") for s in sids], w.log_text()
    assert site["rows"]("SELECT count(*) FROM submission_judgings") == [(len(sids),)]
    assert not w.outbox_files()


def judging(site, w, slots):
    """Every slot judging: its lease taken (the database) and past the stop check, running the program
    (its "judging" line). A lease that is only taken when the stop comes is handed back, rightly."""
    sids = site["submit"](slots)
    wait_for(lambda: site["rows"]("SELECT count(*) FROM submissions WHERE status = 'judging'") == [(slots,)]
             and w.log_text().count('"event": "judging"') == slots, 30, what="every slot judging")
    return sids


@pytest.mark.parametrize("slots", slot_counts())
def test_sigterm_while_parked(site, slots):
    w = site["start_worker"](slots)
    wait_for(lambda: site["arbiter"].metric("arbiter_parked_requests") == slots, 30, what="every slot parked")
    w.proc.send_signal(signal.SIGTERM)
    stops_cleanly(w)


@pytest.mark.parametrize("slots", slot_counts())
def test_sigterm_while_an_acquire_is_on_its_way(site, slots):
    """The acquire has left the worker but not reached the arbiter (held on the network): cut short."""
    held = site["proxy"].delay_next("/v1/acquire", HELD_SECS)
    w = site["start_worker"](slots)
    assert held.taken.wait(30), "no acquire was sent"
    w.proc.send_signal(signal.SIGTERM)
    stops_cleanly(w)


@pytest.mark.parametrize("slots", slot_counts())
def test_sigterm_while_judging(site, slots):
    w = site["start_worker"](slots)
    sids = judging(site, w, slots)
    w.proc.send_signal(signal.SIGTERM)
    stops_cleanly(w)
    judged_once_each(site, w, sids)


@pytest.mark.parametrize("slots", slot_counts())
def test_sigterm_while_delivering(site, slots):
    """A result is on its way to the arbiter (held 3 s on the network): it arrives, then the worker exits."""
    held = site["proxy"].delay_next("/result", 3.0)
    w = site["start_worker"](slots)
    sids = site["submit"](slots)
    assert held.taken.wait(60), "no result was sent"
    w.proc.send_signal(signal.SIGTERM)
    stops_cleanly(w)
    judged_once_each(site, w, sids)


@pytest.mark.parametrize("slots", slot_counts())
def test_sigterm_between_two_acquires(site, slots):
    """A stop that lands after an acquire came back empty and before the next one is sent."""
    w = site["start_worker"](slots, env={"JUDGE_WORKER_FAULTS": "term_between_acquires"})
    log = stops_cleanly(w)
    assert site["proxy"].history, "the worker asked for work at least once"
    assert "between two acquires" in log


def tgkill(pid: int, tid: int, signum: int) -> None:
    """Send a signal to one thread of another process (the kernel's tgkill; os has no wrapper)."""
    syscall_numbers = {"x86_64": 234, "aarch64": 131}
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(syscall_numbers[os.uname().machine], pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="tgkill's number unknown here")
@pytest.mark.parametrize("slots", slot_counts())
def test_a_sigterm_the_kernel_hands_to_a_slot_thread_stops_the_worker(site, slots):
    """Every thread but the main one gets the SIGTERM (as the kernel may choose for a process-directed
    signal); none goes to the main thread, whose join a Python handler would have needed to interrupt."""
    w = site["start_worker"](slots)
    sids = judging(site, w, slots)
    pid = w.proc.pid
    others = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    assert len(others) >= slots, others  # the slots' threads (and their heartbeats)
    for tid in others:
        try:
            tgkill(pid, tid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # a heartbeat thread that ended meanwhile
    stops_cleanly(w)
    judged_once_each(site, w, sids)
