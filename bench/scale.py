"""The arbiter at contest scale (issue #12): one command, figures printed and, with --write, put into
docs/benchmarks.md between this script's markers (the rest of the file is left as it was):

    .venv/bin/python bench/scale.py --write docs/benchmarks.md

(h) parked capacity: 1,000 and 10,000 parked long-polls with default settings; heartbeat p50/p99
    meanwhile, next to the same heartbeats with nothing parked (the floor of this run)
(i) slow clients: 64 and 5,000 connections that send half a request line and stall; heartbeat
    p50/p99 meanwhile, and whether the kept-alive lease survived
(j) lease lifecycles per second (acquire -> heartbeat -> result, no-op judge), 20 and 200 workers
(k) contest burst: 5,000 submissions at once, 500 workers that each spend 1 s per judgement; drain
    time against the ideal (5,000 x 1 s / 500 = 10 s)
(l) database statements per second from an idle leader with 1,000 parked workers (pg_stat_statements)

Clients are asyncio connections speaking HTTP/1.1 (keep-alive) to a real arbiter under gunicorn with
its default settings (only dsn and bind set), on a PostgreSQL cluster of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from arbiter import credentials, devcluster, migrations, serving  # noqa: E402
from arbiter.sqlfiles import Statements  # noqa: E402

OPS = Statements("operator.sql")
BEGIN, END = "<!-- bench/scale.py: begin -->", "<!-- bench/scale.py: end -->"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


# -- the site and the arbiter -----------------------------------------------------------------------
class Site:
    def __init__(self, cluster, name: str):
        self.dsn = cluster.dsn(name)
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        migrations.migrate(self.conn, "stage4")
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.problem = self.conn.execute("INSERT INTO problems (slug, title) VALUES ('p', 'p') RETURNING id").fetchone()[0]
        self.user = self.conn.execute("INSERT INTO users (name) VALUES ('u') RETURNING id").fetchone()[0]
        self.dbid = self.conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        self._workers = 0

    def workers(self, count: int) -> list[str]:
        """``count`` new home workers judging python3 (one statement); their credentials."""
        creds, rows = [], []
        for _ in range(count):
            self._workers += 1
            worker_id, secret = f"w{self._workers:05d}", credentials.new_secret()
            rows.append((worker_id, credentials.hash_secret(secret)))
            creds.append(credentials.format_credential(worker_id, secret))
        with self.conn.cursor() as cur:
            cur.executemany("INSERT INTO workers (worker_id, kind, languages, secret_sha256) "
                            "VALUES (%s, 'home', ARRAY['python3'], %s)", rows)
        return creds

    def submit(self, count: int) -> list[int]:
        return [r[0] for r in self.conn.execute(
            "INSERT INTO submissions (user_id, problem_id, language, source) "
            "SELECT %s, %s, 'python3', 'print(1)' FROM generate_series(1, %s) RETURNING id",
            (self.user, self.problem, count)).fetchall()]

    def open_count(self) -> int:
        return self.conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')").fetchone()[0]

    def drain(self) -> None:
        self.conn.execute("UPDATE submissions SET status = 'CE' WHERE status IN ('pending', 'judging')")

    def statements(self) -> int:
        return int(self.conn.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = %s "
                                     "AND query NOT LIKE '%%pg_stat_statements%%'", (self.dbid,)).fetchone()[0])


class Arbiter:
    """The arbiter under gunicorn with default settings (dsn and bind only)."""

    def __init__(self, site: Site, workdir: Path):
        self.port = devcluster.free_port()
        conf = workdir / f"arbiter-{self.port}.toml"
        conf.write_text(f'dsn = "{site.dsn}"\nbind = "127.0.0.1:{self.port}"\n')
        self.log = open(workdir / "arbiter.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(REPO / "arbiter" / "gunicorn.conf.py"),
                                      serving.APP], env=dict(os.environ, JUDGE_ARBITER_CONFIG=str(conf)),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)

    async def ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                c = await Conn.open(self.port)
                status, body = await c.call("GET", "/readyz")
                c.close()
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the arbiter did not become ready")
            await asyncio.sleep(0.1)

    async def parked(self) -> int:
        c = await Conn.open(self.port)
        _, body = await c.call("GET", "/readyz")
        c.close()
        return body["parked"]

    def stop(self) -> None:
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


# -- an asyncio HTTP/1.1 client connection (keep-alive) -------------------------------------------------
class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, credential: str | None):
        self.reader, self.writer, self.credential = reader, writer, credential

    @classmethod
    async def open(cls, port: int, credential: str | None = None) -> "Conn":
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, credential)

    async def send(self, method: str, path: str, body: dict | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: arbiter\r\nContent-Length: {len(data)}\r\n"
        if self.credential:
            head += f"Authorization: Bearer {self.credential}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, dict | None]:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed by the server")
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length) if length else b""
        return status, (json.loads(data) if data and data[:1] in b"{[" else None)

    async def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
        await self.send(method, path, body)
        return await self.answer()

    def close(self) -> None:
        self.writer.close()


async def heartbeats(port: int, credential: str, sid: int, token: str, count: int, gap: float = 0.02) -> list[float]:
    """``count`` heartbeats on one kept-alive connection, the time of each."""
    c = await Conn.open(port, credential)
    out = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            status, _ = await c.call("POST", f"/v1/leases/{sid}/heartbeat", {"lease_token": token})
            out.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"heartbeat answered {status}")
            await asyncio.sleep(gap)
    finally:
        c.close()
    return out


async def holder(site: Site, arbiter: Arbiter) -> tuple[str, int, str, int]:
    """A worker with a confirmed lease: (credential, submission, token, lease_gen)."""
    (cred,) = site.workers(1)
    (sid,) = site.submit(1)
    c = await Conn.open(arbiter.port, cred)
    status, lease = await c.call("POST", "/v1/acquire", {"request_id": uuid.uuid4().hex, "wait_secs": 5})
    assert status == 200 and lease["submission_id"] == sid, (status, lease)
    status, _ = await c.call("POST", f"/v1/leases/{sid}/heartbeat", {"lease_token": lease["lease_token"]})
    c.close()
    return cred, sid, lease["lease_token"], lease["lease_gen"]


# -- (h) parked capacity ----------------------------------------------------------------------------
async def parked_capacity(site: Site, work: Path, parked: int, beats: int) -> dict:
    arbiter = Arbiter(site, work)
    conns: list[Conn] = []
    try:
        await arbiter.ready()
        cred, sid, token, _ = await holder(site, arbiter)
        floor = await heartbeats(arbiter.port, cred, sid, token, beats)
        creds = site.workers((parked + 3) // 4)  # a worker may park 4 (max_parked_per_worker)
        async def park(credential: str) -> None:
            c = await Conn.open(arbiter.port, credential)
            conns.append(c)
            await c.send("POST", "/v1/acquire", {"request_id": uuid.uuid4().hex, "wait_secs": 30})

        t0 = time.monotonic()
        for start in range(0, parked, 500):
            await asyncio.gather(*(park(creds[i // 4]) for i in range(start, min(parked, start + 500))))
        while await arbiter.parked() < parked and time.monotonic() - t0 < 120:
            await asyncio.sleep(0.2)
        settled = await arbiter.parked()
        took = time.monotonic() - t0
        loaded = await heartbeats(arbiter.port, cred, sid, token, beats)
        return {"parked": settled, "park_secs": took, "refused": parked - settled,
                "floor": [pct(floor, 50), pct(floor, 99)], "loaded": [pct(loaded, 50), pct(loaded, 99)]}
    finally:
        for c in conns:
            c.close()
        arbiter.stop()
        site.drain()


# -- (i) slow clients --------------------------------------------------------------------------------
async def slow_clients(site: Site, work: Path, stalled: int, beats: int) -> dict:
    arbiter = Arbiter(site, work)
    writers = []
    try:
        await arbiter.ready()
        cred, sid, token, gen = await holder(site, arbiter)
        floor = await heartbeats(arbiter.port, cred, sid, token, beats)

        async def stall() -> None:
            _, writer = await asyncio.open_connection("127.0.0.1", arbiter.port)
            writer.write(b"POST /v1/acq")
            await writer.drain()
            writers.append(writer)

        for start in range(0, stalled, 500):
            await asyncio.gather(*(stall() for _ in range(start, min(stalled, start + 500))))
        loaded = await heartbeats(arbiter.port, cred, sid, token, beats)
        kept = site.conn.execute("SELECT status = 'judging' AND lease_token = %s AND lease_gen = %s "
                                 "FROM submissions WHERE id = %s", (token, gen, sid)).fetchone()[0]
        return {"floor": [pct(floor, 50), pct(floor, 99)], "loaded": [pct(loaded, 50), pct(loaded, 99)],
                "lease_kept": bool(kept)}
    finally:
        for w in writers:
            w.close()
        arbiter.stop()
        site.drain()


# -- (j) lifecycles per second, (k) contest burst ------------------------------------------------------
async def run_workers(site: Site, work: Path, workers: int, submissions: int, judge_secs: float,
                      limit_secs: float) -> dict:
    arbiter = Arbiter(site, work)
    stop = asyncio.Event()
    done = 0
    try:
        await arbiter.ready()
        creds = site.workers(workers)

        async def worker(credential: str) -> None:
            nonlocal done
            c = await Conn.open(arbiter.port, credential)
            try:
                while not stop.is_set():
                    status, lease = await c.call("POST", "/v1/acquire", {"request_id": uuid.uuid4().hex, "wait_secs": 5})
                    if status != 200:
                        if status != 204:
                            await asyncio.sleep(0.5)
                        continue
                    sid, token = lease["submission_id"], lease["lease_token"]
                    await c.call("POST", f"/v1/leases/{sid}/heartbeat", {"lease_token": token})
                    if judge_secs:
                        await asyncio.sleep(judge_secs)
                    status, _ = await c.call("POST", f"/v1/leases/{sid}/result",
                                             {"lease_token": token, "verdict": "AC", "time_ms": 1})
                    done += status == 200
            except (ConnectionError, OSError):
                pass
            finally:
                c.close()

        tasks = [asyncio.create_task(worker(cred)) for cred in creds]
        deadline = time.monotonic() + 60
        while await arbiter.parked() < workers and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        site.submit(submissions)
        while done < submissions and time.monotonic() - t0 < limit_secs:
            await asyncio.sleep(0.02)
        elapsed = time.monotonic() - t0
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"done": done, "secs": elapsed, "per_sec": done / elapsed}
    finally:
        arbiter.stop()
        site.drain()


# -- (l) idle statements ---------------------------------------------------------------------------------
async def idle_statements(site: Site, work: Path, parked: int, secs: float) -> float:
    arbiter = Arbiter(site, work)
    conns = []
    try:
        await arbiter.ready()
        creds = site.workers((parked + 3) // 4)

        async def park(credential: str) -> None:
            c = await Conn.open(arbiter.port, credential)
            conns.append(c)
            await c.send("POST", "/v1/acquire", {"request_id": uuid.uuid4().hex, "wait_secs": 30})

        for start in range(0, parked, 500):
            await asyncio.gather(*(park(creds[i // 4]) for i in range(start, min(parked, start + 500))))
        while await arbiter.parked() < parked:
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)  # the parking's own statements are done
        before = site.statements()
        t0 = time.monotonic()
        await asyncio.sleep(secs)  # less than the long-polls' 30 s: all stay parked
        after = site.statements()
        return (after - before) / secs
    finally:
        for c in conns:
            c.close()
        arbiter.stop()


async def measure(site: Site, work: Path, beats: int, say) -> dict:
    results: dict = {"parked": {}, "slow": {}, "lifecycles": {}}
    say("## (h) parked capacity: long-polls parked with default settings, heartbeats meanwhile")
    say()
    say("| parked | refused | heartbeat p50 / p99, nothing parked (floor) | heartbeat p50 / p99, parked | "
        "p99 / floor p99 |")
    say("|---|---|---|---|---|")
    for n in (1000, 10000):
        r = await parked_capacity(site, work, n, beats)
        results["parked"][n] = r
        say(f"| {r['parked']:,} of {n:,} (in {r['park_secs']:.1f} s) | {r['refused']} | {ms(r['floor'][0])} / "
            f"{ms(r['floor'][1])} | {ms(r['loaded'][0])} / {ms(r['loaded'][1])} | {r['loaded'][1] / r['floor'][1]:.1f}x |")
    say()
    say("## (i) slow clients: connections that send half a request line and stall, heartbeats meanwhile")
    say()
    say("| stalled connections | heartbeat p50 / p99, floor | heartbeat p50 / p99, stalled | lease kept |")
    say("|---|---|---|---|")
    for n in (64, 5000):
        r = await slow_clients(site, work, n, beats)
        results["slow"][n] = r
        say(f"| {n:,} | {ms(r['floor'][0])} / {ms(r['floor'][1])} | {ms(r['loaded'][0])} / {ms(r['loaded'][1])} | "
            f"{'yes' if r['lease_kept'] else 'NO'} |")
    say()
    say("## (j) lease lifecycles per second (acquire -> heartbeat -> result, no-op judge, 20 s at most)")
    say()
    say("| workers | lifecycles | per second |")
    say("|---|---|---|")
    for n in (20, 200):
        r = await run_workers(site, work, n, 4000, 0.0, 20.0)
        results["lifecycles"][n] = r
        say(f"| {n} | {r['done']:,} in {r['secs']:.1f} s | {r['per_sec']:.0f}/s |")
    say()
    say("## (k) contest burst: 5,000 submissions at once, 500 workers spending 1 s per judgement")
    say()
    r = await run_workers(site, work, 500, 5000, 1.0, 120.0)
    results["burst"] = r
    ideal = 5000 * 1.0 / 500
    say("| judged | drain time | ideal | drain / ideal |")
    say("|---|---|---|---|")
    say(f"| {r['done']:,} | {r['secs']:.1f} s | {ideal:.0f} s | {r['secs'] / ideal:.2f}x |")
    say()
    say("## (l) statements per second from an idle leader with 1,000 parked workers (pg_stat_statements, 20 s)")
    say()
    r = await idle_statements(site, work, 1000, 20.0)
    results["idle"] = r
    say(f"| parked | statements/s |\n|---|---|\n| 1,000 | {r:.2f}/s |")
    say()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", help="put the results into this markdown file, between this script's markers")
    parser.add_argument("--beats", type=int, default=200, help="heartbeats per measurement (default 200)")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="judge-bench-scale-"))
    work.chmod(0o755)
    cluster = devcluster.LocalCluster(work / "pg", fast=True, settings={
        "shared_preload_libraries": "'pg_stat_statements'", "max_connections": "200"}).init().start()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    try:
        site = Site(cluster, "bench_scale")
        results = asyncio.run(measure(site, work, args.beats, say))
    finally:
        cluster.destroy()
    elapsed = time.monotonic() - started
    print(f"done in {elapsed:.0f} s", flush=True)
    if args.write:
        head = [BEGIN, "", "# The arbiter at contest scale (issue #12)", "",
                "Produced by `.venv/bin/python bench/scale.py --write docs/benchmarks.md`: one arbiter under gunicorn "
                "with its default settings, asyncio HTTP/1.1 clients (keep-alive) in one process on the same machine.",
                f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
                f"PostgreSQL {cluster.bindir.parent.name}; run took {elapsed:.0f} s.", ""]
        section = "\n".join(head + lines) + "\n" + END + "\n"
        path = Path(args.write)
        old = path.read_text() if path.exists() else ""
        if BEGIN in old and END in old:
            new = old[:old.index(BEGIN)] + section + old[old.index(END) + len(END) + 1:]
        else:
            new = old.rstrip("\n") + "\n\n" + section
        path.write_text(new)
        path.with_name("benchmarks-scale.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
