"""A small HTTP/1.1 proxy for fault tests: drops or stalls chosen replies, delays, holds or duplicates
chosen requests, records history.

It frames messages by Content-Length (all the arbiter's API uses), so it knows which reply belongs to
which request on a kept-alive connection. Faults are armed by a marker: the next request whose path
contains it is affected. The history (one entry per exchange, wall-clock times of this host) is what
the chaos checker compares with the database; it keeps lease tokens in memory only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Exchange:
    worker_id: str
    method: str
    path: str
    body: dict | None
    sent_at: float  # when the request reached the proxy
    forwarded_at: float | None = None  # when the proxy sent it on to the server (after any delay or hold)
    status: int | None = None  # None: no reply reached the client (dropped, or the upstream failed)
    replied_at: float | None = None
    reply: dict | None = None
    dropped: bool = False
    delayed_secs: float = 0.0  # how long the request (delay, hold) or its reply (stall) was held
    duplicate: bool = False  # a second copy of a request the client sent once (duplicate_next)


@dataclass
class _Armed:
    marker: str
    kind: str  # "drop", "delay", "hold", "stall" or "duplicate"
    secs: float = 0.0  # delay, stall: how long; hold: at most how long
    taken: threading.Event = field(default_factory=threading.Event)  # a request matched: the fault is on
    fired: threading.Event = field(default_factory=threading.Event)  # the fault is over (reply dropped, request let go)
    exchange: Exchange | None = None  # the request that took it
    released: threading.Event = field(default_factory=threading.Event)  # hold: let the request go now

    def let_go(self) -> None:
        """A held request goes on to the server now."""
        self.released.set()


def _read_message(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes] | None:
    """One HTTP message (head, body) from sock; None on a clean close before any byte."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            if buffer:
                raise ConnectionError("connection closed mid-message")
            return None
        buffer.extend(chunk)
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    del buffer[:end]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(buffer) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed mid-body")
        buffer.extend(chunk)
    body = bytes(buffer[:length])
    del buffer[:length]
    return head, body


def _worker_of(head: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            credential = value.strip().split(b" ", 1)[-1]
            return credential.split(b".", 1)[0].decode(errors="replace")  # the id only, never the secret
    return ""


def _json(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class FaultProxy:
    def __init__(self, target_port: int, name: str = "", target_host: str = "127.0.0.1", listen_on: str = "127.0.0.1"):
        """Relays to target_host:target_port; clients reach it on listen_on (this machine's address on
        the clients' network: loopback, or a bridge that hosts in namespaces share)."""
        self.name = name
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((listen_on, 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://{listen_on}:{self.port}"
        self.history: list[Exchange] = []
        self._armed: list[_Armed] = []
        self._lock = threading.Lock()
        self._clients: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{name}").start()

    # -- arming faults -----------------------------------------------------------
    def drop_next(self, marker: str | bytes) -> _Armed:
        """Forward the next matching request, let the server act on it, and swallow its reply."""
        return self._arm(_Armed(marker.decode() if isinstance(marker, bytes) else marker, "drop"))

    def delay_next(self, marker: str, secs: float) -> _Armed:
        """Hold the next matching request for secs before it reaches the server (a slow network)."""
        return self._arm(_Armed(marker, "delay", secs))

    def hold_next(self, marker: str, secs: float) -> _Armed:
        """Hold the next matching request until ``let_go()`` (at most secs), then send it on even if
        its client has given up on it: a request stuck in the network that arrives late."""
        return self._arm(_Armed(marker, "hold", secs))

    def stall_next(self, marker: str, secs: float) -> _Armed:
        """Forward the next matching request at once, and hold the server's reply for secs before
        relaying it: the server acted long before its client learns so (a reply stuck in the network)."""
        return self._arm(_Armed(marker, "stall", secs))

    def duplicate_next(self, marker: str, secs: float) -> _Armed:
        """Forward the next matching request and relay its reply as usual; ``secs`` later send the
        same request again, on a connection of its own, as a network that delivers a packet twice
        (or a retry the client never made) would. The copy's exchange is in the history too."""
        return self._arm(_Armed(marker, "duplicate", secs))

    def disarm(self, armed: _Armed) -> bool:
        """Withdraw a fault that has not hit yet; False when a request already took it."""
        with self._lock:
            if armed in self._armed:
                self._armed.remove(armed)
                return True
            return False

    @property
    def dropped(self) -> int:
        return sum(1 for e in self.history if e.dropped)

    def _arm(self, armed: _Armed) -> _Armed:
        with self._lock:
            self._armed.append(armed)
        return armed

    def _take(self, path: str, exchange: Exchange) -> _Armed | None:
        with self._lock:
            for armed in self._armed:
                if armed.marker in path:
                    self._armed.remove(armed)
                    armed.exchange = exchange
                    armed.taken.set()
                    return armed
        return None

    # -- serving -------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._clients.add(client)
        upstream = None
        armed = None
        from_client, from_upstream = bytearray(), bytearray()
        try:
            while True:
                message = _read_message(client, from_client)
                if message is None:
                    return
                head, body = message
                method, path = head.split(b" ", 2)[:2]
                exchange = Exchange(_worker_of(head), method.decode(), path.decode(), _json(body), time.time())
                with self._lock:
                    self.history.append(exchange)
                armed = self._take(exchange.path, exchange)
                if armed is not None and armed.kind == "delay":
                    exchange.delayed_secs = armed.secs
                    time.sleep(armed.secs)
                    armed.fired.set()
                if armed is not None and armed.kind == "hold":
                    held_from = time.monotonic()
                    armed.released.wait(armed.secs)
                    exchange.delayed_secs = time.monotonic() - held_from
                    armed.fired.set()
                if upstream is None:
                    upstream = socket.create_connection(self.target, timeout=60)
                exchange.forwarded_at = time.time()
                upstream.sendall(head + body)
                reply = _read_message(upstream, from_upstream)
                if reply is None:
                    return
                reply_head, reply_body = reply
                if armed is not None and armed.kind == "drop":
                    exchange.dropped = True
                    armed.fired.set()
                    return  # the server did the work; the client sees its connection close instead
                if armed is not None and armed.kind == "stall":
                    exchange.delayed_secs = armed.secs
                    time.sleep(armed.secs)
                if armed is not None and armed.kind == "duplicate":
                    copy = threading.Thread(target=self._send_again, args=(exchange, head + body, armed),
                                            daemon=True)
                    copy.start()
                    armed = None  # the copy's thread ends the fault
                if armed is not None:
                    armed.fired.set()
                    armed = None
                client.sendall(reply_head + reply_body)
                exchange.status = int(reply_head.split(b" ", 2)[1])
                exchange.reply = _json(reply_body)
                exchange.replied_at = time.time()
        except OSError:
            return
        finally:
            if armed is not None:
                armed.fired.set()  # whatever happened to this exchange, the fault is over
            with self._lock:
                self._clients.discard(client)
            client.close()
            if upstream is not None:
                upstream.close()

    def _send_again(self, original: Exchange, request: bytes, armed: _Armed) -> None:
        time.sleep(armed.secs)
        copy = Exchange(original.worker_id, original.method, original.path, original.body, time.time(),
                        duplicate=True)
        with self._lock:
            self.history.append(copy)
        try:
            with socket.create_connection(self.target, timeout=60) as upstream:
                copy.forwarded_at = time.time()
                upstream.sendall(request)
                reply = _read_message(upstream, bytearray())
                if reply is not None:
                    copy.status = int(reply[0].split(b" ", 2)[1])
                    copy.reply = _json(reply[1])
                    copy.replied_at = time.time()
        except OSError:
            pass
        finally:
            armed.fired.set()

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
