"""What a commit costs on the replicated database (issue #30): the same durable write (a submission,
the arbiter's leases.submit: an INSERT and its NOTIFY) on one PostgreSQL (the machine's floor), on
the replicated cluster with asynchronous replication, and with the synchronous replication the site
runs (a commit returns when the standby has flushed it too).

    .venv/bin/python bench/ha.py --write docs/benchmarks.md

All on this machine: the standby is on loopback, so the figures are the protocol's and the second
fsync's cost, not a network's; between two hosts add one round trip per commit.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sections import markers, publish  # noqa: E402  (bench/ is the script's directory)

from arbiter.lab.devcluster import LocalCluster, find_pg_bindir  # noqa: E402
from arbiter.lab.hacluster import HaCluster  # noqa: E402
from arbiter.store import leases, migrations  # noqa: E402

BEGIN, END = markers("ha.py")
COMMAND = ".venv/bin/python bench/ha.py --write docs/benchmarks.md"
SOURCE = "a, b = map(int, input().split())\nprint(a + b)\n"


def prepare(connect) -> tuple[int, int]:
    with connect() as conn:
        migrations.migrate(conn)
        problem = conn.execute("INSERT INTO problems (slug, title) VALUES ('aplusb', 'A+B') RETURNING id").fetchone()[0]
        user = conn.execute("INSERT INTO users (name) VALUES ('u') RETURNING id").fetchone()[0]
    return problem, user


def sequential(connect, problem: int, user: int, n: int) -> list[float]:
    """Milliseconds of each of ``n`` commits, one after the other on one connection."""
    times = []
    with connect() as conn:
        for _ in range(n):
            t0 = time.perf_counter()
            leases.submit(conn, user, problem, "python3", SOURCE)
            times.append((time.perf_counter() - t0) * 1000)
    return times


def concurrent(connect, problem: int, user: int, clients: int, secs: float) -> float:
    """Commits per second with ``clients`` connections committing at once."""
    counts = [0] * clients
    stop = threading.Event()

    def run(i):
        with connect() as conn:
            while not stop.is_set():
                leases.submit(conn, user, problem, "python3", SOURCE)
                counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(secs)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / secs


def measure(name: str, connect, args) -> dict:
    problem, user = prepare(connect)
    sequential(connect, problem, user, 50)  # warm up
    seq = sorted(sequential(connect, problem, user, args.commits))
    rate = concurrent(connect, problem, user, args.clients, args.secs)
    result = {"name": name, "p50": statistics.median(seq), "p99": seq[int(len(seq) * 0.99) - 1], "rate": rate}
    print(f"{name}: p50 {result['p50']:.2f} ms, p99 {result['p99']:.2f} ms, {rate:.0f} commits/s "
          f"with {args.clients} clients", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--secs", type=float, default=5.0)
    parser.add_argument("--write", metavar="FILE", help="replace this script's section of FILE")
    args = parser.parse_args()
    began = time.monotonic()

    results = []
    single = LocalCluster(fast=False).init().start()  # durable: fsync and synchronous_commit on
    try:
        import psycopg

        with psycopg.connect(single.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE judge")
        results.append(measure("one PostgreSQL (the floor)",
                               lambda: psycopg.connect(single.dsn("judge"), autocommit=True), args))
    finally:
        single.destroy()
    for synchronous in (False, True):
        cluster = HaCluster(synchronous=synchronous).start()
        try:
            with cluster.connect() as admin:
                admin.execute("CREATE DATABASE judge")
            label = "replicated, synchronous (the site's setting)" if synchronous else "replicated, asynchronous"
            results.append(measure(label, lambda: cluster.connect("judge"), args))
        finally:
            cluster.destroy()

    floor = results[0]
    sync = results[-1]
    lines = [
        BEGIN,
        "## (p) a commit on the replicated database (`bench/ha.py`)",
        "",
        f"`{COMMAND}`; {platform.machine()}, {os.cpu_count()} cores, PostgreSQL {find_pg_bindir().parent.name}, "
        f"Patroni and etcd from Debian, the standby on the same machine; run took {time.monotonic() - began:.0f} s. "
        "The write is the arbiter's own `leases.submit` (an INSERT and its NOTIFY), durable in all three "
        "(fsync and synchronous_commit on). The baseline is this machine's floor: one PostgreSQL, no standby.",
        "",
        f"| setup | commit p50 | commit p99 | p50 / floor | commits/s, {args.clients} clients | / floor |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['name']} | {r['p50']:.2f} ms | {r['p99']:.2f} ms | {r['p50'] / floor['p50']:.1f}x | "
                     f"{r['rate']:.0f} | {r['rate'] / floor['rate']:.2f}x |")
    lines += [
        "",
        f"Synchronous replication costs {sync['p50'] - floor['p50']:.2f} ms a commit at p50 here (the standby's "
        "flush and its reply); between two hosts add the network's round trip. What it buys: a result the "
        "arbiter acknowledged survives the primary's death (docs/decisions.md).",
        END,
    ]
    publish(args.write, "ha.py", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
