"""judge-lab: the whole system on one machine, in one command.

Embedded PostgreSQL (a throwaway cluster), the arbiter under gunicorn and the
workers home-1, home-2 and prod-1, all run by supervisord as in production,
sample problems with test data and a batch of real submissions with mixed
verdicts. Shows live progress until everything is judged, then a summary
table. ``--chaos`` kill -9s programs along the way (supervisord restarts them).
``--ha`` runs the replicated topology instead: PostgreSQL on two hosts under
Patroni with three etcd members (arbiter/lab/hacluster.py) and two arbiters,
and in the middle of the run kills the database primary (-9, the whole host),
then the leading arbiter; the summary says how long each took to be followed
by a lease. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg

from arbiter.ctl import tlsfiles
from arbiter.lab import devcluster, hacluster
from arbiter.server import serving
from arbiter.store import credentials, leases, migrations
from arbiter.store.sqlfiles import Statements

OPS = Statements("operator.sql")
LAB = Statements("lab.sql")

APLUSB = [("1 2\n", "3\n"), ("10 20\n", "30\n"), ("-5 5\n", "0\n")]
REVERSE = [("abc\n", "cba\n"), ("racecar\n", "racecar\n")]
# Mid-run, this problem's test data gains a case (as when data is fixed during a contest): what was
# judged with the old data is rejudged (judgectl rejudge --data-changed), workers fetch the new data.
CHANGED_PROBLEM = "reverse"
REVERSE_V2 = [*REVERSE, ("judge\n", "egduj\n")]
# Judge slots per lab worker: the production worker runs two (one per CPU) where there are two CPUs.
LAB_SLOTS = {"home-1": 1, "home-2": 1, "prod-1": min(2, len(os.sched_getaffinity(0)))}

SAMPLES = {  # (problem, language, expected verdict): source
    ("aplusb", "python3", "AC"): "a, b = map(int, input().split())\nprint(a + b)\n",
    ("aplusb", "c", "AC"): "#include <stdio.h>\nint main(void){long a,b;scanf(\"%ld %ld\",&a,&b);"
                           "printf(\"%ld\\n\",a+b);return 0;}\n",
    ("aplusb", "cpp", "AC"): "#include <iostream>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}\n",
    ("aplusb", "python3", "WA"): "a, b = map(int, input().split())\nprint(a * b)\n",
    ("aplusb", "c", "CE"): "int main(void){ return missing; }\n",
    ("aplusb", "python3", "TLE"): "while True:\n    pass\n",
    ("aplusb", "cpp", "RE"): "int main(){volatile int*p=nullptr;*p=1;}\n",
    ("aplusb", "python3", "MLE"): "x = bytearray(1 << 30)\nprint(len(x))\n",
    ("reverse", "python3", "AC"): "print(input()[::-1])\n",
    ("reverse", "python3", "OLE"): "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    ("reverse", "cpp", "AC"): "#include <iostream>\n#include <string>\n#include <algorithm>\n"
                              "int main(){std::string s;std::cin>>s;std::reverse(s.begin(),s.end());"
                              "std::cout<<s<<'\\n';}\n",
}


def _write_testdata(root: Path, problem_id: int, cases) -> None:
    d = root / str(problem_id)
    d.mkdir(parents=True, exist_ok=True)
    for i, (given, expected) in enumerate(cases, 1):
        (d / f"{i}.in").write_text(given)
        (d / f"{i}.out").write_text(expected)


class JudgectlError(RuntimeError):
    pass


class HaPhase(enum.Enum):
    """--ha: what the run does to the site next. Each fault is timed to the first lease granted after
    it; the old primary rejoins meanwhile, and the run ends only once it streams again."""
    BEFORE = "before the arbiter takeover"
    ARBITER_KILLED = "leading arbiter killed, waiting for a lease"
    DB_KILLED = "database primary killed, waiting for a lease"
    REJOINING = "old primary rejoining as a standby"
    DONE = "both faults over, every database host streaming"


class Lab:
    def __init__(self, base: Path, copies: int, chaos: bool, ha: bool = False):
        self.base = base
        self.copies = copies
        self.chaos = chaos
        self.ha = ha
        self.ha_phase = HaPhase.BEFORE
        self.ha_report: list[str] = []
        self._struck_at = 0.0
        self._struck = ""
        self.arbiter_urls: dict[str, str] = {}
        self.programs: list[str] = []
        self.supervisord: subprocess.Popen | None = None
        self.cluster = None
        self.kills = 0
        self.data_changed = False
        self.rejudged: set[int] = set()

    def _program(self, name: str, argv: list[str], env: dict) -> str:
        environment = ",".join(f'{k}="{v}"' for k, v in env.items())
        self.programs.append(name)
        return "\n".join([
            f"[program:{name}]", f"command={' '.join(argv)}", f"environment={environment}" if env else "",
            "autostart=true", "autorestart=true", "startsecs=1", "startretries=1000", "stopsignal=TERM",
            "stopwaitsecs=15", "stopasgroup=true", "killasgroup=true", "redirect_stderr=true",
            f"stdout_logfile={self.base / name}.log", ""])

    def _supervisorctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).with_name("supervisorctl")), "-c",
                               str(self.base / "supervisord.conf"), *args], capture_output=True, text=True, timeout=60)

    def _start_supervisord(self, programs: list[str]) -> None:
        conf = self.base / "supervisord.conf"
        conf.write_text("\n".join([
            "[unix_http_server]", f"file={self.base / 'supervisor.sock'}", "chmod=0700", "",
            "[supervisord]", f"logfile={self.base / 'supervisord.log'}", f"pidfile={self.base / 'supervisord.pid'}",
            f"childlogdir={self.base}", "", "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface", "",
            "[supervisorctl]", f"serverurl=unix://{self.base / 'supervisor.sock'}", "", *programs]))
        self.supervisord = subprocess.Popen([str(Path(sys.executable).with_name("supervisord")), "--nodaemon",
                                             "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def setup(self) -> dict[int, str]:
        print(f"lab directory: {self.base}\n"
              f"programs run by supervisord: supervisorctl -c {self.base}/supervisord.conf status")
        if self.ha:
            print("starting three etcd members and two PostgreSQL hosts under Patroni (synchronous replication)")
            self.cluster = hacluster.HaCluster(self.base / "ha").start()
        else:
            self.cluster = devcluster.LocalCluster(self.base / "pg").init().start()
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE judge")
        self.dsn = self.cluster.dsn("judge")
        expected: dict[int, str] = {}
        testdata = self.base / "testdata"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            migrations.migrate(conn)
            problems = {}
            for slug, cases in (("aplusb", APLUSB), ("reverse", REVERSE)):
                pid = conn.execute(OPS.add_problem, {"slug": slug, "title": slug, "xp_reward": 10, "time_limit_ms": 1000,
                                                     "memory_limit_kb": 131072, "comparer": "tokens",
                                                     "checker_sha256": None}).fetchone()[0]
                problems[slug] = pid
                _write_testdata(testdata, pid, cases)
            self.problems = problems
            self.creds = {}
            for wid in ("home-1", "home-2", "prod-1"):
                secret = credentials.new_secret()
                conn.execute(OPS.add_worker, {"worker_id": wid, "kind": "production" if wid.startswith("prod") else "home",
                                              "languages": ["c", "cpp", "python3"],
                                              "secret_sha256": credentials.hash_secret(secret),
                                              "slots": LAB_SLOTS[wid]})
                self.creds[wid] = credentials.format_credential(wid, secret)
            users = [conn.execute(OPS.ensure_user, {"name": f"user{i}"}).fetchone()[0] for i in range(5)]
            rng = random.Random(7)
            for copy in range(self.copies):
                for (slug, lang, verdict), source in SAMPLES.items():
                    sid = leases.submit(conn, rng.choice(users), problems[slug], lang, source)
                    expected[sid] = verdict
        # HTTPS as in production: the lab's own CA, the arbiter's certificate, workers trusting that CA only.
        self.ca_file, _ = tlsfiles.ensure_ca(self.base / "tls" / "ca", "judge-lab CA")
        certfile, keyfile, _ = tlsfiles.issue_server_cert(self.base / "tls" / "ca", self.base / "tls", ["127.0.0.1"])
        gunicorn_conf = Path(__file__).resolve().parents[1] / "server" / "gunicorn.conf.py"
        programs = []
        # --ha: two arbiters (one leads, the other waits on the leader lock), in every worker's list.
        for name in ("arbiter-1", "arbiter-2") if self.ha else ("arbiter",):
            port = devcluster.free_port()
            self.arbiter_urls[name] = f"https://127.0.0.1:{port}"
            conf = self.base / f"{name}.toml"
            conf.write_text(f"dsn = {json.dumps(self.dsn)}\nbind = \"127.0.0.1:{port}\"\nlease_secs = 20.0\n"
                            f"unconfirmed_secs = 5.0\ngrace_secs = 20.0\ntls_certfile = \"{certfile}\"\n"
                            f"tls_keyfile = \"{keyfile}\"\ninstance_name = \"{name}\"\n"
                            # --chaos kills a program every few seconds, far more often than any site loses a
                            # worker: a slow submission can lose three leases in a row to it and would end
                            # system_error by the poison rule (max_attempts 3), which is not what the lab tests.
                            + ("max_attempts = 10\n" if self.chaos else ""))
            programs.append(self._program(name, [sys.executable, "-m", "gunicorn", "-c", str(gunicorn_conf),
                                                 serving.APP], {"JUDGE_ARBITER_CONFIG": str(conf)}))
        self.url = next(iter(self.arbiter_urls.values()))
        urls = ", ".join(f'"{u}"' for u in self.arbiter_urls.values())
        work = Path(tempfile.mkdtemp(prefix="judge-lab-work-", dir="/tmp"))
        work.chmod(0o711)
        self.work = work
        for wid, cred in self.creds.items():
            home = self.base / wid
            home.mkdir()
            (home / "credential").write_text(cred + "\n")
            (home / "credential").chmod(0o600)
            (home / "worker.toml").write_text(
                f'worker_id = "{wid}"\nkind = "{"production" if wid.startswith("prod") else "home"}"\n'
                f'transport = "arbiter"\narbiter_urls = [{urls}]\ncredential_file = "{home / "credential"}"\n'
                f'tls_ca_file = "{self.ca_file}"\n'
                f'outbox_dir = "{home / "outbox"}"\ntestdata_dir = "{testdata}"\nwork_dir = "{work / wid}"\n'
                'heartbeat_interval_secs = 5.0\nlong_poll_secs = 10.0\nbackoff_max_secs = 5.0\n'
                # The production worker judges with two slots (as many as the arbiter registered), one per CPU.
                + (f"slots = {LAB_SLOTS[wid]}\n" if LAB_SLOTS[wid] > 1 else ""))
            programs.append(self._program(wid, [sys.executable, "-m", "worker.main", "--config",
                                                str(home / "worker.toml")], {}))
        self._start_supervisord(programs)
        return expected

    def unleash_chaos(self) -> None:
        """kill -9 a random program's whole process group now and then; supervisord restarts it."""
        if not (self.chaos and random.random() < 0.08):
            return
        victim = random.choice(self.programs)
        pid = self._supervisorctl("pid", victim).stdout.strip()
        if pid.isdigit() and int(pid) > 0:
            try:
                os.killpg(int(pid), signal.SIGKILL)
                self.kills += 1
            except ProcessLookupError:
                pass

    def leading_arbiter(self) -> str | None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        for name, url in self.arbiter_urls.items():
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2, context=context) as reply:
                    body = json.load(reply)
            except urllib.error.HTTPError as exc:
                body = json.load(exc)
            except (OSError, ValueError):
                continue
            if body.get("leader"):
                return name
        return None

    def ha_step(self, conn, done: int, total: int, elapsed: float) -> None:
        """--ha: a third of the way, kill the leading arbiter (supervisord starts it again, as a
        standby); once a lease follows, kill the database primary; once a lease follows that too,
        start its host again (it rejoins as a standby) and wait for every database host to stream.
        The arbiter goes first while two thirds of the work are queued: each fault is timed to the
        first lease after it, which needs work waiting (after a failover of about 10 s the workers
        drain what is left in seconds, and a takeover timed then would wait for the next rejudge)."""
        phase = self.ha_phase
        if phase is HaPhase.BEFORE and done >= total // 3:
            leader = self.leading_arbiter()
            pid = self._supervisorctl("pid", leader).stdout.strip() if leader else ""
            if not pid.isdigit() or int(pid) == 0:
                raise RuntimeError(f"no leading arbiter to kill (readyz: {leader}, pid {pid!r})")
            os.killpg(int(pid), signal.SIGKILL)
            self._struck, self._struck_at = leader, time.time()
            self.ha_phase = HaPhase.ARBITER_KILLED
            print(f"\n[{elapsed:5.1f}s] the leading arbiter {leader} killed -9")
        elif phase in (HaPhase.ARBITER_KILLED, HaPhase.DB_KILLED):
            first = conn.execute(LAB.first_grant_after, {"at": self._struck_at}).fetchone()[0]
            if first is None:
                return
            if phase is HaPhase.ARBITER_KILLED:
                primary = self.cluster.primary()
                if primary is None:
                    return
                self.ha_report.append(f"arbiter takeover: {self._struck} (the leader) killed -9; first lease "
                                      f"{first - self._struck_at:.1f} s after, {self.leading_arbiter()} leading")
                print(f"\n[{elapsed:5.1f}s] {self.ha_report[-1]}")
                self.cluster.kill_host(primary)
                # Timed from the kill's end: a lease whose transaction began before it may still come through
                # (its commit was on the standby already), and is no lease of the new primary's.
                self._struck, self._struck_at = primary.name, time.time()
                self.ha_phase = HaPhase.DB_KILLED
                print(f"[{elapsed:5.1f}s] database primary {primary.name} killed -9 (the whole host)")
            else:
                primary = self.cluster.primary()
                self.ha_report.append(f"database failover: primary {self._struck} killed -9; first lease on the new "
                                      f"primary ({primary.name if primary else '?'}) {first - self._struck_at:.1f} s after")
                print(f"\n[{elapsed:5.1f}s] {self.ha_report[-1]}; {self._struck} starts again")
                self.cluster.start_node(self.cluster.node(self._struck))
                self.ha_phase = HaPhase.REJOINING
        elif phase is HaPhase.REJOINING and self.cluster.replicated():
            members = ", ".join(f"{m['name']} {m['role']}" for m in self.cluster.members())
            self.ha_report.append(f"database hosts: {members}; the killed one streams again, as the synchronous standby")
            self.ha_phase = HaPhase.DONE

    def judgectl(self, *args: str) -> str:
        """The operator's own tool, as an operator would run it."""
        done = subprocess.run([str(Path(sys.executable).with_name("judgectl")), *args], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, JUDGE_DSN=self.dsn))
        if done.returncode != 0:
            raise JudgectlError(f"judgectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def store_test_data(self) -> None:
        """Every problem's test data into the database (judgectl problem data): leases name its digest."""
        for slug, pid in self.problems.items():
            self.judgectl("problem", "data", slug, str(self.base / "testdata" / str(pid)))

    def change_test_data(self) -> None:
        """Mid-run: CHANGED_PROBLEM's data gains a case. Workers keep the shipped copy (now stale) as
        their pre-warmed cache and fetch the new set the leases name."""
        v2 = self.base / "testdata-v2"
        _write_testdata(v2, self.problems[CHANGED_PROBLEM], REVERSE_V2)
        self.judgectl("problem", "data", CHANGED_PROBLEM, str(v2 / str(self.problems[CHANGED_PROBLEM])))
        self.data_changed = True

    def rejudge_stale(self) -> int:
        """What was decided with the old data goes back to pending (judgectl rejudge --data-changed).
        Run whenever the queue is empty: a judging that was in flight during the change ends with the
        old data and is caught by the next call."""
        out = self.judgectl("rejudge", "--problem", CHANGED_PROBLEM, "--data-changed")
        ids = [int(line.split()[0]) for line in out.splitlines() if line.endswith(")") and "pending" in line]
        self.rejudged.update(ids)
        return len(ids)

    def progress(self, conn) -> tuple[dict, dict, tuple]:
        # The lab's own submissions only: the arbiter's canary probe adds canaries to the same table.
        counts = dict(conn.execute(LAB.progress_by_status).fetchall())
        per_worker = dict(conn.execute(LAB.judging_by_worker).fetchall())
        more = conn.execute(LAB.progress_more).fetchone()
        return counts, per_worker, more

    def stop(self) -> None:
        try:
            if self.supervisord is not None and self.supervisord.poll() is None:
                try:
                    self._supervisorctl("shutdown")  # stops every program (SIGTERM, then SIGKILL to its group)
                    self.supervisord.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.supervisord.pid, signal.SIGKILL)
        finally:
            # The database goes whatever the programs did: --ha's etcd members live outside the lab's
            # directory (tmpfs) and would outlive it.
            if isinstance(self.cluster, hacluster.HaCluster):
                self.cluster.destroy()
            elif self.cluster is not None:
                self.cluster.stop("fast")
            shutil.rmtree(getattr(self, "work", "/nonexistent"), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="judge-lab", description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=3, help="copies of the sample batch (11 submissions each)")
    parser.add_argument("--chaos", action="store_true", help="kill -9 the arbiter and workers during the run")
    parser.add_argument("--ha", action="store_true", help="the replicated topology (Patroni, etcd, two arbiters); "
                        "kill the database primary, then the leading arbiter, during the run")
    parser.add_argument("--dir", help="lab directory (default: a new temporary one)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--keep", action="store_true",
                        help="after the summary, leave the site running (status page, database, workers) and "
                             "print how to reach it, until Ctrl-C")
    args = parser.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="judge-lab-"))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o711)  # the postgres user and the sandbox uid must reach their subdirectories
    lab = Lab(base, args.copies, args.chaos, args.ha)
    interrupted = False
    failed = True  # until the summary says otherwise: a failed run keeps its directory and logs

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        expected = lab.setup()
        lab.store_test_data()
        started = time.monotonic()
        print(f"{len(expected)} submissions queued; arbiter at {lab.url}/status (the lab's CA: {lab.ca_file})")
        print(f"database: {lab.dsn}")
        conn = None
        while True:
            try:
                if conn is None:
                    conn = psycopg.connect(lab.dsn, autocommit=True, connect_timeout=3)
                counts, per_worker, (ever_decided, decisions, any_lease, oldest_s) = lab.progress(conn)
                queued = counts.get("pending", 0)
                judging = counts.get("judging", 0)
                done = sum(v for k, v in counts.items() if k not in ("pending", "judging"))
                verdicts = " ".join(f"{k}={v}" for k, v in sorted(counts.items()) if k not in ("pending", "judging"))
                leases_text = " ".join(f"{w}:{n}" for w, n in sorted(per_worker.items())) or "-"
                elapsed = time.monotonic() - started
                # "done" counts what was decided at least once: a rejudge sends a submission back to
                # the queue (counted there) but never takes its decision back.
                state = (f"queue {queued:3d} (oldest {oldest_s:4.1f}s)  judging {judging:2d} (leases {leases_text})"
                         if any_lease or not queued else f"queue {queued:3d}  waiting for workers")
                print(f"\r[{elapsed:5.1f}s] {state}  done {ever_decided}/{len(expected)}  "
                      f"{decisions / max(elapsed, 0.1):4.1f} verdicts/s  {verdicts}"
                      + (f"  kills {lab.kills}" if args.chaos else "") + "   ", end="", flush=True)
                if lab.ha:
                    lab.ha_step(conn, done, len(expected), time.monotonic() - started)
                if not lab.data_changed and conn.execute(LAB.decided_of_problem,
                                                         {"slug": CHANGED_PROBLEM}).fetchone()[0]:
                    lab.change_test_data()
                    print(f"\n[{time.monotonic() - started:5.1f}s] test data of {CHANGED_PROBLEM} changed "
                          "(judgectl problem data); rejudging what was judged with the old data")
                finished = done == len(expected) and (not lab.ha or lab.ha_phase is HaPhase.DONE)
                if finished and not (lab.data_changed and lab.rejudge_stale()):
                    break
            except (psycopg.OperationalError, JudgectlError):
                if not lab.ha:
                    raise
                # --ha: the database primary is moving; the lab asks again, as every client does.
                if conn is not None:
                    conn.close()
                conn = None
            if time.monotonic() - started > args.timeout:
                print(f"\nlab: timed out{f' ({lab.ha_phase.value})' if lab.ha else ''}", file=sys.stderr)
                return 1
            lab.unleash_chaos()
            time.sleep(0.5)
        print()
        with conn:
            rows = conn.execute(LAB.summary).fetchall()
            canaries = conn.execute(LAB.canary_summary).fetchone()
        wrong = stale = 0
        print(f"\n{'id':>4} {'problem':<8} {'lang':<8} {'expected':<9} {'verdict':<13} {'worker/slot':<11} judged")
        for sid, slug, lang, status, worker, attempts, judged, repeated, slot, current_data in rows:
            mark = "" if status == expected[sid] else "  <-- unexpected"
            if not current_data and status != "CE":  # a compile error never reads test data
                mark += "  <-- judged with old test data"
                stale += 1
            wrong += status != expected[sid]
            where = (worker or "-") + ("" if slot is None else f"/{slot}")
            note = " (rejudged: new test data)" if sid in lab.rejudged else ""
            print(f"{sid:>4} {slug:<8} {lang:<8} {expected[sid]:<9} {status:<13} {where:<11} {judged}x{note}{mark}")
        twice = sum(1 for r in rows if r[7] > 0)  # judged twice with the same test data
        print(f"\n{len(rows)} submissions, {len(rows) - wrong} with the expected verdict, {twice} judged twice with "
              f"the same test data, 0 lost" + (f", {lab.kills} processes killed along the way" if args.chaos else "")
              + f" ({time.monotonic() - started:.1f}s)")
        print(f"test data of {CHANGED_PROBLEM} changed mid-run: {len(lab.rejudged)} submission(s) rejudged with "
              f"the new data, {stale} left judged with the old")
        print(f"canaries of the arbiter's probe: {canaries[0]} of {canaries[1]} as expected")
        for line in lab.ha_report:
            print(line)
        failed = not (wrong == 0 and twice == 0 and stale == 0 and canaries[0] == canaries[1])
        if args.keep:
            keep_running(lab)
        return 1 if failed else 0
    except KeyboardInterrupt:
        interrupted = True
        print("\nlab: stopping")
        return 130
    finally:
        lab.stop()
        if failed and not interrupted:
            print(f"lab: the run failed; its directory and logs stay in {base} "
                  "(supervisord.log, arbiter.log, each worker's worker.log)", file=sys.stderr)
        elif not interrupted and not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def keep_running(lab: Lab) -> None:
    """--keep: the site stays up for exploring until Ctrl-C (or SIGTERM), then stops as usual."""
    print(f"\nlab: kept running. Status page: {lab.url}/status (the lab's CA: {lab.ca_file})")
    print(f"lab: for judgectl: export JUDGE_DSN='{lab.dsn}'")
    print("lab: Ctrl-C stops everything", flush=True)
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("\nlab: stopping", flush=True)


if __name__ == "__main__":
    sys.exit(main())
