"""The arbiter's request limits at their edges, over plain HTTP and TLS, against a real gunicorn process:
the request line and headers (arbiter.server.serving.MAX_HEADER_BYTES) count only themselves, wherever they
end inside a read; a body is bounded by max_body_bytes alone (413, naming the limit), Content-Length
or chunked, in one read with its headers or in many; too-deep JSON is a 400 that says so.

Once, every byte that arrived with the headers counted as header bytes: a result whose first read
passed 32 KiB (a judge's detail for 400 tests and more) got 400 "headers too large", and the worker
threw the verdict away."""

from __future__ import annotations

import json
import socket
import ssl
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker

from arbiter.ctl import tlsfiles
from arbiter.server.serving import MAX_HEADER_BYTES

MAX_BODY = 300_000  # well past the header limit, so that a body read with its headers would trip it


@pytest.fixture(params=["http", "https"])
def arbiter(request, db, arbiters, tmp_path):
    with db.connect() as conn:
        seed_problem(conn)
        seed_submissions(conn, 1)
        cred = add_worker(conn, "home-1")
    tls = {}
    if request.param == "https":
        ca, _ = tlsfiles.ensure_ca(tmp_path / "ca")
        cert, key, _ = tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "arbiter", ["127.0.0.1"])
        tls = {"ca_file": str(ca), "tls_certfile": str(cert), "tls_keyfile": str(key)}
    a = arbiters.start(db.dsn, max_body_bytes=MAX_BODY, **tls)
    context = ssl.create_default_context(cafile=tls["ca_file"]) if tls else None
    return a, cred, context


def exchange(arbiter, pieces: list[bytes]) -> tuple[int, dict | bytes]:
    """Send ``pieces`` on one new connection (each its own write, a pause between them so that each
    is a read of its own) and read one response: (status, JSON body or raw bytes)."""
    a, _, context = arbiter
    sock = socket.create_connection(("127.0.0.1", a.port), timeout=20)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    with sock:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.002)
            sock.sendall(piece)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed without a response; got {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), None)
        while length is not None and len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def split(raw: bytes, size: int = 1000) -> list[bytes]:
    return [raw[i:i + size] for i in range(0, len(raw), size)]


def head_of(total: int) -> bytes:
    """A GET /healthz whose request line and headers (blank line included) are exactly ``total`` bytes."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"p" * (total - len(start) - len(end)) + end


def post(path: str, cred: str, body: bytes, chunked: bool = False) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {cred}\r\nContent-Type: application/json\r\n"
    if not chunked:
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    chunks = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in split(body, 7000))
    return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"


def acquire_body(size: int) -> bytes:
    """An acquire that answers at once (204: the queue is empty by then), padded to ``size`` bytes."""
    body = json.dumps({"request_id": "pad", "wait_secs": 0}).encode()
    return body + b" " * (size - len(body))


def test_the_request_line_and_headers_at_their_limit(arbiter):
    for total in (MAX_HEADER_BYTES - 1, MAX_HEADER_BYTES):
        assert exchange(arbiter, [head_of(total)])[0] == 200, total
        assert exchange(arbiter, split(head_of(total)))[0] == 200, f"{total}, in many reads"
    for pieces in ([head_of(MAX_HEADER_BYTES + 1)], split(head_of(MAX_HEADER_BYTES + 1))):
        status, body = exchange(arbiter, pieces)
        assert status == 400 and f"limit {MAX_HEADER_BYTES} bytes".encode() in body, (status, body)


def test_a_body_is_bounded_by_max_body_bytes_alone_however_it_arrives(arbiter):
    _, cred, _ = arbiter
    # A whole lease lifecycle with a 2,000-row detail (~190 KB), the request in one write.
    status, lease = exchange(arbiter, [post("/v1/acquire", cred, json.dumps({"request_id": "r1", "wait_secs": 3}).encode())])
    assert status == 200, lease
    sid, token = lease["submission_id"], lease["lease_token"]
    assert exchange(arbiter, [post(f"/v1/leases/{sid}/heartbeat", cred, json.dumps(
        {"lease_token": token, "pad": "x" * 100_000}).encode())])[0] == 200
    rows = [{"test": i, "verdict": "AC", "time_ms": 12, "memory_kb": 3456, "note": "ok"} for i in range(1, 2001)]
    result = json.dumps({"lease_token": token, "verdict": "AC", "time_ms": 12, "memory_kb": 3456,
                         "detail": {"tests": rows}}).encode()
    assert 150_000 < len(result) < MAX_BODY
    status, reply = exchange(arbiter, [post(f"/v1/leases/{sid}/result", cred, result)])
    assert (status, reply.get("status")) == (200, "received"), (status, reply)

    for size, expected in ((MAX_BODY - 1, 204), (MAX_BODY, 204), (MAX_BODY + 1, 413)):
        raw = post("/v1/acquire", cred, acquire_body(size))
        for how, pieces in (("in one write with its headers", [raw]), ("in many reads", split(raw, 16384))):
            status, body = exchange(arbiter, pieces)
            assert status == expected, (size, how, status, body)
            if expected == 413:
                assert body["title"] == f"body too large (limit {MAX_BODY} bytes)", body
        status, body = exchange(arbiter, [post("/v1/acquire", cred, acquire_body(size), chunked=True)])
        assert status == expected, (size, "chunked", status, body)


def test_too_deep_json_is_a_400_that_says_so(arbiter):
    _, cred, _ = arbiter
    deep = b'{"request_id": "d", "wait_secs": 0, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    status, body = exchange(arbiter, [post("/v1/acquire", cred, deep)])
    assert status == 400 and "nests deeper" in body.get("detail", body.get("description", "")), (status, body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.one_of(st.integers(40, 2 * MAX_HEADER_BYTES), st.integers(MAX_BODY - 64, MAX_BODY + 64)),
       depth=st.integers(0, 40), cuts=st.lists(st.integers(1, 2 * MAX_BODY), max_size=4))
def test_any_body_gets_the_status_its_size_and_shape_decide_however_it_is_split(arbiter, size, depth, cuts):
    """A body of any size around the limits, nested to any depth, sent in any pieces (the first one
    with the headers): 413 past max_body_bytes, 400 past 32 levels, else the acquire's own answer."""
    _, cred, _ = arbiter
    nested = b'"x": ' + b"[" * depth + b"]" * depth + b", " if depth else b""
    body = b"{" + nested + f'"request_id": "{uuid.uuid4().hex}", "wait_secs": 0}}'.encode()
    body += b" " * max(0, size - len(body))
    raw = post("/v1/acquire", cred, body)
    edges = sorted({c for c in cuts if c < len(raw)} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in zip(edges, edges[1:])]
    expected = {413} if len(body) > MAX_BODY else {400} if depth >= 32 else {200, 204}  # 200: the seeded submission
    status, reply = exchange(arbiter, pieces)
    assert status in expected, (len(body), depth, [len(p) for p in pieces], reply)
