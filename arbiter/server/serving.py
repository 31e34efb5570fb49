"""How gunicorn's worker process serves the arbiter: one asyncio event loop (uvicorn), no thread per
connection.

A parked long-poll is a coroutine awaiting its ticket's signal; an idle or slow client is a socket
and a parser on the loop. Neither holds an OS thread, so capacity is set by ``max_parked`` and file
descriptors, not threads, and a heartbeat is answered however many requests are parked or stalled.
Database calls (short) run on a bounded thread pool (``db_threads``, arbiter/server/http/app.py).

What uvicorn does not do, this module adds:
- a deadline for a request's line and headers (``header_timeout_secs``, from the request's first
  byte, or from the connection if nothing came): a client that sends half a request line and stops
  is disconnected instead of holding a connection forever (the body has its own deadline in the
  app, 408);
- on SIGTERM/SIGINT, the leader lock is given up and every parked request is answered at once
  (nothing parks again), so a stop does not wait out the long-polls: workers go to the next arbiter
  URL, where a standby waiting on the lock already leads;
- the worker process may open as many descriptors as its hard limit allows (10,000 parked requests
  need more than the usual soft limit of 1,024).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import sys
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from arbiter.server import roles
from arbiter.server.config import server_ssl_context
from arbiter.server.metrics import METRICS

log = logging.getLogger("arbiter.serving")

# What gunicorn loads in its worker process (``judge-arbiter``, the tests, the lab, the benchmarks).
APP = "arbiter.server.asgi:app"
WORKER_CLASS = "arbiter.server.serving.ArbiterWorker"
# A request line and headers larger than this are refused (ours are a few hundred bytes).
MAX_HEADER_BYTES = 32 * 1024
# The blank line that ends a request's headers (CRLF, or a bare LF, which the parser also accepts).
_HEAD_END = re.compile(rb"\r?\n\r?\n")


def _settings():
    # The settings the app module loaded (same process, same file); imported late: gunicorn imports
    # this module before the app.
    from arbiter.server.asgi import runtime

    return runtime.settings


class ArbiterHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline and a size limit for the request line and headers.

    The limit counts the request line and headers only, wherever they end inside a read: a client
    (the worker's http.client among them, whenever the arbiter is busy enough) may deliver the
    headers and the start of a large body in one read, and those body bytes are the app's to bound
    (max_body_bytes, 413), not the header limit's. Where the headers end is found before the bytes
    reach the parser, so an oversized head is refused before uvicorn starts the request.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._in_head = True  # the bytes that come next are a request line and headers
        self._head_bytes = 0  # of the current request's line and headers, received so far
        self._head_tail = b""  # the last bytes of them, to find a blank line split across reads

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(_settings().header_timeout_secs, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            METRICS.inc("arbiter_slow_clients_closed_total", phase="headers")
            self.transport.close()

    def _head_part(self, data: bytes) -> int:
        """How many bytes of ``data`` belong to the request line and headers: up to and including the
        blank line that ends them, or all of it when it is not here yet. (Blank lines before a request
        line, which a server may ignore, are skipped.)"""
        if not self._head_bytes:
            data_start = len(data) - len(data.lstrip(b"\r\n"))
        else:
            data_start = 0
        seen = self._head_tail + data[data_start:]
        end = _HEAD_END.search(seen)
        if end is None:
            return len(data)
        return data_start + end.end() - len(self._head_tail)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            head = self._head_part(data)
            self._head_bytes += head
            if self._head_bytes > MAX_HEADER_BYTES:
                METRICS.inc("arbiter_slow_clients_closed_total", phase="header_size")
                self._disarm_header_deadline()
                self.send_400_response(f"Request line and headers too large (limit {MAX_HEADER_BYTES} bytes).")
                return
            if head == len(data):
                self._head_tail = (self._head_tail + data)[-3:]
        super().data_received(data)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_deadline()  # a later request on a kept-alive connection gets its own

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        self._in_head, self._head_bytes, self._head_tail = False, 0, b""
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what comes next is the next request's (keep-alive, pipelining)

    def on_response_complete(self) -> None:
        # Between requests uvicorn's keep-alive timeout closes an idle connection.
        self._disarm_header_deadline()
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)


class ArbiterServer(Server):
    _loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        # From a signal handler: take no lock here; the loop answers the parked requests next.
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(_close_parking)

    async def on_tick(self, counter: int) -> bool:
        # uvicorn tells gunicorn it is alive every timeout_notify seconds by the wall clock
        # (time.time()). After the clock steps back (NTP, a VM resumed, or a step forward undone),
        # the last notice lies in the future: uvicorn would keep still for as long as the step and
        # gunicorn kill a healthy process after its timeout, parked workers and all. A notice from
        # the future is taken as none, so the next tick gives one.
        if self.last_notified > time.time():
            self.last_notified = 0.0
        return await super().on_tick(counter)

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    async def _serve(self, sockets=None) -> None:
        await super()._serve(sockets)
        # Release the leader lock and close connections now, then exit normally (uvicorn would
        # re-raise the signal, killing the process before anything is closed).
        runtime = getattr(sys.modules.get("arbiter.server.asgi"), "runtime", None)
        if runtime is not None:
            await asyncio.get_running_loop().run_in_executor(None, runtime.stop)
        self._captured_signals.clear()


def _close_parking() -> None:
    runtime = getattr(sys.modules.get("arbiter.server.asgi"), "runtime", None)
    if runtime is not None and runtime.role == roles.DISPATCH:
        # The lock first: a standby waiting on it leads within milliseconds, so the workers this turns
        # away find it leading (a rolling upgrade's hand-over; its requests in flight finish here).
        runtime.leader.resign()
        runtime.dispatcher.close_parking()


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


class ArbiterWorker(UvicornWorker):
    """gunicorn worker class: uvicorn on asyncio with the protocol and server above."""

    # proxy_headers off: the arbiter is never behind a proxy, the client address that decides operator
    # access (arbiter/server/http/operator_access.py) is the socket's, and nothing parses
    # X-Forwarded-For on every request (2 % of a lease process's CPU).
    CONFIG_KWARGS = {"loop": "asyncio", "http": ArbiterHttpProtocol, "lifespan": "off",
                     "ws": "none", "server_header": False, "date_header": True, "proxy_headers": False}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A stop waits this long for requests in flight; parked ones are answered at once anyway.
        self.config.timeout_graceful_shutdown = self.cfg.graceful_timeout
        self.config.backlog = max(self.config.backlog, 4096)

    def init_process(self) -> None:
        _raise_fd_limit()
        # Before the app is loaded (next, in this process): it builds what its role needs (asgi.py).
        os.environ[roles.ROLE_ENV] = roles.role_of(self)
        # The listening sockets this process does not serve are closed here (the master keeps its
        # own for the next process in either role). Held open unserved, a port whose own process has
        # exited during a stop would still take connections into its backlog, and a worker's heartbeat
        # there would wait out its request timeout, longer than a lease, instead of being refused and
        # going to the next URL at once.
        served = roles.sockets_for(roles.role_of(self), self.sockets)
        for sock in self.sockets:
            if sock not in served:
                sock.close()
        self.sockets = served
        super().init_process()

    async def _serve(self) -> None:
        self.config.app = self.wsgi  # gunicorn's name for the loaded app; here the ASGI callable
        # uvicorn's own lines (a response cut short, a protocol error) as one JSON object each, like
        # ours: the app, loaded by now, has configured the root logger (arbiter/protocol/logs.py).
        # UvicornWorker gave this logger gunicorn's plain-text handlers.
        server_log = logging.getLogger("uvicorn.error")
        server_log.handlers = []
        server_log.propagate = True
        if self.cfg.is_ssl:
            # uvicorn builds a context from gunicorn's options; ours takes its place: TLS 1.2 or newer.
            self.config.load()
            self.config.ssl = server_ssl_context(self.cfg.ssl_options["certfile"], self.cfg.ssl_options["keyfile"])
        server = ArbiterServer(config=self.config)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            from gunicorn.arbiter import Arbiter

            sys.exit(Arbiter.WORKER_BOOT_ERROR)
