"""The floor of (j) in bench/scale.py: an ASGI app that answers every request with a small JSON body,
served by the same gunicorn + uvicorn stack as the arbiter (asyncio loop, httptools parser, one
worker process), with no arbiter code at all.

With ``BENCH_FLOOR_DSN`` set, every POST also runs one single-row UPDATE transaction (autocommit) on
one of a few async connections: the least database work a heartbeat or a result can do.
"""

from __future__ import annotations

import asyncio
import json
import os

from uvicorn_worker import UvicornWorker

from arbiter.server.serving import ArbiterWorker

DSN = os.environ.get("BENCH_FLOOR_DSN")
ROW = int(os.environ.get("BENCH_FLOOR_ROW", "0"))
CONNECTIONS = 8
BODY = json.dumps({"ok": True, "lease_token": "x" * 43, "submission_id": 1}).encode()


class FloorWorker(UvicornWorker):
    """The arbiter's own uvicorn settings (arbiter/server/serving.py), with uvicorn's plain httptools protocol
    (the arbiter's adds header deadlines that read the arbiter's settings)."""

    CONFIG_KWARGS = {**ArbiterWorker.CONFIG_KWARGS, "http": "httptools"}


_idle: asyncio.Queue | None = None
_opening: asyncio.Lock | None = None


async def _connections() -> asyncio.Queue:
    """The idle connections, opened by the first POST (the others wait for it)."""
    global _idle, _opening
    if _idle is None:
        import psycopg

        _opening = _opening or asyncio.Lock()
        async with _opening:
            if _idle is None:
                queue: asyncio.Queue = asyncio.Queue()
                for _ in range(CONNECTIONS):
                    queue.put_nowait(await psycopg.AsyncConnection.connect(DSN, autocommit=True))
                _idle = queue
    return _idle


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    if DSN and scope["method"] == "POST":
        idle = await _connections()
        conn = await idle.get()
        try:
            await conn.execute("UPDATE submissions SET judge_attempts = judge_attempts WHERE id = %s", (ROW,))
        finally:
            idle.put_nowait(conn)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})
