"""The leader lock's lifecycle (arbiter/server/loops/leader.py) against a real PostgreSQL: a standby
waits on the lock itself, so it leads the moment the leader's session ends or the leader resigns;
a resigned arbiter never takes the lock again; a stop cuts a standby's wait short.

Each transition is timed against the standby's retry period (``leader_retry_secs``, 3 s here, as by
default): a hand-over that waited for the standby's next try would take up to that long. Removed by
hand once: with the standby polling ``pg_try_advisory_lock`` every retry (the previous lock loop)
``test_a_standby_leads_as_soon_as_the_leader_resigns`` measured 2.0 s and failed, and in
``test_a_standby_leads_as_soon_as_the_leaders_session_ends`` the old leader took the lock back (its
reconnect came before the standby's next try)."""

from __future__ import annotations

import threading
import time

import pytest
from support.procs import wait_for

from arbiter.server.config import ArbiterSettings
from arbiter.server.loops.leader import LeaderLock, LeaderState
from arbiter.store import db as store_db

RETRY = 3.0  # the default; every hand-over below must beat it by far


class Lock:
    """A LeaderLock with its gains and losses recorded (monotonic times)."""

    def __init__(self, dsn: str, name: str):
        settings = ArbiterSettings(dsn=dsn, instance_name=name, leader_retry_secs=RETRY, leader_check_secs=1.0)
        self.gained: list[float] = []
        self.lost: list[float] = []
        self.lock = LeaderLock(settings, store_db.DbHealth(), on_gain=lambda: self.gained.append(time.monotonic()),
                               on_lose=lambda: self.lost.append(time.monotonic()))

    def start(self) -> "Lock":
        self.lock.start()
        return self


@pytest.fixture
def locks(db):
    started: list[Lock] = []

    def make(name: str) -> Lock:
        lock = Lock(db.dsn, name).start()
        started.append(lock)
        return lock

    yield make
    for lock in started:
        lock.lock.stop()


def test_the_first_leads_and_the_second_waits_as_standby(locks):
    a = locks("a")
    wait_for(lambda: a.lock.is_leader, 10, what="a to lead")
    b = locks("b")
    time.sleep(RETRY + 0.5)  # at least one whole lock wait of b's ran out
    assert (a.lock.state, b.lock.state) == (LeaderState.LEADING, LeaderState.STANDBY)
    assert b.lock.health.up, "a standby's answered lock wait counts as a healthy database"
    assert not b.gained


def test_a_standby_leads_as_soon_as_the_leader_resigns(locks):
    a = locks("a")
    wait_for(lambda: a.lock.is_leader, 10, what="a to lead")
    b = locks("b")
    time.sleep(1.0)  # b is inside its lock wait
    resigned_at = time.monotonic()
    a.lock.resign()
    wait_for(lambda: b.lock.is_leader, 10, 0.01, what="b to lead")
    handover = b.gained[0] - resigned_at
    print(f"hand-over on resign: {handover * 1000:.0f} ms")
    assert handover < RETRY / 3, f"the standby waited for its next try ({handover:.2f} s), not for the lock"
    assert a.lost and a.lock.state is LeaderState.RESIGNED
    # Resigned for good: b's end does not bring a back.
    b.lock.resign()
    time.sleep(1.0)
    assert a.lock.state is LeaderState.RESIGNED and not a.lock.is_leader and len(a.gained) == 1


def test_a_standby_leads_as_soon_as_the_leaders_session_ends(db, locks):
    a = locks("a")
    wait_for(lambda: a.lock.is_leader, 10, what="a to lead")
    b = locks("b")
    time.sleep(1.0)
    with db.connect() as conn:  # the leader's process dies: its session ends under it
        ended_at = time.monotonic()
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'judge-arbiter-a'")
    wait_for(lambda: b.lock.is_leader, 10, 0.01, what="b to lead")
    assert b.gained[0] - ended_at < RETRY / 3
    # a learns of it at its next check, drops the leadership, and waits as the standby now.
    wait_for(lambda: a.lock.state is LeaderState.STANDBY and a.lost, 10, what="a to stand by")


def test_a_standby_stopping_returns_without_waiting_out_its_lock_wait(locks):
    a = locks("a")
    wait_for(lambda: a.lock.is_leader, 10, what="a to lead")
    b = locks("b")
    time.sleep(0.5)
    started = time.monotonic()
    b.lock.stop()
    assert time.monotonic() - started < 1.0, "stop waited for the lock wait to run out"
    assert not b.gained and a.lock.is_leader


def test_a_standby_resigning_never_leads_even_when_the_lock_comes_free(locks):
    a = locks("a")
    wait_for(lambda: a.lock.is_leader, 10, what="a to lead")
    b = locks("b")
    time.sleep(0.5)
    b.lock.resign()
    a.lock.resign()
    time.sleep(1.5)
    assert not b.gained and b.lock.state is LeaderState.RESIGNED
    # The lock is free: a third arbiter takes it at once.
    c = locks("c")
    wait_for(lambda: c.lock.is_leader, 5, 0.01, what="c to lead")


def test_resign_from_another_thread_while_a_standby_is_taking_the_lock(locks):
    """resign() racing the grant: whichever wins, the resigned arbiter ends up neither leading nor
    holding the lock (the next arbiter takes it)."""
    for _ in range(5):
        a = locks("a")
        wait_for(lambda: a.lock.is_leader, 10, what="a to lead")  # noqa: B023
        b = locks("b")
        time.sleep(0.3)
        both = [threading.Thread(target=a.lock.resign), threading.Thread(target=b.lock.resign)]
        for t in both:
            t.start()
        for t in both:
            t.join()
        wait_for(lambda: not b.lock.is_leader and not a.lock.is_leader, 5, 0.01, what="neither to lead")  # noqa: B023
        c = locks("c")
        wait_for(lambda: c.lock.is_leader, 5, 0.01, what="c to lead")  # noqa: B023
        c.lock.resign()
        wait_for(lambda: not c.lock.is_leader, 5, 0.01, what="c to resign")  # noqa: B023


@pytest.mark.parametrize("line,message", [
    ("handover_wait_secs = -1", "'handover_wait_secs' must be a number >= 0"),
    ("handover_wait_secs = inf", "'handover_wait_secs' must be a number >= 0"),
])
def test_a_bad_handover_wait_is_one_clear_error(tmp_path, line, message):
    from arbiter.server.config import ConfigError, load_settings

    config = tmp_path / "arbiter.toml"
    config.write_text(f'dsn = "postgresql:///x"\n{line}\n')
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_a_long_poll_shorter_than_the_handover_wait_is_a_valid_config(tmp_path):
    """The hand-over wait never outlasts a request's own wait, so a short long-poll needs no shorter one
    (a first version refused this config, and an arbiter so configured did not start)."""
    from arbiter.server.config import load_settings

    config = tmp_path / "arbiter.toml"
    config.write_text('dsn = "postgresql:///x"\nlong_poll_max_secs = 0.5\n')
    assert load_settings(config).handover_wait_secs == 1.0
