"""The systemd side of the arbiter: the unit files verify, and the watchdog is fed by the dispatch loop.

The notify socket here is a real AF_UNIX datagram socket standing where systemd's
would be; the arbiter is a real gunicorn process.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from procs import wait_for

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
