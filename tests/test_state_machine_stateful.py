"""Hypothesis drives every arrow in random order against the real DB and checks the three principles.

After every step: a stale token never writes, lease_gen never decreases,
history is append-only (and seq only grows), XP and first pass are granted
exactly once per (user, problem).
"""

from __future__ import annotations

import os
import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from arbiter.protocol import vocabulary
from arbiter.store import leases
from arbiter.store.leases import WriteOutcome

WORKERS = ["home-1", "home-2", "prod-1"]
ACQUIRERS = ["home-1", "home-1", "home-2", "prod-1"]  # home-1 more often: same-worker re-leases are the hard case
VERDICTS = sorted(vocabulary.VERDICTS - {"system_error"}) + ["system_error"]
MAX_ATTEMPTS = 3
MAX_RELEASES = 2  # low, so that runs reach the bound
EXAMPLES = int(os.environ.get("JUDGE_STATEFUL_EXAMPLES", "200"))


class LeaseMachine(RuleBasedStateMachine):
    conn = None  # set by the test

    @initialize()
    def reset(self):
        c = self.conn
        c.execute("ALTER TABLE submission_judgings DISABLE TRIGGER submission_judgings_append_only")
        c.execute("TRUNCATE submission_judgings, first_passes, lease_grants, submissions, users, problems, workers "
                  "RESTART IDENTITY CASCADE")
        c.execute("ALTER TABLE submission_judgings ENABLE TRIGGER submission_judgings_append_only")
        c.execute("INSERT INTO problems (slug, title, xp_reward) VALUES ('p1', 'P1', 10), ('p2', 'P2', 7)")
        c.execute("INSERT INTO users (name) VALUES ('u1'), ('u2')")
        for w in WORKERS:
            c.execute("INSERT INTO workers (worker_id, kind, secret_sha256) VALUES (%s, %s, 'x')",
                      (w, "production" if w.startswith("prod") else "home"))
        self.current: dict[int, tuple[str, uuid.UUID] | None] = {}  # sid -> (worker, token) of the live lease
        self.issued: list[tuple[int, str, uuid.UUID]] = []  # every lease ever handed out
        self.decided_by: dict[uuid.UUID, str] = {}  # token -> verdict it recorded
        self.max_gen: dict[int, int] = {}
        self.history: list[tuple] = []
        self.request_ids: list[tuple[str, str, uuid.UUID]] = []

    # -- arrows ------------------------------------------------------------
    @rule(user=st.sampled_from([1, 2]), problem=st.sampled_from([1, 2]))
    def submit(self, user, problem):
        sid = leases.submit(self.conn, user, problem, "python3", "print(1)")
        self.current[sid] = None

    @rule(worker=st.sampled_from(ACQUIRERS))
    def acquire(self, worker):
        request_id = str(uuid.uuid4())
        lease = leases.acquire(self.conn, worker_id=worker, kind="home", request_id=request_id,
                               languages=["python3"], unconfirmed_secs=10, legacy=None)
        pending = [sid for sid, _ in self._db_statuses() if _ == "pending"]
        if lease is None:
            assert not pending
            return
        assert self.current[lease.submission_id] is None, "a submission got a second live lease"
        self.current[lease.submission_id] = (worker, lease.lease_token)
        self.issued.append((lease.submission_id, worker, lease.lease_token))
        self.request_ids.append((worker, request_id, lease.lease_token))

    @precondition(lambda self: self.request_ids)
    @rule(data=st.data())
    def retry_acquire(self, data):
        worker, request_id, token = data.draw(st.sampled_from(self.request_ids))
        state, lease = leases.find_grant(self.conn, worker, request_id)
        assert lease.lease_token == token
        live = any(v == (worker, token) for v in self.current.values())
        assert (state is leases.GrantState.LIVE) == live

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def heartbeat(self, data):
        sid, worker, token = data.draw(st.sampled_from(self.issued))
        as_worker = data.draw(st.sampled_from([worker] + WORKERS))
        outcome = leases.heartbeat(self.conn, worker_id=as_worker, submission_id=sid, lease_token=token,
                                   lease_secs=60).outcome
        live = self.current.get(sid) == (worker, token)
        if live and as_worker == worker:
            assert outcome is WriteOutcome.ACCEPTED
        elif live:
            assert outcome is WriteOutcome.NOT_YOURS
        else:
            assert outcome is WriteOutcome.GONE

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), verdict=st.sampled_from(VERDICTS[:-1]))
    def result(self, data, verdict):
        sid, worker, token = data.draw(st.sampled_from(self.issued))
        out = leases.record_result(self.conn, worker_id=worker, submission_id=sid, lease_token=token,
                                   verdict=verdict)
        if self.current.get(sid) == (worker, token):
            assert out.outcome is WriteOutcome.ACCEPTED, out
            self.current[sid] = None
            self.decided_by[token] = verdict
        elif token in self.decided_by:
            assert out.outcome is WriteOutcome.DUPLICATE and out.verdict == self.decided_by[token]
        else:
            assert out.outcome is WriteOutcome.GONE, f"stale token {token} for {sid} was answered {out.outcome}"

    def _stale(self):
        return [(sid, w, t) for sid, w, t in self.issued if self.current.get(sid) != (w, t) and t not in self.decided_by]

    @precondition(lambda self: self._stale())
    @rule(data=st.data(), verdict=st.sampled_from(VERDICTS[:-1]))
    def stale_result(self, data, verdict):
        """A late result from a lease that was reclaimed or superseded: must be fenced off."""
        candidates = self._stale()
        same_worker = [c for c in candidates if self.current.get(c[0]) and self.current[c[0]][0] == c[1]]
        sid, worker, token = data.draw(st.sampled_from(same_worker or candidates))
        before = self.conn.execute("SELECT status, lease_token FROM submissions WHERE id = %s", (sid,)).fetchone()
        out = leases.record_result(self.conn, worker_id=worker, submission_id=sid, lease_token=token, verdict=verdict)
        assert out.outcome is WriteOutcome.GONE, f"stale token of {worker} for {sid} was answered {out.outcome}"
        after = self.conn.execute("SELECT status, lease_token FROM submissions WHERE id = %s", (sid,)).fetchone()
        assert after == before

    @precondition(lambda self: any(self.current.values()))
    @rule(data=st.data(), confirm=st.booleans())
    def expire(self, data, confirm):
        sid = data.draw(st.sampled_from(sorted(s for s, v in self.current.items() if v)))
        worker, token = self.current[sid]
        if confirm:
            leases.heartbeat(self.conn, worker_id=worker, submission_id=sid, lease_token=token, lease_secs=60)
        self.conn.execute("UPDATE submissions SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                          (sid,))

    @rule()
    def reclaim(self):
        expired = {r[0] for r in self.conn.execute(
            "SELECT id FROM submissions WHERE status = 'judging' AND lease_expires_at < now()").fetchall()}
        reclaimed = leases.reclaim_expired(self.conn, max_attempts=MAX_ATTEMPTS)
        assert {r.submission_id for r in reclaimed} == expired
        for r in reclaimed:
            assert r.new_status in ("pending", "system_error")
            self.current[r.submission_id] = None

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def release(self, data):
        """A worker hands a lease back (or a stale or foreign release is fenced off)."""
        sid, worker, token = data.draw(st.sampled_from(self.issued))
        as_worker = data.draw(st.sampled_from([worker] + WORKERS))
        out = leases.release(self.conn, worker_id=as_worker, submission_id=sid, lease_token=token,
                             reason="cannot judge", max_releases=MAX_RELEASES)
        live = self.current.get(sid) == (worker, token)
        if live and as_worker == worker:
            assert out.outcome is WriteOutcome.ACCEPTED and out.status in ("pending", "system_error"), out
            self.current[sid] = None
            if out.status == "system_error":
                self.decided_by[token] = "system_error"
        elif live:
            assert out.outcome is WriteOutcome.NOT_YOURS
        else:
            assert out.outcome is WriteOutcome.GONE, f"release of a dead lease of {sid} was answered {out.outcome}"

    @rule()
    def grace(self):
        leases.grant_grace_period(self.conn, grace_secs=60)

    @precondition(lambda self: self.current)
    @rule(data=st.data())
    def rejudge(self, data):
        sid = data.draw(st.sampled_from(sorted(self.current)))
        status = dict(self._db_statuses())[sid]
        moved = leases.rejudge(self.conn, [sid])
        assert bool(moved) == (status in leases.TERMINAL)

    # -- the three principles ---------------------------------------------
    def _db_statuses(self):
        return self.conn.execute("SELECT id, status FROM submissions ORDER BY id").fetchall()

    @invariant()
    def live_leases_match_the_model(self):
        rows = self.conn.execute("SELECT id, status, worker_id, lease_token FROM submissions").fetchall()
        for sid, status, worker, token in rows:
            expected = self.current.get(sid)
            if status == "judging":
                assert expected == (worker, token), f"{sid}: db lease {(worker, token)} model {expected}"
            else:
                assert expected is None, f"{sid} is {status} but the model holds a live lease"
                if status == "pending":
                    assert token is None
                elif token is not None:  # a terminal row names the lease that decided it
                    assert token in self.decided_by

    @invariant()
    def lease_gen_never_decreases(self):
        for sid, gen in self.conn.execute("SELECT id, lease_gen FROM submissions").fetchall():
            assert gen >= self.max_gen.get(sid, 0), f"lease_gen of {sid} went back"
            self.max_gen[sid] = gen

    @invariant()
    def history_is_append_only_and_names_a_real_decision(self):
        rows = self.conn.execute("SELECT id, seq, submission_id, verdict, lease_token, decided_by "
                                 "FROM submission_judgings ORDER BY id").fetchall()
        assert rows[: len(self.history)] == self.history, "history rows changed or vanished"
        seqs = [r[1] for r in rows]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        for row in rows[len(self.history):]:
            if row[5] == "worker":
                assert self.decided_by.get(row[4]) == row[3], f"history row {row} not written by its current token"
        self.history = rows

    @invariant()
    def xp_and_first_pass_exactly_once(self):
        passes = set(self.conn.execute("SELECT user_id, problem_id FROM first_passes").fetchall())
        ac = set(self.conn.execute(
            "SELECT DISTINCT s.user_id, s.problem_id FROM submission_judgings j JOIN submissions s "
            "ON s.id = j.submission_id WHERE j.verdict = 'AC'").fetchall())
        assert passes == ac
        xp = dict(self.conn.execute("SELECT id, xp FROM users").fetchall())
        reward = dict(self.conn.execute("SELECT id, xp_reward FROM problems").fetchall())
        for user in (1, 2):
            assert xp[user] == sum(reward[p] for u, p in passes if u == user)


def test_lease_state_machine_keeps_the_three_principles(db):
    with db.connect() as conn:
        LeaseMachine.conn = conn
        run_state_machine_as_test(
            LeaseMachine,
            settings=settings(max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
                              suppress_health_check=list(HealthCheck)),
        )
