"""docs/protocol.md's table "Every answer and what the worker does", walked row by row: a server
answers each status in turn, and the worker's own transport must do what the row says.

The server stands for the arbiter's HTTP answers only (what the worker does with a status is the
worker's code, whatever produced the status); every status in the table is one the arbiter answers
(tests/test_arbiter_http.py and the scenario tests make each of them for real)."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from worker.config import SandboxConfig, WorkerConfig
from worker.delivery.assignment import Assignment
from worker.delivery.outbox import Entry
from worker.delivery.transport_arbiter import ArbiterTransport, Heartbeats
from worker.judging.judge import Job

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
ROW = re.compile(r"^\| (result|heartbeat|acquire|release) \| (\d{3}) \| [^|]+ \| `(\w+)` \|$", re.M)
LEASE = {"submission_id": 7, "lease_token": "t" * 36, "lease_gen": 1, "language": "python3", "source": "",
         "problem": {"id": 1, "slug": "p", "time_limit_ms": 1000, "memory_limit_kb": 65536}}


def table() -> list[tuple[str, int, str]]:
    rows = [(endpoint, int(status), outcome) for endpoint, status, outcome in ROW.findall(DOC.read_text())]
    assert len(rows) >= 25, "the table in docs/protocol.md was not found"
    return rows


class Answering(ThreadingHTTPServer):
    daemon_threads = True
    status = 200
    retry_after = "0"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status = self.server.status
        body = json.dumps(LEASE if status == 200 and self.path == "/v1/acquire" else {"title": f"status {status}"})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", self.server.retry_after)
        self.send_header("Content-Length", str(len(body)) if status != 204 else "0")
        self.end_headers()
        if status != 204:
            self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = Answering(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def transport(server, tmp_path, port: int | None = None, backoff_max_secs: float = 0.02) -> ArbiterTransport:
    cfg = WorkerConfig(worker_id="home-1", kind="home", transport="arbiter", outbox_dir=tmp_path / "o",
                       testdata_dir=tmp_path, work_dir=tmp_path / "w", sandbox=SandboxConfig(),
                       arbiter_urls=(f"http://127.0.0.1:{port or server.server_address[1]}",),
                       credential="home-1.secret", backoff_initial_secs=0.01, backoff_max_secs=backoff_max_secs,
                       request_timeout_secs=5.0)
    return ArbiterTransport(cfg)


def outcome_of(endpoint: str, t: ArbiterTransport) -> str:
    job = Job(submission_id=7, problem_id=1, problem_slug="p", language="python3", source="", time_limit_ms=1000,
              memory_limit_kb=65536)
    assignment = Assignment(job, "t" * 36, 1, "arbiter")
    if endpoint == "result":
        outcome = t.deliver(Entry(transport="arbiter", submission_id=7, verdict="AC", lease_token="t" * 36,
                                  lease_gen=1, detail={"tests": []}))
        return outcome.kind.value
    if endpoint == "heartbeat":
        beats = Heartbeats(t.client, assignment, 1.0, 1.0)
        beats.beat()
        return "lost" if beats.lost.is_set() else "alive"
    if endpoint == "acquire":
        stopping = threading.Event()
        stopping.set()  # the waits between asks return at once
        return "lease" if t.next_assignment(stopping) is not None else "ask_again"
    return t.release(assignment, "test")


@pytest.mark.parametrize("endpoint,status,expected", table())
def test_the_worker_does_what_the_table_says(server, tmp_path, endpoint, status, expected):
    server.status = status
    assert outcome_of(endpoint, transport(server, tmp_path)) == expected


def test_the_table_covers_every_refusal_the_arbiter_counts():
    """The arbiter counts a result answer as refused (arbiter_results_refused_total) exactly when the
    worker does not retry it and does not take it as the end of its lease: one rule, in the seam
    (arbiter.protocol.delivery), and the table agrees with it row by row."""
    from arbiter.protocol.delivery import is_refusal

    rows = {s: o for e, s, o in table() if e == "result"}
    for status, outcome in rows.items():
        assert is_refusal(status) == (outcome in ("reject", "too_large")), (status, outcome)
    assert rows[413] == "too_large"


class Waits(threading.Event):
    """A stop event that is never set and records each wait asked of it (returning at once)."""

    def __init__(self):
        super().__init__()
        self.asked: list[float] = []

    def wait(self, timeout=None):
        self.asked.append(timeout)
        return False


def test_a_refusal_that_says_when_is_waited_as_told_and_silence_backs_off(server, tmp_path):
    """A 503 with Retry-After (the database away during a failover, a leader handing over) is waited
    as the arbiter says, every time, with at most 20 % jitter: the worker is back within about a
    second of the new primary answering. Silence (nothing listens) grows the exponential series.
    The same for a result in the outbox: the arbiter's Retry-After comes back with the RETRY."""
    server.status, server.retry_after = 503, "1"
    try:
        told = transport(server, tmp_path, backoff_max_secs=30.0)
        stop = Waits()
        for _ in range(10):  # past where the series would have passed 1 s (0.01 * 2 ** 7)
            assert told.next_assignment(stop) is None
        assert all(1.0 <= d <= 1.2 for d in stop.asked), stop.asked

        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            closed_port = unused.getsockname()[1]
        silent = transport(server, tmp_path, port=closed_port, backoff_max_secs=30.0)
        stop = Waits()
        for _ in range(6):
            assert silent.next_assignment(stop) is None
        assert stop.asked[-1] > 4 * stop.asked[0] and stop.asked[-1] > 0.25, stop.asked

        outcome = told.deliver(Entry(transport="arbiter", submission_id=7, verdict="AC", lease_token="t" * 36,
                                     lease_gen=1, detail={"tests": []}))
        assert (outcome.kind.value, outcome.retry_after) == ("retry", 1.0)
    finally:
        server.status, server.retry_after = 200, "0"
