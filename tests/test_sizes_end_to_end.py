"""Every size a site meets, end to end through the real judge-worker over HTTPS to a real arbiter that
is kept busy (its serving process stopped and continued with SIGSTOP/SIGCONT over and over, so that a
request's headers and body wait together and arrive in one read): a problem of 2,000 tests judged AC,
one judged WA at its 1,999th test, a compile error whose compiler writes megabytes; each credited
exactly once, nothing in outbox/rejected/. And the source limit at judgectl submit: the largest
source is stored, one byte more is a one-line error with nothing stored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from support.fixtures_data import seed_problem
from support.procs import doubling_tests, problem_site, wait_for

from arbiter.ctl import tlsfiles
from arbiter.store import leases

WORKER = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2, "backoff_max_secs": 1.0}
TESTS = 2000
ADD = '#include <stdio.h>\nint main(void) { long a, b; scanf("%ld %ld", &a, &b); printf("%ld\\n", a + b); return 0; }\n'
WRONG_AT_1999 = ('#include <stdio.h>\nint main(void) { long a, b; scanf("%ld %ld", &a, &b); '
                 'printf("%ld\\n", a + b + (a == 1999)); return 0; }\n')
# 170 bytes whose 10,000 macro expansions are an error each: the compiler writes about 7 MB.
LOUD_CE = ('#define E { int x = "s" * 2; }\n#define B E E E E E E E E E E\n#define C B B B B B B B B B B\n'
           '#define D C C C C C C C C C C\nint main(void) { D D D D D D D D D D return 0; }\n')


class Busy(threading.Thread):
    """Keeps the arbiter's serving process stopped most of the time (SIGSTOP 150 ms, SIGCONT 50 ms)."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.halt, self.cycles = pids, threading.Event(), 0

    def run(self):
        while not self.halt.is_set():
            for sig, secs in ((signal.SIGSTOP, 0.15), (signal.SIGCONT, 0.05)):
                for pid in self.pids:
                    os.kill(pid, sig)
                self.halt.wait(secs)
            self.cycles += 1
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
def https_site(db, arbiters, workers, tmp_path):
    seeded = problem_site(db, tmp_path, "many", doubling_tests(TESTS), time_limit_ms=2000)
    ca, _ = tlsfiles.ensure_ca(tmp_path / "ca")
    cert, key, _ = tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "arbiter", ["127.0.0.1"])
    a = arbiters.start(db.dsn, ca_file=str(ca), tls_certfile=str(cert), tls_keyfile=str(key),
                       lease_secs=120.0, grace_secs=120.0)
    w = workers("home-1", "home", "arbiter", seeded.testdata, arbiter_urls=[a.url], credential=seeded.cred,
                tls_ca_file=str(ca), **WORKER)
    return dict(db=db, arbiter=a, worker=w, problem=seeded.problem, user=seeded.user)


def test_two_thousand_tests_and_megabytes_of_compiler_output_over_https_on_a_busy_arbiter(https_site):
    db, a, w = https_site["db"], https_site["arbiter"], https_site["worker"]
    with db.connect() as conn:
        sids = {leases.submit(conn, https_site["user"], https_site["problem"], "c", source): verdict
                for source, verdict in ((ADD, "AC"), (WRONG_AT_1999, "WA"), (LOUD_CE, "CE"))}
    busy = Busy(a.worker_pids())
    busy.start()
    try:
        w.start()
        with db.connect() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                          ).fetchone()[0] == 0, 300, interval=0.5, what="all judged")
    finally:
        busy.halt.set()
        busy.join(5)
    assert busy.cycles > 10, "the arbiter was kept busy"
    with db.connect() as conn:
        rows = {sid: conn.execute("SELECT s.status, count(j.*), max(j.detail::text) FROM submissions s "
                                  "JOIN submission_judgings j ON j.submission_id = s.id WHERE s.id = %s "
                                  "GROUP BY s.status", (sid,)).fetchone() for sid in sids}
        credited = conn.execute("SELECT count(*) FROM first_passes").fetchone()[0]
    for sid, verdict in sids.items():
        assert rows[sid][:2] == (verdict, 1), (verdict, rows[sid][:2], w.log_text()[-3000:])
    import json

    details = {verdict: json.loads(rows[sid][2]) for sid, verdict in sids.items()}
    assert details["AC"]["tests_compacted"] and details["AC"]["tests"][-1]["tests"] == f"2-{TESTS}"
    assert details["WA"]["failed_test"] == 1999 and details["WA"]["tests_compacted"]
    assert 0 < len(details["CE"]["compiler_output"]) <= 4200
    assert credited == 1, "the AC credited once"
    assert not list((w.outbox / "rejected").glob("*.json")) and not w.outbox_files()
    assert "413" not in w.log_text() and "too large" not in w.log_text()


def judgectl(db, *args, source: bytes):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args, "-"], input=source,
                          capture_output=True, timeout=60)


def test_the_largest_source_is_stored_and_one_byte_more_is_a_one_line_error(db):
    with db.connect() as conn:
        seed_problem(conn, "aplusb")
    base = b"a, b = map(int, input().split())\nprint(a + b)\n#"
    largest = base + b"x" * (leases.MAX_SOURCE_BYTES - len(base))
    submit = ("submit", "--problem", "aplusb", "--user", "alice", "--language", "python3")
    stored = judgectl(db, *submit, source=largest)
    assert stored.returncode == 0, stored.stderr
    for bad, why in ((largest + b"x", f"the limit is {leases.MAX_SOURCE_BYTES} bytes"),
                     (b"print(1)\x00\n", "NUL byte"), (b"print('\xff')\n", "not UTF-8")):
        refused = judgectl(db, *submit, source=bad)
        err = refused.stderr.decode()
        assert refused.returncode != 0 and why in err and "nothing stored" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    with db.connect() as conn:
        assert conn.execute("SELECT octet_length(source) FROM submissions").fetchall() == [(leases.MAX_SOURCE_BYTES,)]
