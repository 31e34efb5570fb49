"""Test data through the database and the arbiter, against a plain file copy (issue #15).

One data set with one large file (1 GiB by default): ``judgectl problem data`` stores it in
PostgreSQL (1 MiB chunks), then a worker's DataStore fetches it from a real arbiter under gunicorn
(plain HTTP on loopback, as the lab's floor) into an empty cache, verifying it. The baselines, same
machine, same run: ``cp`` of the file, and ``sha256sum`` of it (what any verified copy must pay).
Peak RSS of the fetching process, before and after, says whether memory stays flat.

    .venv/bin/python bench/data.py --write docs/benchmarks.md [--mb 1024]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sections import markers, write_section  # noqa: E402

from arbiter.lab import devcluster
from arbiter.protocol import testdata  # noqa: E402
from arbiter.server import serving
from arbiter.store import credentials, migrations  # noqa: E402

BEGIN, END = markers("data.py")
FETCH = """
import resource, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from worker.judging.datastore import DataStore
from worker.delivery.http_client import ArbiterClient
store = DataStore(Path(sys.argv[2]), ArbiterClient([sys.argv[3]], sys.argv[4], timeout=60))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
store.ensure(int(sys.argv[6]), sys.argv[5])
print(time.monotonic() - t0, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the large test file (default 1024)")
    parser.add_argument("--write", help="put the results into this markdown file, between this script's markers")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="judge-bench-data-"))
    work.chmod(0o755)
    cluster = devcluster.LocalCluster(work / "pg", fast=True).init().start()
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    arbiter = None
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrations.migrate(conn, "stage4")
            problem = conn.execute("INSERT INTO problems (slug, title) VALUES ('big', 'big') RETURNING id").fetchone()[0]
            secret = credentials.new_secret()
            conn.execute("INSERT INTO workers (worker_id, kind, secret_sha256) VALUES ('w1', 'home', %s)",
                         (credentials.hash_secret(secret),))
        data = work / "data"
        data.mkdir()
        (data / "1.in").write_text("1 2\n")
        (data / "1.out").write_text("3\n")
        big = data / "2.in"
        with open(big, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        (data / "2.out").write_text("x\n")
        subprocess.run(["sync"], check=True)
        size = big.stat().st_size
        digest = testdata.directory_digest(data)

        store_secs = timed([sys.executable, "-m", "arbiter.ctl.main", "--dsn", dsn, "problem", "data", "big", str(data)])
        port = devcluster.free_port()
        conf = work / "arbiter.toml"
        conf.write_text(f'dsn = "{dsn}"\nbind = "127.0.0.1:{port}"\n')
        log = open(work / "arbiter.log", "ab")
        arbiter = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(REPO / "arbiter" / "server" / "gunicorn.conf.py"),
                                    serving.APP], env=dict(os.environ, JUDGE_ARBITER_CONFIG=str(conf)),
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the arbiter did not become ready")
            time.sleep(0.1)
        fetched = subprocess.run([sys.executable, "-c", FETCH, str(REPO), str(work / "cache"), f"http://127.0.0.1:{port}",
                                  credentials.format_credential("w1", secret), digest, str(problem)],
                                 capture_output=True, text=True, check=True)
        fetch_secs, rss_before, rss_after = (float(x) for x in fetched.stdout.split())
        copy_secs = timed(["cp", str(big), str(work / "copy.bin")])
        hash_secs = timed(["sha256sum", str(big)])
        mb = size / (1 << 20)
        say("| step | seconds | MB/s | against the floor |")
        say("|---|---|---|---|")
        say(f"| floor: `cp` of the file | {copy_secs:.1f} | {mb / copy_secs:.0f} | 1.0x |")
        say(f"| floor: `sha256sum` of the file | {hash_secs:.1f} | {mb / hash_secs:.0f} | "
            f"{hash_secs / copy_secs:.1f}x the copy |")
        say(f"| `judgectl problem data` (hash, then store in PostgreSQL) | {store_secs:.1f} | {mb / store_secs:.0f} | "
            f"{store_secs / (copy_secs + hash_secs):.1f}x copy + hash |")
        say(f"| worker fetch from the arbiter (stream, verify, lay out) | {fetch_secs:.1f} | {mb / fetch_secs:.0f} | "
            f"{fetch_secs / (copy_secs + hash_secs):.1f}x copy + hash |")
        say("")
        say(f"Peak RSS of the fetching process: {rss_before / 1024:.1f} MB before, {rss_after / 1024:.1f} MB after "
            f"fetching {mb:.0f} MB (grew {(rss_after - rss_before) / 1024:.1f} MB): the file streams through "
            "64 KiB reads into its `.part` file; the arbiter sends 1 MiB chunks one at a time.")
    finally:
        if arbiter is not None:
            import signal

            os.killpg(arbiter.pid, signal.SIGTERM)
            arbiter.wait(20)
        cluster.destroy()
        subprocess.run(["rm", "-rf", str(work)])
    elapsed = time.monotonic() - started
    print(f"done in {elapsed:.0f} s", flush=True)
    if args.write:
        head = [BEGIN, "", f"## (n) test data: {args.mb} MB through the database and the arbiter (`bench/data.py`)", "",
                f"`.venv/bin/python bench/data.py --write docs/benchmarks.md --mb {args.mb}`; {os.cpu_count()} cores; "
                f"run took {elapsed:.0f} s. The floor is this machine's own: a plain copy and a hash of the same file.",
                ""]
        write_section(args.write, "data.py", "\n".join(head + lines) + "\n" + END + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
