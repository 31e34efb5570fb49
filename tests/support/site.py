"""A small judging site under a stream of submissions, for the high-availability tests (tests/ha):
one database, one or more arbiters, two workers that know every arbiter, and a client that keeps
a few submissions waiting. ``check`` holds the invariants every fault must keep."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from arbiter.store import leases, migrations
from support.checks import assert_each_submission_decided_once_by_its_last_lease
from support.procs import ArbiterProcess, WorkerProcess, add_worker, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS

# Short leases, so that an outage of the database or of the leader (seconds to tens of seconds)
# outlasts them: only the grace owed after it keeps them from being reclaimed.
ARBITER = {"lease_secs": 6.0, "unconfirmed_secs": 3.0, "grace_secs": 8.0, "long_poll_max_secs": 3.0,
           "db_timeout_secs": 2.0}
WORKER = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
          "backoff_max_secs": 1.0, "request_timeout_secs": 3.0}
# About a second of judging each (three tests), so that a fault finds results on their way.
SLOW_AC = "import time\ntime.sleep(0.3)\na, b = map(int, input().split())\nprint(a + b)\n"
BACKLOG = 4


class Site:
    """``dsn``: an empty database. ``arbiters``: name -> ArbiterProcess options (its own ``dsn``,
    ``netns``, ``address``, settings over ARBITER); by default one arbiter on ``dsn``. Workers list the arbiters in order;
    ``worker``: settings over the site's short defaults (WORKER)."""

    def __init__(self, dsn: str, root: Path, arbiters: dict[str, dict] | None = None, worker: dict | None = None,
                 slow: bool = True):
        self.dsn = dsn
        # slow: half the submissions judge for about a second (a fault finds results on their way);
        # otherwise each judges in a fraction of one, so that leases follow each other closely.
        self.kinds = ["slow", "slow", "AC", "WA"] if slow else ["AC", "WA"]
        with self.connect() as conn:
            migrations.migrate(conn)
            self.problem = conn.execute("INSERT INTO problems (slug, title, xp_reward) VALUES ('aplusb', 'A+B', 10) "
                                        "RETURNING id").fetchone()[0]
            self.user = conn.execute("INSERT INTO users (name) VALUES ('u') RETURNING id").fetchone()[0]
            creds = {w: add_worker(conn, w) for w in ("home-1", "home-2")}
        self.credentials = creds
        testdata = root / "testdata"
        write_testdata(testdata, self.problem, APLUSB_TESTS)
        specs = arbiters or {"a1": {}}
        self.arbiters = {name: ArbiterProcess(spec.pop("dsn", dsn), root, name=name, **{**ARBITER, **spec})
                         for name, spec in ((n, dict(s)) for n, s in specs.items())}
        urls = [a.url for a in self.arbiters.values()]
        # An arbiter on a namespace host is reached over plain HTTP on a private link of the test's own.
        plaintext = {"allow_plaintext": True} if any(not u.startswith("http://127.") for u in urls) else {}
        settings = {**WORKER, **(worker or {}), **plaintext}
        self.workers = [WorkerProcess(root, w, "home", "arbiter", testdata, credential=c, arbiter_urls=urls,
                                      **settings) for w, c in creds.items()]
        self.submitted: dict[int, str] = {}
        self.stop_client = threading.Event()
        self.hold_client = threading.Event()  # set: the client submits nothing for now
        self.client_errors: list[str] = []
        self._client = threading.Thread(target=self._submit_loop, name="client", daemon=True)

    @property
    def arbiter(self) -> ArbiterProcess:
        return next(iter(self.arbiters.values()))

    def connect(self):
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)

    def start(self) -> "Site":
        """The first arbiter starts first and leads; the others wait on the leader lock."""
        for i, arbiter in enumerate(self.arbiters.values()):
            arbiter.start(wait_ready=i == 0)
        for worker in self.workers:
            worker.start()
        self._client.start()
        return self

    def _submit_loop(self) -> None:
        kinds = self.kinds
        n = 0
        while not self.stop_client.is_set():
            try:
                with self.connect() as conn:
                    busy = conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                        ).fetchone()[0]
                    if busy < BACKLOG and not self.hold_client.is_set():
                        kind = kinds[n % len(kinds)]
                        source = SLOW_AC if kind == "slow" else PROGRAMS["python3"][kind]
                        sid = leases.submit(conn, self.user, self.problem, "python3", source)
                        self.submitted[sid] = "AC" if kind == "slow" else kind
                        n += 1
                        continue
            except psycopg.OperationalError:
                pass  # the primary is moving; the client tries again, as a web front end would
            except Exception as exc:  # noqa: BLE001 - a harness error must fail the test, not hang it
                self.client_errors.append(f"{type(exc).__name__}: {exc}")
                return
            self.stop_client.wait(0.1)

    def idle(self) -> bool:
        """Nothing pending or judging, every outbox empty: the workers are parked, asking for work."""
        try:
            with self.connect() as conn:
                busy = conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                    ).fetchone()[0]
        except psycopg.OperationalError:
            return False
        return busy == 0 and not any(w.outbox_files() for w in self.workers)

    def judged(self) -> int:
        try:
            with self.connect() as conn:
                return conn.execute("SELECT count(*) FROM submissions WHERE status NOT IN ('pending', 'judging')"
                                    ).fetchone()[0]
        except psycopg.OperationalError:
            return 0

    def first_grant_after(self, at: float) -> float | None:
        """When the first lease after ``at`` (epoch seconds) was granted, by the database's clock."""
        try:
            with self.connect() as conn:
                return conn.execute("SELECT extract(epoch FROM min(granted_at))::float8 FROM lease_grants "
                                    "WHERE granted_at > to_timestamp(%s)", (at,)).fetchone()[0]
        except psycopg.OperationalError:
            return None

    def first_grant_by(self, arbiter: str, after: float) -> float | None:
        """When ``arbiter`` first logged a lease granted after ``after`` (epoch seconds)."""
        arb = self.arbiters[arbiter]
        if not arb.log_path.exists():
            return None
        for line in arb.log_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "lease granted":
                at = datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
                if at > after:
                    return at
        return None

    def longest_grant_gap(self, since: float, until: float | None = None) -> float:
        """The longest wait between two lease grants after ``since`` (and up to ``until``; epoch
        seconds, DB time), while work was queued."""
        with self.connect() as conn:
            times = [t for (t,) in conn.execute(
                "SELECT extract(epoch FROM granted_at)::float8 FROM lease_grants "
                "WHERE granted_at > to_timestamp(%s) AND (%s::float8 IS NULL OR granted_at <= to_timestamp(%s)) "
                "ORDER BY granted_at", (since, until, until)).fetchall()]
        return max(b - a for a, b in zip(times, times[1:]))

    def db_time(self) -> float:
        with self.connect() as conn:
            return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

    def worker_errors(self) -> list[str]:
        return [line for w in self.workers for line in w.log_text().splitlines() if '"level": "error"' in line]

    def drain(self) -> None:
        """Stop submitting; wait until everything is judged and every outbox is empty."""
        self.stop_client.set()
        self._client.join(10)
        wait_for(self.idle, 120, 0.5, "every submission judged and every outbox delivered")

    def arbiter_events(self) -> list[dict]:
        events = []
        for arbiter in self.arbiters.values():
            if not arbiter.log_path.exists():
                continue
            for line in arbiter.log_text().splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events

    def check(self) -> None:
        """Every submission the client was told of is there and terminal with its program's verdict;
        every verdict by its newest lease, once; no result the arbiter answered 200 for was lost (an
        arbiter logs "result received" after the commit returned, so a lost one shows as a second
        "result received" for the same submission: its lease lived on, ran out, and the submission
        was judged again); no lease was reclaimed (an outage is not the workers' fault)."""
        assert not self.client_errors, self.client_errors
        with self.connect() as conn:
            status = dict(conn.execute("SELECT id, status FROM submissions").fetchall())
            missing = sorted(set(self.submitted) - set(status))
            assert not missing, f"submissions the client was told of are gone: {missing}"
            wrong = {sid: (status[sid], want) for sid, want in self.submitted.items() if status[sid] != want}
            assert not wrong, f"verdicts other than the programs' own: {wrong}"
            assert_each_submission_decided_once_by_its_last_lease(conn)
        events = self.arbiter_events()
        told = [e for e in events if e.get("event") == "result received"]
        # A result whose commit's reply never reached its arbiter (the arbiter cut off mid-call) is told
        # only by the duplicate its worker's retry meets at another arbiter.
        assert {e["submission_id"] for e in told} >= set(self.submitted), "the arbiters' logs must tell every result"
        received = Counter(e["submission_id"] for e in told if not e.get("duplicate"))
        lost = {sid: n for sid, n in received.items() if n > 1}
        assert not lost, f"results acknowledged, lost and judged again (submission: times received): {lost}"
        reclaimed = [e for e in events if e.get("event") == "lease expired"]
        assert not reclaimed, f"leases reclaimed: {reclaimed}"

    def stop(self) -> None:
        self.stop_client.set()
        for worker in self.workers:
            worker.stop()
        for arbiter in self.arbiters.values():
            if arbiter.proc is not None:
                arbiter.stop()
