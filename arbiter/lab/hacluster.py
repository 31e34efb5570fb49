"""A replicated PostgreSQL on this machine, run by Patroni with a three-member etcd as its store:
the tests' and the lab's model of a site with no single database host (docs/decisions.md, "The
database's high availability").

Nothing here replicates or elects: PostgreSQL streams WAL, etcd keeps the consensus, Patroni decides
who is primary and promotes only the synchronous standby (``synchronous_mode``), so a commit the
primary acknowledged is on two hosts. This module writes their configs, starts them (Patroni and
PostgreSQL as the ``postgres`` OS user when we are root), and offers what a test does to a host:
kill it (-9, every process of it, as a power cut would), start it again (Patroni rewinds it and it
follows the new primary), or hand the primary over (``patronictl switchover``).

Clients reach the primary through one multi-host DSN with ``target_session_attrs=read-write``
(:meth:`HaCluster.dsn`): libpq tries each host and keeps the one that takes writes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psycopg

from arbiter.lab.devcluster import (
    ClusterError,
    as_user,
    find_pg_bindir,
    free_port,
    kill_postmaster,
    read_postmaster_pid,
    server_user,
)

# Patroni's timings (the same as the judge_patroni role's defaults; docs/decisions.md weighs them).
# ttl is the leader key's life in etcd: after a primary host dies, the key lasts up to ttl more
# seconds before a standby may take over; loop_wait 1 s renews it every second; retry_timeout 4 s
# is how long a primary keeps going while etcd or its own PostgreSQL does not answer before it
# steps down (loop_wait + 2 * retry_timeout <= ttl, Patroni's rule).
TTL_SECS = 10
LOOP_WAIT_SECS = 1
RETRY_TIMEOUT_SECS = 4
SCOPE = "judge"


def patroni_bin(name: str = "patroni") -> str:
    """Debian's Patroni (it runs on the system's python3, which the postgres OS user can run)."""
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"{name} is not installed (apt install patroni)")
    return found


def etcd_bin() -> str:
    found = shutil.which("etcd")
    if found is None:
        raise ClusterError("etcd is not installed (apt install etcd-server)")
    return found


@dataclass
class Node:
    """One database host: a Patroni and the PostgreSQL it runs."""

    name: str
    pg_port: int
    api_port: int
    base: Path
    proc: subprocess.Popen | None = None
    killed: bool = False  # by kill_host, on purpose

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int | None:
        return read_postmaster_pid(self.data_dir)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class HaCluster:
    """Three etcd members and ``nodes`` Patroni-run PostgreSQL servers on 127.0.0.1."""

    def __init__(self, base_dir: str | os.PathLike | None = None, nodes: int = 2, synchronous: bool = True,
                 parameters: dict | None = None, also_on: str | None = None):
        """``also_on``: an address of this machine on a /24 of hosts in network namespaces (the chaos
        run's bridge); PostgreSQL listens there too and trusts that /24, so those hosts reach it."""
        bindir = find_pg_bindir()
        if bindir is None:
            raise ClusterError("no PostgreSQL server binaries found (apt install postgresql)")
        self.bindir = bindir
        # Not under a test's tmp_path: pytest makes those 0700 root, and PostgreSQL runs as postgres.
        self.base = Path(base_dir or tempfile.mkdtemp(prefix="judge-ha-", dir="/tmp"))
        self.synchronous = synchronous
        self.parameters = parameters or {}
        self.also_on = also_on
        self.etcd_ports = [(free_port(), free_port()) for _ in range(3)]
        self.etcd_procs: list[subprocess.Popen] = []
        self._etcd_data = self.base / "etcd"
        self.nodes = [Node(f"pg{i + 1}", free_port(), free_port(), self.base / f"pg{i + 1}") for i in range(nodes)]
        self._run_as = server_user()

    # -- the store -----------------------------------------------------------------------
    def _start_etcd(self) -> None:
        names = [f"e{i + 1}" for i in range(3)]
        initial = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, (_, peer) in zip(names, self.etcd_ports))
        # The members' data in memory when the machine has a tmpfs: a test box's disk, busy with
        # everything else, makes etcd's fsyncs slow enough to miss heartbeats, and a store that
        # stalls makes Patroni demote a healthy primary. (A site's members keep theirs on disk.)
        memory = Path("/dev/shm")
        store = Path(tempfile.mkdtemp(prefix="judge-etcd-", dir=memory)) if memory.is_dir() else self.base / "etcd"
        self._etcd_data = store
        for name, (client, peer) in zip(names, self.etcd_ports):
            data = store / name
            data.mkdir(parents=True, exist_ok=True)
            (self.base / "etcd").mkdir(parents=True, exist_ok=True)
            log = open(self.base / "etcd" / f"{name}.log", "ab")
            self.etcd_procs.append(subprocess.Popen(
                [etcd_bin(), "--name", name, "--data-dir", str(data),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", f"judge-{os.getpid()}-{id(self)}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_ports[0][0]}/health", timeout=2) as r:
                    if json.load(r).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"etcd did not become healthy; see {self.base / 'etcd'}")
            time.sleep(0.2)

    # -- the database hosts --------------------------------------------------------------
    def _config(self, node: Node) -> dict:
        listen = "127.0.0.1" + (f",{self.also_on}" if self.also_on else "")
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust",
               "host replication replicator 127.0.0.1/32 trust"]
        if self.also_on:
            hba.append(f"host all all {self.also_on.rsplit('.', 1)[0]}.0/24 trust")
        parameters = {
            "max_connections": 300,
            # The legacy scheme relies on this to free the global lock of a vanished worker.
            "idle_in_transaction_session_timeout": "10s",
            "wal_log_hints": "on",  # pg_rewind brings a dead primary back as a standby
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_keep_size": "256MB",
            "log_min_messages": "warning",
            **self.parameters,
        }
        return {
            "scope": SCOPE,
            "namespace": "/judge-ha/",
            "name": node.name,
            "log": {"level": "INFO", "dir": str(node.base / "log"), "file_num": 2},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{client}" for client, _ in self.etcd_ports]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_SECS, "loop_wait": LOOP_WAIT_SECS, "retry_timeout": RETRY_TIMEOUT_SECS,
                    "maximum_lag_on_failover": 1048576,
                    # Promote only the synchronous standby; not strict: a primary whose standby is
                    # gone keeps taking writes (docs/decisions.md says what that costs).
                    "synchronous_mode": self.synchronous,
                    "synchronous_mode_strict": False,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": parameters},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"{listen}:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(self.bindir),
                "pgpass": str(node.base / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "replicator"}},
                # A lab on loopback: trust. A site's hosts use scram and passwords (the judge_db role).
                "pg_hba": hba,
                "parameters": {"unix_socket_directories": str(node.base)},
                # A rewound or diverged old primary is cloned afresh, so failovers can repeat.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }

    def _demote(self):
        return as_user(self._run_as)

    def start_node(self, node: Node) -> None:
        """Start (or start again) a host's Patroni; it runs its PostgreSQL as primary or standby."""
        node.killed = False
        (node.base / "log").mkdir(parents=True, exist_ok=True)
        config = node.base / "patroni.yml"
        config.write_text(json.dumps(self._config(node), indent=2))  # JSON is YAML
        if self._run_as is not None:
            for path in (node.base, node.base / "log", config):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)
        out = open(node.base / "patroni.out", "ab")
        node.proc = subprocess.Popen([patroni_bin(), str(config)], cwd=node.base, stdout=out,
                                     stderr=subprocess.STDOUT, preexec_fn=self._demote(), start_new_session=True,
                                     env=dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8"))

    def heal(self, timeout: float = 120) -> None:
        """Every host up again and replicating (a killed one rejoins as a standby)."""
        for node in self.nodes:
            if not node.alive():
                self.start_node(node)
        self.wait_replicated(timeout)

    def start(self, timeout: float = 120) -> "HaCluster":
        try:
            self._start(timeout)
        except BaseException:
            self.destroy()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            os.chown(self.base, self._run_as.pw_uid, self._run_as.pw_gid)
            probe = subprocess.run(["test", "-r", str(self.base)], preexec_fn=self._demote())
            if probe.returncode != 0:
                raise ClusterError(f"{self.base} is out of the postgres user's reach (a parent directory's mode)")
        self._start_etcd()
        self.start_node(self.nodes[0])
        self.wait_for(lambda: self.primary() is not None, timeout, "a primary")
        for node in self.nodes[1:]:
            self.start_node(node)
        self.wait_replicated(timeout)

    # -- what the cluster says of itself -------------------------------------------------------
    def members(self) -> list[dict]:
        """Patroni's view (GET /cluster) from the first host that answers: name, role, state, lag."""
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                with urllib.request.urlopen(f"{node.api}/cluster", timeout=2) as reply:
                    return json.load(reply).get("members", [])
            except (OSError, ValueError):
                continue
        return []

    def primary(self) -> Node | None:
        """The host that leads (Patroni's word) and takes writes (PostgreSQL's: a promotion is under
        way between the two), or None."""
        for member in self.members():
            if member.get("role") in ("leader", "master", "primary") and member.get("state") == "running":
                node = self.node(member["name"])
                try:
                    with psycopg.connect(self.node_dsn(node), connect_timeout=2) as conn:
                        if not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                            return node
                except psycopg.Error:
                    pass
        return None

    def sync_standby(self) -> Node | None:
        for member in self.members():
            if member.get("role") == "sync_standby" and member.get("state") in ("streaming", "running"):
                return self.node(member["name"])
        return None

    def standby(self) -> Node | None:
        """A running host that is not the primary."""
        primary = self.primary()
        return next((n for n in self.nodes if n.alive() and n is not primary), None)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None and not node.killed:
                    out = (node.base / "patroni.out").read_text(errors="replace").strip().splitlines()[-5:]
                    raise ClusterError(f"patroni {node.name} exited ({node.proc.returncode}): " + " | ".join(out))
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}; members: {self.members()}; logs in {self.base}")
            time.sleep(0.2)

    def replicated(self) -> bool:
        """Every running host streams from the primary, and (synchronous mode) one is its sync standby."""
        # PostgreSQL's own word (pg_stat_replication on the primary), not Patroni's summary of it.
        primary = self.primary()
        if primary is None:
            return False
        try:
            with psycopg.connect(self.node_dsn(primary), connect_timeout=2) as conn:
                rows = conn.execute("SELECT application_name, state, sync_state FROM pg_stat_replication").fetchall()
        except psycopg.Error:
            return False
        standbys = {n.name for n in self.nodes if n.alive()} - {primary.name}
        streaming = {name for name, state, _ in rows if state == "streaming"}
        synced = {name for name, _, sync in rows if sync == "sync"}
        if not self.synchronous or not standbys:
            return standbys <= streaming
        # Synchronous: PostgreSQL waits for a standby's flush, and Patroni names it in etcd (only a
        # standby named there may be promoted).
        sync = self.sync_standby()
        return standbys <= streaming and bool(synced & standbys) and sync is not None and sync.name in synced

    def wait_replicated(self, timeout: float = 120) -> None:
        self.wait_for(self.replicated, timeout,
                      "every standby streaming" + (" and a synchronous standby" if self.synchronous else ""))

    # -- what a test does to a host ------------------------------------------------------
    def kill_host(self, node: Node) -> None:
        """The host dies: Patroni, its postmaster and every backend, -9, nothing shut down cleanly."""
        node.killed = True
        postmaster = node.postmaster_pid()
        if node.proc is not None:
            try:
                os.killpg(node.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.proc.wait(timeout=10)
        if postmaster is not None:
            kill_postmaster(postmaster)

    def switchover(self, candidate: Node | None = None) -> None:
        """A planned hand-over of the primary, through Patroni's own command."""
        primary = self.primary()
        if primary is None:
            raise ClusterError("no primary to switch over from")
        args = [patroni_bin("patronictl"), "-c", str(primary.base / "patroni.yml"), "switchover", SCOPE,
                "--leader", primary.name, "--force"]
        if candidate is not None:
            args += ["--candidate", candidate.name]
        result = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise ClusterError(f"patronictl switchover failed: {result.stdout.strip()} {result.stderr.strip()}")
        self.wait_for(lambda: self.primary() not in (None, primary), 60, f"a primary other than {primary.name}")

    # -- addresses -------------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str = "postgres", address: str = "127.0.0.1") -> str:
        """Every host, and libpq keeps the one that takes writes. ``address``: where this machine's
        PostgreSQL servers are reached (``also_on`` from a namespace)."""
        hosts = ",".join(address for _ in self.nodes)
        ports = ",".join(str(n.pg_port) for n in self.nodes)
        return f"host={hosts} port={ports} dbname={dbname} user={user} target_session_attrs=read-write"

    def node_dsn(self, node: Node, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={node.pg_port} dbname={dbname} user=postgres"

    def connect(self, dbname: str = "postgres", **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=3, **kwargs)

    def destroy(self) -> None:
        for node in self.nodes:
            self.kill_host(node)
        for proc in self.etcd_procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        shutil.rmtree(self._etcd_data, ignore_errors=True)
        shutil.rmtree(self.base, ignore_errors=True)


def main() -> int:
    """Bring a replicated cluster up by hand, print its DSN, and keep it until Ctrl-C."""
    cluster = HaCluster(nodes=int(os.environ.get("JUDGE_HA_NODES", "2"))).start()
    print(json.dumps({"dsn": cluster.dsn(), "base": str(cluster.base),
                      "members": cluster.members()}, indent=2), flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
