"""A seeded, bounded chaos run: real arbiters, real workers, a real PostgreSQL, and a nemesis.

Every arbiter and worker runs on a host of its own, a network namespace on one bridge (network.py);
this machine, the bridge's far end, runs the database and the workers' fault proxies. The database
is the replicated one production runs (arbiter/lab/hacluster.py: Patroni, three etcd members, two
hosts, synchronous replication). Five nemesis threads share one seed. The process nemesis kills
(-9) and pauses (SIGSTOP) workers and arbiters, crashes the primary's PostgreSQL (Patroni restarts
it) or its whole host (Patroni fails over to the standby; the old host rejoins as the standby),
brings a second arbiter up and down, and holds a worker's result on the way until its lease is
reclaimed and the same worker holds a new lease of that submission (the seed's scenario 5, made to
happen); the network nemesis drops replies, delays requests, stalls replies and sends requests
twice (the copy seconds later) in per-worker HTTP proxies; the partition nemesis cuts a worker's
link or an arbiter's link to the database (nftables drops the packets: both ways, or one); the disk
nemesis (each worker's outbox and test-data cache are on a small tmpfs of its own) fills a worker's
disk or makes it read-only for a while, and the worker must hand back what it cannot keep or fetch;
the clock nemesis jumps one arbiter's or worker's wall clock an hour forward or back for a few
seconds (clock.py: libfaketime), which must cost no lease. Every nemesis's faults count towards the run's total.
Meanwhile a client submits programs whose verdict it knows and rejudges some finished ones, and a
sampler records lease_gen. At the end every fault is healed, the run waits until nothing is pending
or judging, and ``checker.check`` reads the database and the exchanges, ``checker.log_violations``
every arbiter's and worker's log. Needs root (namespaces, mounts).

    python tests/chaos/run.py --seed 7 --faults 2000     # the long run (see docs/reliability.md)
    python tests/chaos/run.py --seed 7 --faults 100 --nemeses partition   # one nemesis alone

The schedule (which fault, on whom, for how long) is a function of the seed; the interleaving with
the processes is not, so a failing seed is a strong hint, not an exact replay.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from checker import ORPHANED_POLL_SECS, Fault, check, log_violations  # noqa: E402
from clock import REREAD_SECS, Clocks  # noqa: E402
from lazyfs import lose  # noqa: E402
from network import BRIDGE_ADDRESS, DIRECTIONS, Network  # noqa: E402
from support.faultproxy import FaultProxy  # noqa: E402
from support.procs import ArbiterProcess, WorkerProcess, add_worker, write_testdata  # noqa: E402
from support.programs import APLUSB_TESTS, PROGRAMS  # noqa: E402

from arbiter.lab.devcluster import kill_postmaster  # noqa: E402
from arbiter.lab.hacluster import HaCluster  # noqa: E402
from arbiter.store import leases, migrations

LEASE_SECS = 4.0
ARBITER = {"lease_secs": LEASE_SECS, "unconfirmed_secs": 2.0, "grace_secs": 4.0, "long_poll_max_secs": 3.0,
           "db_timeout_secs": 2.0}
WORKER = {"heartbeat_interval_secs": 0.5, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
          "backoff_max_secs": 1.5, "request_timeout_secs": 1.5,
          "allow_plaintext": True}  # plain HTTP to the proxies: the chaos network carries no secret worth TLS
assert ORPHANED_POLL_SECS >= ARBITER["long_poll_max_secs"], "the checker's window must cover a parked poll"
# Each worker's small disk holds its outbox and its test-data cache: room for hundreds of entries and
# two data sets, filled in an instant.
WORKER_DISK_BYTES = 4 << 20
# The site's problems: A+B three times, each with test data of its own that the workers fetch from the
# arbiter (nothing is shipped to them) into a cache on that disk. A data set carries a padding file so
# that two do not fit in the cache's 1 MiB: a worker that turns to another problem fetches its data
# again, and the disk nemesis meets the cache as often as the outbox.
PROBLEMS = 3
DATA_PADDING_BYTES = 600 << 10
DATA_CACHE_MB = 1
WORKER_IDS = {"home-1": "home", "home-2": "home", "home-3": "home", "prod-1": "production"}
# (language, verdict) mix. "slow" programs take about a second on three tests (sleeping, well inside the
# wall limit), so most faults find a worker in the middle of judging.
SLOW_AC = "import time\ntime.sleep(0.3)\na, b = map(int, input().split())\nprint(a + b)\n"
MIX = [("python3", "slow"), ("python3", "slow"), ("python3", "slow"), ("python3", "AC"), ("python3", "WA"),
       ("python3", "RE"), ("c", "AC"), ("c", "WA")]
EXPECTED = {"slow": "AC"}
BACKLOG = 6  # the client keeps about this many submissions waiting or in judging
XP_REWARD = 10
USERS = 6


def judgectl(dsn: str, *args: str) -> None:
    """The operator's tool, as the operator runs it."""
    done = subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", dsn, *args], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"judgectl {' '.join(args)}: {done.stderr.strip()}")


class Lab:
    def __init__(self, root: Path):
        self.root = root
        self.cluster: HaCluster | None = None
        self.workers: dict[str, WorkerProcess] = {}
        self.arbiters: dict[str, ArbiterProcess] = {}
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        self.disks: dict[str, Path] = {}
        # One disk fault at a time on a worker's disk: the disk nemesis and stale_release both change it.
        self.disk_locks: dict[str, threading.Lock] = {name: threading.Lock() for name in WORKER_IDS}
        self.lazyfs: dict[str, subprocess.Popen] = {}
        self.paused: set[str] = set()
        try:
            self._build(root)
        except BaseException:
            self.destroy()  # what was built before the failure, so that the next run starts clean
            raise

    def _build(self, root: Path) -> None:
        # Every arbiter and worker on a host of its own (network.py), so that the partition nemesis
        # drops real packets between it and this machine (the database, the workers' proxies).
        self.network = Network(["a1", "a2", *WORKER_IDS]).up()
        # The site's database as production runs it: two hosts under Patroni, synchronous
        # replication; everyone reaches the primary through one multi-host DSN.
        self.cluster = HaCluster(also_on=BRIDGE_ADDRESS).start()
        with self.cluster.connect() as admin:
            admin.execute("CREATE DATABASE judge")
        self.dsn = self.cluster.dsn("judge")
        with self.connect() as conn:
            migrations.migrate(conn)
            self.problems = [conn.execute("INSERT INTO problems (slug, title, xp_reward) VALUES (%s, 'A+B', %s) "
                                          "RETURNING id", (f"aplusb-{n}", XP_REWARD)).fetchone()[0]
                             for n in range(1, PROBLEMS + 1)]
            self.users = [conn.execute("INSERT INTO users (name) VALUES (%s) RETURNING id", (f"u{i}",)).fetchone()[0]
                          for i in range(USERS)]
            creds = {w: add_worker(conn, w, kind) for w, kind in WORKER_IDS.items()}
        # What no log may show: the secret part of each credential ("<worker>.<secret>").
        self.worker_secrets = [c.split(".", 1)[1] for c in creds.values()]
        for n, problem in enumerate(self.problems, start=1):
            data = write_testdata(root / "testdata", problem, APLUSB_TESTS)
            (data / "padding.bin").write_bytes(bytes([n]) * DATA_PADDING_BYTES)
            judgectl(self.dsn, "problem", "data", f"aplusb-{n}", str(data))
        shipped = root / "shipped"  # nothing: every data set comes from the arbiter
        shipped.mkdir()
        # Every arbiter and worker keeps its wall clock in a file of its own, for the clock nemesis.
        self.clocks = Clocks(root)
        self.arbiters = {name: ArbiterProcess(self.cluster.dsn("judge", address=BRIDGE_ADDRESS), root, name=name,
                                              env=self.clocks.env(name), netns=self.network.netns(name),
                                              address=self.network.addresses[name], **ARBITER)
                         for name in ("a1", "a2")}
        self.proxies = {(w, a): FaultProxy(arb.port, f"{w}->{a}", target_host=self.network.addresses[a],
                                           listen_on=BRIDGE_ADDRESS)
                        for w in WORKER_IDS for a, arb in self.arbiters.items()}
        self.workers = {w: WorkerProcess(root, w, kind, "arbiter", shipped, credential=creds[w],
                                         arbiter_urls=[self.proxies[(w, "a1")].url, self.proxies[(w, "a2")].url],
                                         env=self.clocks.env(w), netns=self.network.netns(w),
                                         data_dir=str(root / f"worker-{w}" / "disk" / "data"),
                                         data_cache_max_mb=DATA_CACHE_MB, **WORKER)
                        for w, kind in WORKER_IDS.items()}
        self.db_gate = threading.Lock()  # the client does not submit while the nemesis has the DB down
        # Each worker's outbox and test-data cache on a small disk of its own (a tmpfs), so that the
        # disk nemesis can fill it or make it read-only without touching anything else; the outbox is
        # seen through lazyfs.py, which keeps what was not fsynced in memory until the power_loss
        # fault forgets it (the cache needs no fsync: every file is verified before it is used).
        for name, worker in self.workers.items():
            disk = self.disks[name] = worker.home / "disk"
            disk.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={WORKER_DISK_BYTES},mode=0700", "tmpfs", str(disk)],
                           check=True, capture_output=True)
            (disk / "outbox").mkdir(mode=0o700)
            worker.outbox.mkdir(parents=True, exist_ok=True)
            self.lazyfs[name] = subprocess.Popen(
                [sys.executable, str(HERE / "lazyfs.py"), str(disk / "outbox"), str(worker.outbox),
                 str(self.lazyfs_control(name))],
                stdout=open(worker.home / "lazyfs.log", "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        for name, worker in self.workers.items():
            deadline = time.monotonic() + 20
            while not (os.path.ismount(worker.outbox) and self.lazyfs_control(name).exists()):
                if self.lazyfs[name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"lazyfs for {name}'s outbox did not mount: see {worker.home / 'lazyfs.log'}")
                time.sleep(0.05)

    def connect(self):
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)

    def lazyfs_control(self, name: str) -> Path:
        return self.workers[name].home / "lazyfs.sock"

    def start(self) -> None:
        self.arbiters["a1"].start()
        for worker in self.workers.values():
            worker.start()

    def arbiter_up(self, name: str) -> bool:
        proc = self.arbiters[name].proc
        return proc is not None and proc.poll() is None

    def heal(self) -> None:
        for name in list(self.paused):
            self.cont(name)
        for name in [*self.workers, *self.arbiters]:
            self.clocks.set(name, 0)
        self.network.mend_all()
        self.cluster.heal()
        if not self.arbiter_up("a1"):
            self.arbiters["a1"].start(wait_ready=False)
        for worker in self.workers.values():
            if worker.proc.poll() is not None:
                worker.start()

    def stop_signal(self, name: str, sig) -> None:
        if name in self.workers:
            os.killpg(self.workers[name].proc.pid, sig)
        else:
            self.arbiters[name].signal_all(sig)

    def pause(self, name: str) -> None:
        self.stop_signal(name, signal.SIGSTOP)
        self.paused.add(name)

    def cont(self, name: str) -> None:
        self.stop_signal(name, signal.SIGCONT)
        self.paused.discard(name)

    def destroy(self) -> None:
        for name in list(self.paused):
            self.cont(name)
        for worker in self.workers.values():
            if worker.proc is not None:
                worker.stop()
        for arbiter in self.arbiters.values():
            if arbiter.proc is not None and arbiter.proc.poll() is None:
                arbiter.kill9()
        for proxy in self.proxies.values():
            proxy.close()
        for name, proc in self.lazyfs.items():
            subprocess.run(["fusermount3", "-u", "-z", str(self.workers[name].outbox)], capture_output=True)
            proc.kill()
            proc.wait(10)
        for disk in self.disks.values():
            subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)
        if self.cluster is not None:
            self.cluster.destroy()
        Network.down()

    # -- a worker's disk -----------------------------------------------------------------
    def fill_disk(self, name: str) -> Path:
        """Fill the worker's disk (outbox and data cache) to the last byte; returns the file that fills it."""
        filler = self.disks[name] / ".filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 65536)
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(fd)
        return filler

    def remount_disk(self, name: str, mode: str) -> bool:
        """The worker's disk (outbox and data cache) read-only ("ro") or writable again ("rw"). A remount
        read-only is refused while a file is open for writing there (an outbox write, a data file on
        its way, held open by a worker that is paused meanwhile): tried for 2 s, then False, and the
        caller injects nothing. Writable again must work."""
        for _ in range(100):
            if subprocess.run(["mount", "-o", f"remount,{mode}", str(self.disks[name])],
                              capture_output=True).returncode == 0:
                return True
            time.sleep(0.02)
        if mode == "ro":
            return False
        raise RuntimeError(f"could not remount {name}'s disk {mode}")


NEMESES = ("process", "network", "disk", "clock", "partition")


class Run:
    def __init__(self, lab: Lab, seed: int, faults: int, submissions: int, log, nemeses=NEMESES):
        self.lab = lab
        self.nemeses = nemeses
        self.seed = seed
        self.target_faults = faults
        self.target_submissions = submissions
        self.log = log
        self.t0 = time.time()  # the faults' times are printed from here
        self.faults: list[Fault] = []
        self.faults_lock = threading.Lock()
        self.submitted: dict[int, str] = {}
        self.rejudged = 0
        self.gen_samples: list[tuple[int, int]] = []
        self.done = threading.Event()
        self.errors: list[str] = []
        self.power_losses: list[str] = []  # outbox entries found broken right after a power loss

    # -- bookkeeping -------------------------------------------------------------------
    def record(self, kind: str, target: str, started: float, detail: str = "") -> None:
        fault = Fault(kind, target, started, time.time(), detail)
        with self.faults_lock:
            self.faults.append(fault)
            count = len(self.faults)
            if count >= self.target_faults:
                self.done.set()
        # Every fault as it is injected, with its time: a failing run's schedule can be read back.
        self.log(f"fault {count}: +{started - self.t0:.2f}s {kind} {target}" + (f" ({detail})" if detail else ""))
        if count % 25 == 0:
            self.log(f"{count} faults injected; {len(self.submitted)} submitted")

    def guarded(self, name, body):
        def loop():
            try:
                body()
            except Exception as exc:  # noqa: BLE001 — a harness error must surface, not hang the run
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                self.done.set()
        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        return thread

    # -- the client ------------------------------------------------------------------
    def submit_one(self, rng: random.Random) -> None:
        language, kind = rng.choice(MIX)
        source = SLOW_AC if kind == "slow" else PROGRAMS[language][kind]
        user = rng.choice(self.lab.users)
        with self.lab.db_gate, self.lab.connect() as conn:
            sid = leases.submit(conn, user, rng.choice(self.lab.problems), language, source)
        self.submitted[sid] = EXPECTED.get(kind, kind)

    def backlog(self) -> int:
        with self.lab.connect() as conn:
            return conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')").fetchone()[0]

    def client(self) -> None:
        rng = random.Random(f"{self.seed}-client")
        while not self.done.is_set():
            try:
                if self.backlog() < BACKLOG:
                    self.submit_one(rng)
                if rng.random() < 0.1 and self.submitted:
                    with self.lab.db_gate, self.lab.connect() as conn:
                        self.rejudged += len(leases.rejudge(conn, [rng.choice(list(self.submitted))]))
            except psycopg.OperationalError:
                pass  # the database is being restarted by someone else's fault; try again
            self.done.wait(rng.uniform(0.05, 0.3))

    def sampler(self) -> None:
        while not self.done.is_set():
            try:
                with self.lab.connect() as conn:
                    self.gen_samples.extend(conn.execute("SELECT id, lease_gen FROM submissions").fetchall())
            except psycopg.OperationalError:
                pass
            self.done.wait(0.3)

    # -- the nemeses -----------------------------------------------------------------
    def process_nemesis(self) -> None:
        rng = random.Random(f"{self.seed}-process")
        lab = self.lab
        actions = ["kill_worker"] * 4 + ["pause_worker"] * 3 + ["kill_arbiter"] * 2 + ["pause_arbiter"] * 2 + \
                  ["restart_db", "failover"] + ["second_arbiter"] * 2 + ["stale_result"] * 2 + \
                  ["stale_heartbeat"] * 2 + ["stale_release"] * 2 + ["power_loss"] * 2
        # Each run's first process faults, a few seconds in, are a failover and a power loss: a short run
        # has them too.
        first = ["power_loss", "failover"]
        self.done.wait(3.0)
        while not self.done.is_set():
            action = first.pop() if first else rng.choice(actions)
            started = time.time()
            if action == "kill_worker":
                name = rng.choice(sorted(lab.workers))
                lab.workers[name].kill9()
                time.sleep(rng.uniform(0, 0.5))
                lab.workers[name].start()
                self.record(action, name, started)
            elif action == "pause_worker":
                name = rng.choice(sorted(lab.workers))
                # Short pauses stay inside the sandbox's wall limit; long ones outlast the lease.
                secs = rng.uniform(0.2, 0.9) if rng.random() < 0.5 else rng.uniform(LEASE_SECS + 1.5, LEASE_SECS + 3)
                lab.pause(name)
                time.sleep(secs)
                lab.cont(name)
                self.record(action, name, started, f"{secs:.1f}s")
            elif action == "kill_arbiter":
                up = [a for a in sorted(lab.arbiters) if lab.arbiter_up(a)]
                name = rng.choice(up)
                lab.arbiters[name].kill9()
                time.sleep(rng.uniform(0, 2.0))
                if name == "a1" or rng.random() < 0.5:
                    lab.arbiters[name].start(wait_ready=False)
                self.record(action, name, started)
            elif action == "pause_arbiter":
                name = rng.choice([a for a in sorted(lab.arbiters) if lab.arbiter_up(a)])
                secs = rng.uniform(0.5, 6.0)
                lab.pause(name)
                time.sleep(secs)
                lab.cont(name)
                self.record(action, name, started, f"{secs:.1f}s")
            elif action == "power_loss":
                self.power_loss(rng, started)
            elif action == "restart_db":
                self.restart_db(started)
            elif action == "failover":
                self.failover(started)
            elif action in ("stale_result", "stale_heartbeat", "stale_release"):
                self.stale_request(rng, started, action)
            elif action == "second_arbiter":
                if lab.arbiter_up("a2"):
                    lab.arbiters["a2"].kill9()
                    self.record(action, "a2", started, "down")
                else:
                    lab.arbiters["a2"].start(wait_ready=False)
                    self.record(action, "a2", started, "up")
            self.done.wait(rng.uniform(0.1, 0.8))

    def power_loss(self, rng: random.Random, started: float) -> None:
        """A worker's host loses power: the worker dies (-9) and its outbox disk forgets every byte
        that was not fsynced (lazyfs.py). Aimed at the moment that matters: while the worker's result
        is on the way (the proxy holds its next /result), so its outbox entry is written, renamed and
        not yet cleared. Every entry the outbox had finished (its final name: written, fsynced,
        renamed) must still be whole, or a result the worker counted as kept is gone; the held
        request then goes on (it was in the network before the power went) and the worker starts
        again on what is left."""
        lab = self.lab
        name = rng.choice(sorted(lab.workers))
        worker = lab.workers[name]
        proxies = [lab.proxies[(name, a)] for a in sorted(lab.arbiters)]
        armed = [p.hold_next("/result", 30.0) for p in proxies]
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not any(a.taken.is_set() for a in armed):
            time.sleep(0.02)
        held = [a for p, a in zip(proxies, armed) if not p.disarm(a)]
        try:
            worker.kill9()
            forgotten = lose(str(lab.lazyfs_control(name)))
            kept = worker.outbox_files()
            for path in kept:
                try:
                    json.loads(path.read_bytes())
                except (OSError, ValueError) as exc:
                    self.power_losses.append(f"{name}'s outbox entry {path.name} is not whole after a power loss "
                                             f"({type(exc).__name__}): a result the worker had kept is gone")
        finally:
            for one in held:
                one.let_go()
            for one in held:
                one.fired.wait(35)
        time.sleep(rng.uniform(0, 0.5))
        worker.start()
        self.record("power_loss", name, started, f"{len(kept)} outbox entries, {forgotten} files lost unsynced data"
                    + (", a result on the way" if held else ""))

    def restart_db(self, started: float) -> None:
        """The primary's PostgreSQL crashes (its postmaster and backends -9); Patroni, still holding
        the leader key, starts it again on the same host."""
        cluster = self.lab.cluster
        primary = cluster.wait_for(cluster.primary, 60, "a primary")
        with self.lab.db_gate:
            kill_postmaster(primary.postmaster_pid())
            cluster.wait_for(cluster.primary, 60, "the primary back")
        self.record("restart_db", primary.name, started, "postmaster -9, Patroni restarted it")

    def failover(self, started: float) -> None:
        """The primary's host dies (Patroni, PostgreSQL, -9) and Patroni promotes the synchronous
        standby; the old host is started again and rejoins as the standby (pg_rewind), so that the
        next failover, which first waits for the pair to replicate again, has a standby to promote."""
        cluster = self.lab.cluster
        cluster.wait_replicated(90)
        old = cluster.primary()
        with self.lab.db_gate:
            killed_at = time.monotonic()
            cluster.kill_host(old)
            new = cluster.wait_for(lambda: (p := cluster.primary()) is not old and p, 90, "the standby promoted")
            promoted_secs = time.monotonic() - killed_at
        cluster.start_node(old)
        self.record("failover", old.name, started, f"{new.name} promoted after {promoted_secs:.1f}s")

    def stale_request(self, rng: random.Random, started: float, kind: str) -> None:
        """The seed's scenario 5 on purpose: a worker's result (stale_result), heartbeat
        (stale_heartbeat) or hand-back (stale_release: its disk turned read-only while it judged, so
        it cannot keep the verdict and releases the lease) is stuck on the way while the worker is
        paused past its lease; the lease is reclaimed; the worker resumes, its retry or next heartbeat
        is refused (410), and it takes work again (the others are paused, so most likely the same
        submission, a newer lease); only then does the stuck request reach the arbiter, beside the new
        lease of the same worker. Only the token may tell the two apart."""
        lab = self.lab
        name = rng.choice(sorted(lab.workers))
        proxies = [lab.proxies[(name, a)] for a in sorted(lab.arbiters)]
        marker = {"stale_result": "/result", "stale_heartbeat": "/heartbeat", "stale_release": "/release"}[kind]
        armed = [p.hold_next(marker, 30.0) for p in proxies]
        if kind == "stale_release":
            lab.disk_locks[name].acquire()
            read_only = False
            try:
                read_only = lab.remount_disk(name, "ro")
            finally:
                if not read_only:  # held while the disk is read-only, released below
                    lab.disk_locks[name].release()
            if not read_only:  # a file open for writing there kept it writable: no fault
                for p, a in zip(proxies, armed):
                    p.disarm(a)
                return
        try:
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline and not any(a.taken.is_set() for a in armed):
                time.sleep(0.02)
        finally:
            if kind == "stale_release":
                lab.remount_disk(name, "rw")
                lab.disk_locks[name].release()
                # The disk fault that made the hand-back, on the record: it may cost that lease only
                # as the worker's own hand-back (checker.LOCAL_DISK).
                self.record("disk_readonly", name, started, "to make it hand a lease back")
        held = [a for p, a in zip(proxies, armed) if not p.disarm(a)]
        if not held:
            return  # the worker sent no such request in time: no fault
        exchange = held[0].exchange
        sid, token = int(exchange.path.split("/")[3]), (exchange.body or {}).get("lease_token")
        others = [w for w in sorted(lab.workers) if w != name]
        for worker in [name, *others]:
            lab.pause(worker)
        outcome = "not reclaimed"
        try:
            if self.wait_db(lambda c: c.execute("SELECT lease_token::text IS DISTINCT FROM %s FROM submissions "
                                                "WHERE id = %s", (token, sid)).fetchone()[0], LEASE_SECS + 6):
                lab.cont(name)  # its retry (or next heartbeat) gets 410; it asks for work again
                regranted = self.wait_db(lambda c: c.execute(
                    "SELECT worker_id = %s AND status = 'judging' FROM submissions WHERE id = %s",
                    (name, sid)).fetchone()[0], 5)
                outcome = "leased to it again" if regranted else "not leased to it again"
                # A moment into the new lease, so that the stuck request plainly arrives after its grant
                # (the checker allows 50 ms between the database's clock and this host's).
                time.sleep(0.1)
        finally:
            for one in held:
                one.let_go()
            for one in held:
                one.fired.wait(35)
            for worker in [name, *others]:
                if worker in lab.paused:
                    lab.cont(worker)
        # The others' pauses are faults on their side (their leases may be reclaimed meanwhile).
        for other in others:
            self.record("pause_worker", other, started, f"while {name}'s {marker} was held")
        self.record(kind, name, started, f"submission {sid}: {outcome}")

    def wait_db(self, predicate, timeout: float) -> bool:
        """Polls predicate(conn) until it is true or the time is up; a database being restarted is waited out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.lab.connect() as conn:
                    if predicate(conn):
                        return True
            except psycopg.OperationalError:
                pass
            time.sleep(0.05)
        return False

    def disk_nemesis(self) -> None:
        """Now and then one worker's disk (outbox and data cache) is full or read-only for a few seconds."""
        rng = random.Random(f"{self.seed}-disk")
        lab = self.lab
        if not lab.disks:
            return
        while not self.done.wait(rng.uniform(4.0, 10.0)):
            name = rng.choice(sorted(lab.disks))
            kind = rng.choice(["disk_full", "disk_full", "disk_readonly"])
            secs = rng.uniform(1.0, 4.0)
            with lab.disk_locks[name]:
                started = time.time()
                if kind == "disk_full":
                    filler = lab.fill_disk(name)
                    time.sleep(secs)
                    filler.unlink()
                elif lab.remount_disk(name, "ro"):
                    time.sleep(secs)
                    lab.remount_disk(name, "rw")
                else:
                    continue  # a file open for writing there kept it writable: no fault
            self.record(kind, name, started, f"{secs:.1f}s")

    def clock_nemesis(self) -> None:
        """Now and then one arbiter's or worker's wall clock jumps an hour forward or back, and a few
        seconds later back to the true time (a second jump). Only the database's now() decides a
        lease, so the checker takes a clock jump as no excuse for a reclaim."""
        rng = random.Random(f"{self.seed}-clock")
        lab = self.lab
        while not self.done.wait(rng.uniform(2.0, 6.0)):
            # Half of the jumps hit an arbiter (where the janitor decides which leases ran out), mostly a1,
            # the one that is always up and so most often the leader.
            if rng.random() < 0.5:
                name = rng.choice(["a1", "a1", "a2"])
            else:
                name = rng.choice(sorted(lab.workers))
            offset = rng.choice([3600, -3600])
            secs = rng.uniform(2.0, 6.0)
            started = time.time()
            lab.clocks.set(name, offset)
            time.sleep(secs)
            lab.clocks.set(name, 0)
            time.sleep(REREAD_SECS)  # the process reads its clock file again within this long
            self.record("clock_jump", name, started, f"{offset:+d}s for {secs:.1f}s")

    def partition_nemesis(self) -> None:
        """Now and then one host's link is cut (network.py: packets dropped, both ways or one): a
        worker's to the arbiters (partition_worker), or an arbiter's to the database while the workers
        still reach it (partition_db). Most cuts are shorter than a lease; some outlast it by far."""
        rng = random.Random(f"{self.seed}-partition")
        lab = self.lab
        pg_ports = [node.pg_port for node in lab.cluster.nodes]
        # The two kinds take turns (two of a worker's, one of an arbiter's), so a short run has both.
        turns = itertools.cycle(["partition_worker", "partition_db", "partition_worker"])
        while not self.done.wait(rng.uniform(2.0, 6.0)):
            kind = next(turns)
            if kind == "partition_worker":
                name, ports = rng.choice(sorted(lab.workers)), None
            else:
                name, ports = rng.choice(["a1", "a1", "a2"]), pg_ports
            direction = rng.choice(DIRECTIONS)
            secs = rng.uniform(0.5, LEASE_SECS) if rng.random() < 0.7 else rng.uniform(LEASE_SECS + 1, 4 * LEASE_SECS)
            started = time.time()
            lab.network.cut(name, direction, ports)
            time.sleep(secs)
            lab.network.mend(name)
            self.record(kind, name, started, f"{direction} {secs:.1f}s")

    def network_nemesis(self) -> None:
        rng = random.Random(f"{self.seed}-network")
        lab = self.lab
        while not self.done.is_set():
            worker = rng.choice(sorted(lab.workers))
            marker = rng.choice(["/v1/acquire", "/heartbeat", "/result"])
            kind = rng.choice(["drop_reply", "delay_request", "duplicate_request", "stall_reply"])
            # A stalled reply comes within the worker's patience (an acquire's: its long poll and a
            # request timeout) or just after: a grant that arrives after its unconfirmed lease was
            # reclaimed, a heartbeat's 200 after the worker gave up on it.
            secs = rng.uniform(0.3, 3.6) if kind == "stall_reply" else rng.uniform(0.3, 6.0)
            started = time.time()
            proxies = [lab.proxies[(worker, a)] for a in sorted(lab.arbiters)]
            arm = {"drop_reply": lambda p: p.drop_next(marker), "delay_request": lambda p: p.delay_next(marker, secs),
                   "duplicate_request": lambda p: p.duplicate_next(marker, secs),
                   "stall_reply": lambda p: p.stall_next(marker, secs)}[kind]
            armed = [arm(p) for p in proxies]
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and not any(a.taken.is_set() for a in armed):
                time.sleep(0.02)
            hit = [a for p, a in zip(proxies, armed) if not p.disarm(a)]
            if hit:
                # The fault lasts from arming until the proxy lets go (request released or reply swallowed);
                # a request blocked on a dead upstream may hold it longer, so wait with a bound.
                for one in hit:
                    one.fired.wait(secs + 30)
                self.record(kind, worker, started, marker + (f" {secs:.1f}s" if kind != "drop_reply" else ""))
            self.done.wait(rng.uniform(0.1, 0.8))

    # -- the run ---------------------------------------------------------------------
    def wait_settled(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.lab.connect() as conn:
                    busy = conn.execute("SELECT count(*) FROM submissions WHERE status IN ('pending', 'judging')"
                                        ).fetchone()[0]
                if busy == 0 and all(not w.outbox_files() for w in self.lab.workers.values()):
                    return True
            except psycopg.OperationalError:
                pass
            time.sleep(0.5)
        return False

    def save_evidence(self, history) -> None:
        """What the checker saw, for a post-mortem (tokens replaced by their generation)."""
        with self.lab.connect() as conn:
            gens = {t: (s, g) for t, s, g in conn.execute(
                "SELECT lease_token::text, submission_id, lease_gen FROM lease_grants").fetchall()}
        with open(self.lab.root / "faults.jsonl", "w") as out:
            for fault in self.faults:
                out.write(json.dumps(vars(fault)) + "\n")
        with open(self.lab.root / "history.jsonl", "w") as out:
            for e in sorted(history, key=lambda e: e.sent_at):
                body = dict(e.body or {})
                if "lease_token" in body:
                    body["lease_token"] = gens.get(body.pop("lease_token"), "unknown")
                out.write(json.dumps({"worker": e.worker_id, "path": e.path, "sent_at": e.sent_at,
                                      "forwarded_at": e.forwarded_at,
                                      "status": e.status, "replied_at": e.replied_at, "dropped": e.dropped,
                                      "delayed_secs": e.delayed_secs, "duplicate": e.duplicate, "body": body}) + "\n")

    def execute(self, settle_timeout: float = 240):
        started = time.monotonic()
        nemeses = {"process": self.process_nemesis, "network": self.network_nemesis, "disk": self.disk_nemesis,
                   "clock": self.clock_nemesis, "partition": self.partition_nemesis}
        threads = [self.guarded(name, body) for name, body in (("client", self.client), ("sampler", self.sampler))]
        threads += [self.guarded(f"{name}-nemesis", nemeses[name]) for name in self.nemeses]
        self.done.wait()
        for thread in threads:
            thread.join(timeout=30)
        self.lab.heal()
        rng = random.Random(f"{self.seed}-tail")
        while len(self.submitted) < self.target_submissions:  # the fault budget ran out before the minimum
            self.submit_one(rng)
        fault_secs = time.monotonic() - started
        settled = self.wait_settled(settle_timeout)
        history = [e for p in self.lab.proxies.values() for e in p.history]
        self.save_evidence(history)
        with self.lab.connect() as conn:
            report = check(conn, self.submitted, self.gen_samples, history, self.faults, XP_REWARD)
            tokens = [t for (t,) in conn.execute("SELECT lease_token::text FROM lease_grants").fetchall()]
        logs = sorted(self.lab.root.glob("arbiter-*.log")) + sorted(self.lab.root.glob("worker-*/worker.log"))
        report.figures["log_lines"] = log_violations(report, logs, tokens + self.lab.worker_secrets)
        report.figures.update(worker_log_figures(sorted(self.lab.root.glob("worker-*/worker.log"))))
        if not settled:
            report.add("not settled", f"work still pending or judging {settle_timeout:.0f}s after the last fault")
        for loss in self.power_losses:
            report.add("result lost to a power loss", loss)
        for error in self.errors:
            report.add("harness error", error)
        by_kind: dict[str, int] = {}
        for fault in self.faults:
            by_kind[fault.kind] = by_kind.get(fault.kind, 0) + 1
        report.figures.update(seed=self.seed, faults=len(self.faults), faults_by_kind=dict(sorted(by_kind.items())),
                              rejudged=self.rejudged, fault_phase_secs=round(fault_secs, 1),
                              total_secs=round(time.monotonic() - started, 1))
        return report


def worker_log_figures(logs: list[Path]) -> dict:
    """What the workers say they did about test data and hand-backs (the database cannot tell why a
    lease went back): files fetched from the arbiter, hand-backs by their reason."""
    fetched = 0
    hand_backs: dict[str, int] = {}
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the log checker reports it
            event = entry.get("event", "") if isinstance(entry, dict) else ""
            if event == "test file fetched":
                fetched += 1
            elif "handing the lease back" in event:
                reason = str(entry.get("reason", ""))
                why = ("disk" if "local fault" in reason or "outbox" in reason else
                       "test data unavailable" if "test data" in reason or "test file" in reason else "other")
                hand_backs[why] = hand_backs.get(why, 0) + 1
    return {"test_files_fetched": fetched, "hand_backs": dict(sorted(hand_backs.items()))}


def run(seed: int, faults: int, submissions: int, workdir: Path | None = None, log=print, nemeses=NEMESES):
    only = "" if tuple(nemeses) == NEMESES else f" --nemeses {','.join(nemeses)}"
    log(f"chaos run: seed {seed}, {faults} faults, at least {submissions} submissions "
        f"(again: python tests/chaos/run.py --seed {seed} --faults {faults} --submissions {submissions}{only})")
    root = Path(workdir or tempfile.mkdtemp(prefix="judge-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        # Logs are appended to: an earlier run's lines would be checked as this run's.
        raise SystemExit(f"chaos run: {root} is not empty (an earlier run's logs?); give a new or empty --workdir")
    lab = Lab(root)
    try:
        lab.start()
        return Run(lab, seed, faults, submissions, log, nemeses).execute()
    finally:
        lab.destroy()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=1000)
    parser.add_argument("--submissions", type=int, default=None,
                        help="at least this many (default: faults / 4); the client submits until the faults are done")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    parser.add_argument("--nemeses", default=",".join(NEMESES), type=lambda v: tuple(v.split(",")),
                        help=f"which nemeses strike (default: all of {','.join(NEMESES)}); one alone shows what "
                             "its faults catch")
    args = parser.parse_args(argv)
    # A run stopped with SIGTERM (timeout(1), a CI job cancelled) takes its cluster and hosts down too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    unknown = set(args.nemeses) - set(NEMESES)
    if unknown:
        parser.error(f"unknown nemesis {', '.join(sorted(unknown))}: choose from {','.join(NEMESES)}")
    report = run(args.seed, args.faults, args.submissions or max(20, args.faults // 4), args.workdir,
                 log=lambda m: print(m, flush=True), nemeses=args.nemeses)
    print(json.dumps(report.figures, indent=2))
    for violation in report.violations:
        print("VIOLATION", violation)
    print(f"{len(report.violations)} violations")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
