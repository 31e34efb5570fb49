"""A small HTTP/JSON client for the arbiter API (stdlib only), with failover across arbiter URLs."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from worker.errors import WorkerError

# A parked acquire is silent by design for up to its wait, so silence alone cannot tell a long-poll
# from an arbiter whose host died or whose link was cut: TCP keepalive probes can (the arbiter's
# kernel answers them while the request is parked). Gone after about 6 s of unanswered probes, and
# the worker parks on the next arbiter URL instead of waiting out the long-poll and its margin.
KEEPALIVE_IDLE_SECS, KEEPALIVE_INTERVAL_SECS, KEEPALIVE_PROBES = 3, 1, 3


def _probe_while_parked(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's keepalive times apply
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_SECS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_SECS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


log = logging.getLogger("worker.http")
# A lease URL that did not answer is passed over this long (its arbiter URL serves the same routes).
LEASE_URL_BENCH_SECS = 30.0


class Unreachable(WorkerError):
    """No arbiter answered (connection refused/reset, timeout, or every URL said 503)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Reply:
    status: int
    body: dict | None
    headers: dict


class ArbiterClient:
    def __init__(self, urls: list[str], credential: str | Callable[[], str], timeout: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None):
        """``credential``: the bearer credential, or a callable giving the one to send now (a file that
        a rotation replaces). ``ssl_context``: how https:// arbiters are verified (the site's CA)."""
        self.ssl_context = ssl_context
        if not urls:
            raise ValueError("at least one arbiter URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.credential = credential if callable(credential) else (lambda: credential)
        self.timeout = timeout
        self._local = threading.local()
        self._preferred = 0
        # A parked long-poll ends at once when the worker stops (abort_acquire), not at its deadline.
        self._acquire_aborted = threading.Event()
        self._acquire_sock: socket.socket | None = None
        # arbiter URL -> its lease URL, as its grants named it (lease_port; docs/protocol.md), and
        # lease URL -> until when (monotonic) it is passed over after it failed to answer.
        self._lease_urls: dict[str, str] = {}
        self._lease_url_benched: dict[str, float] = {}

    def _conn(self, base: str, timeout: float) -> http.client.HTTPConnection:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(base)
        if conn is None:
            parsed = urllib.parse.urlsplit(base)
            if parsed.scheme == "https":
                conn = http.client.HTTPSConnection(parsed.hostname, parsed.port, timeout=timeout,
                                                   context=self.ssl_context)
            else:
                conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
            conns[base] = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self, base: str) -> None:
        conn = getattr(self._local, "conns", {}).pop(base, None)
        if conn is not None:
            conn.close()

    def _send(self, base, method, path, payload, headers, timeout, parks: bool = False):
        conn = self._conn(base, timeout)
        reused = conn.sock is not None
        try:
            return self._exchange(conn, method, path, payload, headers, parks)
        except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
            if not reused or (parks and self._acquire_aborted.is_set()):
                raise
        # A kept-alive connection the server had closed: every call of this API is idempotent, so send once more.
        self._drop(base)
        conn = self._conn(base, timeout)
        return self._exchange(conn, method, path, payload, headers, parks)

    def _exchange(self, conn, method, path, payload, headers, parks: bool):
        if not parks:
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response, response.read()
        if self._acquire_aborted.is_set():
            raise Unreachable("stopping: no new acquire")
        if conn.sock is None:
            conn.connect()
        _probe_while_parked(conn.sock)
        self._acquire_sock = conn.sock
        try:
            if self._acquire_aborted.is_set():  # a stop that came while connecting
                raise Unreachable("stopping: no new acquire")
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response, response.read()
        finally:
            self._acquire_sock = None

    def abort_acquire(self) -> None:
        """The worker stops: a parked acquire ends now, and no new one is sent. Safe from a signal handler.

        Shutting the socket down makes the blocked read return at once. A lease the arbiter granted to
        that request in the meantime is never confirmed and goes back to the queue by itself, costing
        no attempt. Heartbeats and results use their own connections and are not touched."""
        self._acquire_aborted.set()
        sock = self._acquire_sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _order(self, lease_traffic: bool = False) -> list[str]:
        """Where to send a request, in order: the preferred arbiter URL and then the others; for lease
        traffic the preferred arbiter's lease URL first, unless it failed within LEASE_URL_BENCH_SECS."""
        order = self.urls[self._preferred:] + self.urls[: self._preferred]
        if lease_traffic:
            lease_url = self._lease_urls.get(order[0])
            if lease_url is not None and self._lease_url_benched.get(lease_url, 0.0) <= time.monotonic():
                order.insert(0, lease_url)
        return order

    def _failed(self, base: str, error: str) -> None:
        """``base`` did not answer: a lease URL is passed over for a while (the arbiter URL serves the
        same routes), so a lease port that is firewalled costs one timeout, not one per heartbeat."""
        if base not in self.urls:
            self._lease_url_benched[base] = time.monotonic() + LEASE_URL_BENCH_SECS
            log.warning("lease URL did not answer; lease traffic goes to the arbiter URL for a while",
                        extra={"lease_url": base, "error": error[:200], "retry_in_secs": LEASE_URL_BENCH_SECS})

    def learn_lease_port(self, port) -> None:
        """A grant from the preferred arbiter named its lease port: its lease traffic goes there, at
        the same scheme and host."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            return
        base = self.urls[self._preferred]
        parsed = urllib.parse.urlsplit(base)
        host = f"[{parsed.hostname}]" if ":" in (parsed.hostname or "") else parsed.hostname
        self._lease_urls[base] = f"{parsed.scheme}://{host}:{port}"

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
                parks: bool = False, lease_traffic: bool = False) -> Reply:
        """Send to the preferred arbiter; on connection failure or 503 try the others once.

        ``parks``: the request may be held by the server (a long-poll acquire); abort_acquire ends it.
        ``lease_traffic``: a heartbeat, result or release, tried at the lease URL first."""
        timeout = timeout or self.timeout
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.credential()}", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        last_error = "no arbiter tried"
        retry_after = None
        for base in self._order(lease_traffic):
            try:
                response, raw = self._send(base, method, path, payload, headers, timeout, parks)
            except Unreachable:
                self._drop(base)
                raise
            except (OSError, http.client.HTTPException, socket.timeout) as exc:
                if parks and self._acquire_aborted.is_set():
                    self._drop(base)
                    raise Unreachable("stopping: acquire aborted") from exc
                self._drop(base)
                last_error = f"{base}: {type(exc).__name__}: {exc}"
                self._failed(base, last_error)
                continue
            reply_headers = {k.lower(): v for k, v in response.getheaders()}
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            if response.status == 503:
                last_error = f"{base}: 503 {parsed.get('description') if isinstance(parsed, dict) else ''}"
                try:
                    retry_after = float(reply_headers.get("retry-after", "1"))
                except ValueError:
                    retry_after = 1.0
                self._failed(base, last_error)
                continue
            if base in self.urls:
                self._preferred = self.urls.index(base)
            return Reply(response.status, parsed if isinstance(parsed, dict) else None, reply_headers)
        raise Unreachable(last_error, retry_after)

    def download(self, path: str, offset: int = 0, read_bytes: int = 65536):
        """Stream a GET's body from ``offset`` on (``Range``), ``read_bytes`` at a time, from the first
        arbiter that answers. Raises Unreachable on any failure (what arrived before stays the caller's)."""
        headers = {"Authorization": f"Bearer {self.credential()}"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        last_error = "no arbiter tried"
        for base in self._order(lease_traffic=True):
            parsed = urllib.parse.urlsplit(base)
            if parsed.scheme == "https":
                conn = http.client.HTTPSConnection(parsed.hostname, parsed.port, timeout=self.timeout,
                                                   context=self.ssl_context)
            else:
                conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=self.timeout)
            try:
                try:
                    conn.request("GET", path, headers=headers)
                    response = conn.getresponse()
                except (OSError, http.client.HTTPException) as exc:
                    last_error = f"{base}: {type(exc).__name__}: {exc}"
                    self._failed(base, last_error)
                    continue
                if response.status not in (200, 206):
                    last_error = f"{base}: {response.status}"
                    response.read(4096)
                    if response.status == 503:
                        self._failed(base, last_error)
                        continue
                    raise Unreachable(last_error)
                skip = offset if response.status == 200 else 0  # a server that ignored the Range
                try:
                    while chunk := response.read(read_bytes):
                        if skip:
                            cut = min(skip, len(chunk))
                            chunk, skip = chunk[cut:], skip - cut
                            if not chunk:
                                continue
                        yield chunk
                except (OSError, http.client.HTTPException) as exc:
                    raise Unreachable(f"{base}: cut off: {type(exc).__name__}: {exc}") from None
                return
            finally:
                conn.close()
        raise Unreachable(last_error)

    # -- the protocol ----------------------------------------------------------
    def acquire(self, request_id: str, languages: list[str] | None, wait_secs: float, slot: int | None = None) -> Reply:
        body = {"request_id": request_id, "wait_secs": wait_secs}
        if languages:
            body["languages"] = languages
        if slot is not None:
            body["slot"] = slot
        # The server may hold it wait_secs; beyond that, the same margin as any request (request_timeout_secs):
        # an arbiter whose host went silent costs a parked worker no more than that before the next URL.
        reply = self.request("POST", "/v1/acquire", body, timeout=wait_secs + self.timeout, parks=True)
        if reply.status == 200 and reply.body is not None and "lease_port" in reply.body:
            self.learn_lease_port(reply.body["lease_port"])
        return reply

    def heartbeat(self, submission_id: int, lease_token: str, timeout: float | None = None) -> Reply:
        """``timeout``: how long to wait at each URL (default: the client's request timeout)."""
        return self.request("POST", f"/v1/leases/{submission_id}/heartbeat", {"lease_token": lease_token},
                            timeout=timeout, lease_traffic=True)

    def release(self, submission_id: int, lease_token: str, reason: str) -> Reply:
        return self.request("POST", f"/v1/leases/{submission_id}/release",
                            {"lease_token": lease_token, "reason": reason[:500]}, lease_traffic=True)

    def result(self, submission_id: int, payload: dict) -> Reply:
        return self.request("POST", f"/v1/leases/{submission_id}/result", payload, lease_traffic=True)
