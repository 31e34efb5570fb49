"""The systemd side of the arbiter: the unit files verify, and the watchdog is fed by the dispatch loop.

The notify socket here is a real AF_UNIX datagram socket standing where systemd's
would be; the arbiter is a real gunicorn process.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.procs import wait_for

UNITS = Path(__file__).resolve().parent.parent / "systemd"


class NotifySocket:
    """Collects sd_notify datagrams with their arrival time."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def watchdog_pings_since(self, since: float) -> int:
        return sum(1 for at, m in self.messages if at >= since and "WATCHDOG=1" in m.splitlines())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.close()


def _verify(unit_paths: list[Path]) -> subprocess.CompletedProcess:
    # systemd-analyze checks that ExecStart binaries exist: /opt/judge-arbiter/venv points at the venv
    # these tests run from, inside a private mount namespace (the machine's /opt is untouched).
    venv = Path(sys.prefix)
    script = ("mount -t tmpfs tmpfs /opt && mkdir -p /opt/judge-arbiter && "
              f"ln -s {venv} /opt/judge-arbiter/venv && exec systemd-analyze verify \"$@\"")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "verify",
                           *map(str, unit_paths)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_unit_files_verify_clean():
    units = sorted(UNITS.glob("*.service"))
    assert [u.name for u in units] == ["judge-arbiter.service", "judge-worker-supervisord.service"]
    result = _verify(units)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: systemd-analyze reports a bad directive."""
    broken = tmp_path / "judge-arbiter.service"
    broken.write_text((UNITS / "judge-arbiter.service").read_text().replace("Restart=always", "Restart=sometimes"))
    result = _verify([broken])
    assert "restart specifier" in result.stdout + result.stderr, result.stdout + result.stderr


def test_arbiter_unit_is_notify_with_a_watchdog_and_hardened():
    text = (UNITS / "judge-arbiter.service").read_text()
    for line in ("Type=notify", "NotifyAccess=all", "WatchdogSec=30s", "User=judge-arbiter", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "Restart=always"):
        assert line in text.splitlines(), line


def test_ready_then_watchdog_fed_by_the_dispatch_loop_and_starved_when_it_wedges(db, arbiters, notify_socket,
                                                                                 tmp_path):
    wedge = tmp_path / "wedge"
    a = arbiters.start(db.dsn, env={"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "1000000",
                                    "JUDGE_ARBITER_FAULTS": f"wedge_file={wedge}"})
    wait_for(lambda: any(m.startswith("READY=1") for _, m in notify_socket.messages), 10, what="READY=1")
    t0 = time.monotonic()
    wait_for(lambda: notify_socket.watchdog_pings_since(t0) >= 3, 10, what="watchdog pings")
    assert any("STATUS=leader, db up" in m for _, m in notify_socket.messages)

    wedge.write_text("stuck")
    time.sleep(1.0)  # let an iteration that was already past the wedge point finish
    wedged_at = time.monotonic()
    time.sleep(3.0)
    assert notify_socket.watchdog_pings_since(wedged_at) == 0, "a wedged loop must starve the watchdog"
    assert a.get("/healthz")[0] == 200, "the process is up: only the watchdog can tell"

    wedge.unlink()
    resumed = time.monotonic()
    wait_for(lambda: notify_socket.watchdog_pings_since(resumed) >= 2, 10, what="watchdog pings after unwedging")


def test_database_outage_keeps_the_watchdog_fed(own_cluster, arbiters, notify_socket):
    """DB down is answered with 503s (scenario 7), not by systemd restarting the arbiter."""
    arbiters.start(own_cluster.judge_dsn, env={"NOTIFY_SOCKET": str(notify_socket.path),
                                               "WATCHDOG_USEC": "1000000"})
    own_cluster.stop("immediate")
    try:
        down = time.monotonic()
        wait_for(lambda: any("db unreachable" in m for at, m in notify_socket.messages if at >= down), 15,
                 what="a watchdog ping that reports the outage")
        during = time.monotonic()
        # The loop backs off up to 5 s between reconnect attempts, well inside WatchdogSec (30 s).
        time.sleep(11.0)
        assert notify_socket.watchdog_pings_since(during) >= 2
    finally:
        own_cluster.start()


def _exposure(unit: str) -> float:
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", str(UNITS / unit)],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout[-2000:] + result.stderr[-2000:]
    return float(match.group(1))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_unit_exposure_scores():
    """systemd's own measure of what each unit may do: the arbiter ≤ 2.0, the worker host ≤ 4.0."""
    assert _exposure("judge-arbiter.service") <= 2.0
    assert _exposure("judge-worker-supervisord.service") <= 4.0


SANDBOX_PROBE = """
import sys, shutil, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from support.procs import sandbox_work_dir, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS
from worker.judging.judge import Job, Judge
from worker.sandbox.runner import Sandbox
root = Path(tempfile.mkdtemp())
write_testdata(root / "td", 1, APLUSB_TESTS)
work = sandbox_work_dir()
sandbox = Sandbox(uid=65534, gid=65534)
try:
    sandbox.self_test(work / "selftest")
    verdicts = [Judge(sandbox, root / "td", work).judge(Job(i, 1, "p1", lang, PROGRAMS[lang][v], 2000, 131072)).verdict
                for i, (lang, v) in enumerate([("c", "AC"), ("python3", "AC"), ("python3", "WA"), ("cpp", "RE")])]
    print(" ".join(verdicts))
finally:
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
"""


def _unit_capabilities(unit: str) -> list[str]:
    line = next(l for l in (UNITS / unit).read_text().splitlines() if l.startswith("CapabilityBoundingSet="))
    return [cap.removeprefix("CAP_").lower() for cap in line.partition("=")[2].split()]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv missing")
def test_the_sandbox_needs_no_capability_beyond_the_worker_units_bounding_set():
    """The worker host unit keeps only CapabilityBoundingSet's capabilities: the sandbox works with
    exactly those (judged under setpriv with that bounding set), and not with one fewer."""
    caps = _unit_capabilities("judge-worker-supervisord.service")
    assert "sys_admin" not in caps and len(caps) <= 8, caps

    def probe(capabilities):
        bounding = "-all," + ",".join(f"+{c}" for c in capabilities)
        return subprocess.run(["setpriv", "--bounding-set", bounding, "--", sys.executable, "-c", SANDBOX_PROBE,
                               str(Path(__file__).resolve().parent)], capture_output=True, text=True, timeout=300)

    result = probe(caps)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["AC", "AC", "WA", "RE"], result.stdout + result.stderr[-2000:]
    without_setuid = probe([c for c in caps if c != "setuid"])
    assert without_setuid.returncode != 0, "the bounding set is not what the probe ran under"
