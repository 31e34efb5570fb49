"""A throwaway PostgreSQL server for tests, the local lab and benchmarks.

Order of preference, as the test harness rules say:
1. a Docker engine is reachable -> testcontainers (``postgres`` image; the ``lab`` extra);
2. the system's ``initdb``/``pg_ctl`` (run as the ``postgres`` OS user when we are root; Debian's
   ``postgresql``, which .ci/setup installs).
A cluster made here is ours alone: it may be stopped, killed and restarted.
"""

from __future__ import annotations

import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from arbiter.errors import ArbiterError


class ClusterError(ArbiterError, RuntimeError):
    pass


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free TCP port on loopback, for a server started a moment later.

    Chosen below the kernel's ephemeral range: a port from bind(0) is one the kernel also hands to
    outgoing connections and to other bind(0) calls, so between this check and the server's own bind
    another process (a client socket, a test's proxy, an SSH session) could take it; ports below the
    range are taken only by someone asking for them by number."""
    low, _ = _ephemeral_ports()
    first = max(1024, low - 12000)
    for _ in range(200):
        port = random.randrange(first, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_pg_bindir() -> Path | None:
    """Directory holding initdb/pg_ctl/postgres, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    for directory in candidates:
        if os.access(os.path.join(directory, "initdb"), os.X_OK):
            return Path(directory)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    return None


def docker_reachable() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        sock = host[len("unix://"):]
    elif host:
        return True
    else:
        sock = "/var/run/docker.sock"
    if not os.path.exists(sock):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            s.connect(sock)
        return True
    except OSError:
        return False


def server_user() -> pwd.struct_passwd | None:
    """Who runs PostgreSQL: the ``postgres`` OS user when we are root (the server refuses root), else us."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterError("running as root but there is no 'postgres' OS user to run the server") from None


def as_user(user: pwd.struct_passwd | None):
    """A preexec_fn that becomes ``user`` in the child (None: stay who we are)."""
    if user is None:
        return None
    uid, gid = user.pw_uid, user.pw_gid

    def demote():
        os.setgid(gid)
        os.setuid(uid)

    return demote


def read_postmaster_pid(data_dir: Path) -> int | None:
    """The running server's postmaster pid (postmaster.pid in its data directory), or None. A server
    killed -9 leaves its postmaster.pid behind, and its pid may belong to another process since: the
    pid counts only while that process works in this data directory (a postmaster's cwd is its data
    directory), so that killing a host twice never kills a stranger."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        if os.readlink(f"/proc/{pid}/cwd") != str(Path(data_dir).resolve()):
            return None
    except (OSError, ValueError, IndexError):
        return None
    return pid


def kill_postmaster(pid: int) -> None:
    """Crash a server like a power cut: SIGKILL every backend and the postmaster, and wait for it."""
    subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


class LocalCluster:
    """initdb + pg_ctl cluster on 127.0.0.1 with trust auth for the local superuser."""

    def __init__(self, base_dir: str | os.PathLike | None = None, port: int | None = None, fast: bool = True,
                 settings: dict[str, str] | None = None):
        bindir = find_pg_bindir()
        if bindir is None:
            raise ClusterError("no PostgreSQL server binaries found (apt install postgresql), and no Docker engine")
        self.bindir = bindir
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="judge-pg-"))
        self.data_dir = self.base_dir / "data"
        self.log_file = self.base_dir / "postgres.log"
        self.port = port or free_port()
        self.fast = fast
        self.settings = settings or {}
        self._run_as = server_user()

    # -- process control -------------------------------------------------
    def _demote(self):
        return as_user(self._run_as)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8")
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            preexec_fn=self._demote(),
            env=env,
            cwd=str(self.base_dir),
            check=check,
            capture_output=True,
            text=True,
        )

    def init(self) -> "LocalCluster":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            os.chown(self.base_dir, self._run_as.pw_uid, self._run_as.pw_gid)
        if not (self.data_dir / "PG_VERSION").exists():
            result = self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                               "-E", "UTF8", "--no-instructions", check=False)
            if result.returncode != 0:
                raise ClusterError(f"initdb failed: {result.stderr.strip() or result.stdout.strip()}")
            conf = {
                "listen_addresses": "'127.0.0.1'",
                "port": str(self.port),
                "unix_socket_directories": f"'{self.base_dir}'",
                "max_connections": "300",
                # The legacy scheme relies on this to free the global lock of a vanished worker.
                "idle_in_transaction_session_timeout": "'10s'",
                "log_min_messages": "warning",
            }
            if self.fast:
                conf.update({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"})
            conf.update(self.settings)
            with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as f:
                f.write("\n# judge-arbiter devcluster\n")
                for key, value in conf.items():
                    f.write(f"{key} = {value}\n")
        return self

    def start(self, timeout: float = 30) -> "LocalCluster":
        if not (self.data_dir / "PG_VERSION").exists():
            self.init()
        result = self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
                           "-t", str(int(timeout)), "-o", f"-p {self.port}", "start", check=False)
        if result.returncode != 0:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise ClusterError(f"pg_ctl start failed: {result.stderr.strip()} {log}")
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def postmaster_pid(self) -> int | None:
        return read_postmaster_pid(self.data_dir)

    def kill9(self) -> None:
        """Crash the server like a power cut: SIGKILL the postmaster and every backend."""
        pid = self.postmaster_pid()
        if pid is not None:
            kill_postmaster(pid)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- addresses -------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"


class DockerServer:
    """A testcontainers PostgreSQL, used when a Docker engine is reachable."""

    def __init__(self, image: str = "postgres:15"):
        from testcontainers.postgres import PostgresContainer

        self._container = PostgresContainer(image, username="postgres", password="postgres", dbname="postgres")
        self._container.with_command("postgres -c max_connections=300 -c idle_in_transaction_session_timeout=10s "
                                     "-c fsync=off")
        self.port = 0

    def start(self) -> "DockerServer":
        self._container.start()
        self.port = int(self._container.get_exposed_port(5432))
        self.host = self._container.get_container_host_ip()
        return self

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host={self.host} port={self.port} dbname={dbname} user={user} password=postgres"

    def destroy(self) -> None:
        self._container.stop()


def shared_server(base_dir: str | None = None):
    """The server a whole test session (or a lab run) shares."""
    if docker_reachable() and os.environ.get("JUDGE_PG_NO_DOCKER") != "1":
        return DockerServer().start()
    return LocalCluster(base_dir).init().start()
