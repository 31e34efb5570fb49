"""Real processes for integration tests: arbiters under gunicorn, credentials, polling helpers."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from arbiter.lab.devcluster import free_port
from arbiter.server import serving
from arbiter.store import credentials

GUNICORN_CONF = Path(serving.__file__).with_name("gunicorn.conf.py")

FAST = {  # short lease times so fault tests run in seconds, not minutes
    "unconfirmed_secs": 2.0,
    "lease_secs": 4.0,
    "grace_secs": 4.0,
    "long_poll_max_secs": 5.0,
    "janitor_interval_secs": 0.3,
    "absence_grace_after_secs": 1.5,
    "leader_retry_secs": 1.0,
    "dispatch_tick_secs": 0.5,
    "ready_max_round_age_secs": 3.0,
    "stuck_alert_secs": 3.0,
    # The idle cadence (tests/test_idle_cost.py tests the defaults): a lease written straight into
    # the database by a test is reclaimed in a second, a lost leader session noticed in a second.
    "janitor_idle_secs": 1.0,
    "leader_check_secs": 1.0,
    # No standing probe canary unless a test asks for one: it would go to the front of the queue
    # and be the first lease of every test (tests/test_canaries.py turns it on).
    "canary_interval_secs": 0,
    "credential_cache_secs": 1.0,
}


def wait_for(predicate, timeout: float = 20, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def add_worker(conn, worker_id: str, kind: str = "home", languages=("c", "cpp", "python3"), slots: int = 1) -> str:
    secret = credentials.new_secret()
    conn.execute("INSERT INTO workers (worker_id, kind, languages, secret_sha256, slots) VALUES (%s, %s, %s, %s, %s)",
                 (worker_id, kind, list(languages), credentials.hash_secret(secret), slots))
    return credentials.format_credential(worker_id, secret)


def request_bytes(path: str, body: dict, credential: str) -> bytes:
    """A whole POST of ``body`` as JSON with a worker's credential, for tests that write raw sockets
    (to stall it half-way, or to hold many requests open at once)."""
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: arbiter\r\nAuthorization: Bearer {credential}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


class ArbiterProcess:
    def __init__(self, dsn: str, workdir: Path, name: str = "a1", env: dict | None = None,
                 ca_file: str | None = None, netns: str | None = None, address: str = "127.0.0.1", **settings):
        """``ca_file``: with tls_certfile/tls_keyfile among the settings, the CA the test trusts.
        ``netns``: run it in that network namespace (a host of its own), serving on ``address``."""
        self.dsn = dsn
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.netns = netns
        self.port = free_port()
        self.url = f"{'https' if settings.get('tls_certfile') else 'http'}://{address}:{self.port}"
        self.ssl_context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        values = dict(FAST, bind=f"{address}:{self.port}", instance_name=name, **settings)
        self.config = self.workdir / f"arbiter-{name}.toml"
        lines = [f"dsn = {json.dumps(dsn)}"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        self.config.write_text("\n".join(lines) + "\n")
        self.log_path = self.workdir / f"arbiter-{name}.log"
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self, wait_ready: bool = True, env: dict | None = None) -> "ArbiterProcess":
        full_env = dict(os.environ, JUDGE_ARBITER_CONFIG=str(self.config), **self.extra_env, **(env or {}))
        full_env.pop("JUDGE_DSN", None)
        self._log = open(self.log_path, "ab")
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []  # ip execs the command: same pid
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), serving.APP],
            env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        wait_for(self._serving, 30, what=f"arbiter {self.name} to serve")
        if wait_ready:
            self.wait_ready()
        return self

    def _serving(self) -> bool:
        """/healthz answers; an arbiter that exited (a port taken meanwhile, a bad config) fails at once,
        with its last words, instead of being waited for."""
        if self.proc.poll() is not None:
            tail = self.log_text().strip().splitlines()[-5:]
            raise AssertionError(f"arbiter {self.name} exited ({self.proc.returncode}) before serving: "
                                 + " | ".join(tail))
        return self.get("/healthz")[0] == 200

    def wait_ready(self, timeout: float = 20) -> None:
        wait_for(lambda: self.get("/readyz")[0] == 200, timeout, what=f"arbiter {self.name} to be ready")

    def get(self, path: str):
        try:
            with urllib.request.urlopen(self.url + path, timeout=5, context=self.ssl_context) as r:
                body = r.read()
                return r.status, (json.loads(body) if r.headers.get_content_type() == "application/json" else body.decode())
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return e.code, json.loads(body)
            except ValueError:
                return e.code, body.decode()
        except OSError:
            return None, None

    def metric(self, name: str) -> float:
        """The sum of one metric's samples (all label sets) on /metrics; 0 when it has none."""
        status, text = self.get("/metrics")
        assert status == 200, (status, text)
        pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
        return sum(float(v) for v in pattern.findall(text))

    def worker_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def signal_all(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        """kill -9 the whole arbiter (gunicorn master and its worker)."""
        self.signal_all(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal_all(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill9()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


class Arbiters:
    """Fixture object: starts arbiters against a DSN and stops them all at the end."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.started: list[ArbiterProcess] = []

    def start(self, dsn: str, name: str = "a1", wait_ready: bool = True, env: dict | None = None,
              ca_file: str | None = None, **settings):
        proc = ArbiterProcess(dsn, self.tmp_path, name=name, env=env, ca_file=ca_file, **settings)
        self.started.append(proc)
        return proc.start(wait_ready=wait_ready)

    def stop_all(self) -> None:
        for proc in self.started:
            try:
                proc.kill9() if proc.proc and proc.proc.poll() is None else None
            except Exception:  # noqa: BLE001
                pass


def write_testdata(root: Path, problem_id: int, cases: list[tuple[str, str]]) -> Path:
    directory = Path(root) / str(problem_id)
    directory.mkdir(parents=True, exist_ok=True)
    for index, (given, expected) in enumerate(cases, start=1):
        (directory / f"{index}.in").write_text(given)
        (directory / f"{index}.out").write_text(expected)
    return directory


def direct_transport(dsn: str, worker_id: str, kind: str, tmp_path: Path):
    """A legacy worker's transport in this process: its claim() is the legacy scheme's claim."""
    from worker.config import SandboxConfig, WorkerConfig
    from worker.delivery.transport_direct import DirectTransport

    return DirectTransport(WorkerConfig(worker_id=worker_id, kind=kind, transport="direct", outbox_dir=tmp_path / "o",
                                        testdata_dir=tmp_path, work_dir=tmp_path / "w", dsn=dsn,
                                        sandbox=SandboxConfig()))


@dataclass(frozen=True)
class AplusbSite:
    problem: int
    user: int
    cred: str  # the worker's arbiter credential (home-1's unless told otherwise)
    testdata: Path


def problem_site(db, tmp_path: Path, slug: str = "aplusb", cases=None, worker_id: str = "home-1",
                 kind: str = "home", slots: int = 1, time_limit_ms: int | None = None) -> AplusbSite:
    """The usual start of a worker test: a problem (A+B's tests unless ``cases`` are given), a user,
    one worker's credential, the test data on disk."""
    from support.fixtures_data import seed_problem, seed_user
    from support.programs import APLUSB_TESTS

    with db.connect() as conn:
        problem = seed_problem(conn, slug, **({"time_limit_ms": time_limit_ms} if time_limit_ms else {}))
        user = seed_user(conn)
        cred = add_worker(conn, worker_id, kind, slots=slots)
    testdata = Path(tmp_path) / "testdata"
    write_testdata(testdata, problem, APLUSB_TESTS if cases is None else cases)
    return AplusbSite(problem, user, cred, testdata)


def aplusb_site(db, tmp_path: Path) -> AplusbSite:
    return problem_site(db, tmp_path)


def doubling_tests(count: int) -> list[tuple[str, str]]:
    """``count`` tests of A+B with a = b = i (the answer 2i): a problem with as many tests as wanted."""
    return [(f"{i} {i}\n", f"{2 * i}\n") for i in range(1, count + 1)]


class WorkerProcess:
    """A real judge-worker process with its own config, outbox and work dir."""

    def __init__(self, workdir: Path, worker_id: str, kind: str, transport: str, testdata: Path,
                 arbiter_urls=(), credential: str = "", dsn: str = "", env: dict | None = None,
                 sandbox: dict | None = None, netns: str | None = None, **extra):
        """``netns``: run it in that network namespace (a host of its own on the network)."""
        self.worker_id = worker_id
        self.netns = netns
        self.home = Path(workdir) / f"worker-{worker_id}"
        self.home.mkdir(parents=True, exist_ok=True)
        self.outbox = self.home / "outbox"
        lines = [f'worker_id = "{worker_id}"', f'kind = "{kind}"', f'transport = "{transport}"',
                 f'outbox_dir = "{self.outbox}"', f'testdata_dir = "{testdata}"',
                 f'work_dir = "{sandbox_work_dir()}"']
        if credential:
            cred = self.home / "credential"
            cred.write_text(credential + "\n")
            cred.chmod(0o600)
            lines.append(f'credential_file = "{cred}"')
        if arbiter_urls:
            lines.append("arbiter_urls = [" + ", ".join(f'"{u}"' for u in arbiter_urls) + "]")
        if dsn:
            lines.append(f"dsn = {json.dumps(dsn)}")
        for key, value in extra.items():
            lines.append(f"{key} = {json.dumps(value)}")
        if sandbox:
            lines.append("[sandbox]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in sandbox.items()]
        self.config = self.home / "worker.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.log_path = self.home / "worker.log"
        self.env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self, env: dict | None = None) -> "WorkerProcess":
        self._log = open(self.log_path, "ab")
        # nsenter, not ``ip netns exec``: that one mounts a sysfs of the namespace over /sys, hiding
        # the cgroup tree the sandbox runs programs in. nsenter execs the command: same pid.
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "worker.main", "--config", str(self.config)],
                                     env=dict(os.environ, **self.env, **(env or {})), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill9(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def terminate(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def outbox_files(self) -> list[Path]:
        return sorted(self.outbox.glob("*.json")) if self.outbox.exists() else []


def sandbox_work_dir() -> Path:
    """A work dir the sandbox uid can reach (pytest's own tmp dirs are mode 0700)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="judge-work-", dir="/tmp"))
    path.chmod(0o711)
    return path
