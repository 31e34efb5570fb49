"""The peer of benchmark (e): Procrastinate's enqueue -> start latency with one worker (LISTEN/NOTIFY).

The app lives in this module, as Procrastinate asks (not in the __main__ module).
"""

from __future__ import annotations

import asyncio
import os
import time

import procrastinate
from psycopg.conninfo import conninfo_to_dict

_started: dict[int, float] = {}
_done = asyncio.Event()
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=""))


@app.task(name="ping")
async def ping(n: int) -> None:
    _started[n] = time.time()
    _done.set()


async def measure(dsn: str, samples: int) -> list[float]:
    # The connector was made with an empty conninfo: libpq takes the server from the PG* variables.
    for key, value in conninfo_to_dict(dsn).items():
        os.environ[f"PG{key.upper()}" if key != "dbname" else "PGDATABASE"] = str(value)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(app.run_worker_async(concurrency=1, wait=True, install_signal_handlers=False))
        await asyncio.sleep(1.5)
        out = []
        for n in range(samples):
            await asyncio.sleep(0.05)
            _done.clear()
            t0 = time.time()
            await ping.defer_async(n=n)
            await asyncio.wait_for(_done.wait(), 15)
            out.append(_started[n] - t0)
        worker.cancel()
        try:
            await worker
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the worker is being stopped
            pass
        return out
