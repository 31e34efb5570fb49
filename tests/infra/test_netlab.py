"""The lab's 'up' tells a stale lab from one in use (ansible/lab/netlab.py, clear_the_way).

One lab per machine: its addresses are the lab inventory's. A lab left behind by a machine that
restarted (namespaces and bridge still there, no process in them) or by a test run killed before its
tear-down (its owner gone, its sshds still running) must not stop the next run; a lab somebody is
using must not be taken from them. Each test builds the remains of a lab by hand (bridge, namespaces,
processes in them, the bridge's record of its owner) and runs the check that 'up' runs first.

These run in the same pytest process as the cutover test (.ci/run), never beside a real lab.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ansible" / "lab"))
import netlab  # noqa: E402  (a script, not a package)

# Each test first waits for another run's lab in use (up to 1,500 s, as the cutover test does): the
# suite's per-test limit (300 s) would otherwise end the wait (seen with two runs on one machine).
pytestmark = pytest.mark.timeout(1500 + 300)


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@pytest.fixture
def machine():
    """This machine with no lab on it, for the length of one test; another run's lab is waited for."""
    with open(netlab.LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        netlab.clear_the_way(wait=1500)
        started: list[subprocess.Popen] = []
        try:
            yield started
        finally:
            netlab.Lab(None).down(remove=False)
            for proc in started:
                proc.kill()
                proc.wait()
            assert netlab.existing_lab() is None


def remains(record: dict | None, running_inside: bool, started: list[subprocess.Popen]) -> subprocess.Popen | None:
    """What a lab leaves: its bridge (with the record 'up' writes, if any), two hosts' namespaces, each
    with its veth on the bridge, and optionally a process inside one of them (an sshd, say)."""
    netlab.sh("ip", "link", "add", netlab.BRIDGE, "type", "bridge")
    if record is not None:
        netlab.sh("ip", "link", "set", "dev", netlab.BRIDGE, "alias", json.dumps(record))
    for host in ("db-1", "home-1"):
        ns = netlab.netns(host)
        netlab.sh("ip", "netns", "add", ns)
        netlab.sh("ip", "link", "add", f"jlv-{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        netlab.sh("ip", "link", "set", f"jlv-{host}", "master", netlab.BRIDGE)
    if not running_inside:
        return None
    inside = subprocess.Popen(["ip", "netns", "exec", netlab.netns("db-1"), "sleep", "600"], start_new_session=True)
    started.append(inside)
    deadline = time.monotonic() + 10
    while not netlab.sh("ip", "netns", "pids", netlab.netns("db-1"), check=False).stdout.split():
        assert time.monotonic() < deadline, "the process never showed up in the namespace"
        time.sleep(0.05)
    return inside


def gone_owner() -> dict:
    """The record of an owner that has exited: its pid may be reused, its start time will not match."""
    owner = subprocess.Popen(["sleep", "0"])
    start = netlab._process_start(owner.pid)
    owner.wait()
    return {"owner": owner.pid, "owner_start": start}


def test_a_lab_left_by_a_restarted_machine_is_taken_down(machine):
    """A restart kills every process; the bridge and the namespaces stay (seen on CI: 'a lab is
    already up (bridge jlab0 exists)', and the whole cutover part failed)."""
    remains(None, running_inside=False, started=machine)
    found = netlab.existing_lab()
    assert found is not None and found["stale"] and found["processes"] == 0

    netlab.clear_the_way(wait=0)

    assert netlab.existing_lab() is None
    assert netlab._lab_namespaces() == []
    assert "jlv-" not in _links()


def test_a_lab_whose_owner_died_is_taken_down_with_its_processes(machine, tmp_path):
    """A test run killed (-9) before its tear-down: its sshds run on, its owner is gone."""
    lab_dir = tmp_path / "lab"
    (lab_dir / "ssh").mkdir(parents=True)
    inside = remains({"dir": str(lab_dir), **gone_owner()}, running_inside=True, started=machine)
    found = netlab.existing_lab()
    assert found["stale"] and found["processes"] == 1, found

    netlab.clear_the_way(wait=0)

    assert netlab.existing_lab() is None
    assert netlab._lab_namespaces() == []
    inside.wait(timeout=10)  # killed with its namespace
    assert not lab_dir.exists()


@pytest.mark.parametrize("owned", [True, False], ids=["owner-alive", "no-owner-recorded"])
def test_a_lab_in_use_is_waited_for_then_refused_and_left_alone(machine, tmp_path, owned):
    """A lab with a live owner, or with no owner recorded and processes running (an operator's lab
    brought up by hand), is somebody's: waited for, then refused with its owner named, never touched."""
    record = {"dir": str(tmp_path)}
    owner = None
    if owned:
        owner = subprocess.Popen(["sleep", "600"])
        machine.append(owner)
        record.update(owner=owner.pid, owner_start=netlab._process_start(owner.pid))
    inside = remains(record, running_inside=True, started=machine)

    began = time.monotonic()
    with pytest.raises(netlab.LabError) as refused:
        netlab.clear_the_way(wait=3)
    assert time.monotonic() - began >= 3
    assert "in use" in str(refused.value)
    assert (f"owner pid {owner.pid}" if owned else "no owner recorded") in str(refused.value)
    assert _alive(inside) and netlab.existing_lab() is not None and len(netlab._lab_namespaces()) == 2

    if owned:  # once its owner is gone, the same lab is stale
        owner.kill()
        owner.wait()
        netlab.clear_the_way(wait=0)
        assert netlab.existing_lab() is None
        inside.wait(timeout=10)


def test_a_lab_in_use_that_goes_down_while_waited_for_is_not_waited_for_any_longer(machine, tmp_path):
    owner = subprocess.Popen(["sleep", "600"])
    machine.append(owner)
    remains({"dir": str(tmp_path), "owner": owner.pid, "owner_start": netlab._process_start(owner.pid)},
            running_inside=True, started=machine)
    # The other run's tear-down, two seconds into the wait.
    teardown = threading.Timer(2, lambda: netlab.Lab(None).down(remove=False))
    teardown.start()
    began = time.monotonic()
    try:
        netlab.clear_the_way(wait=120)
    finally:
        teardown.join()
    assert 2 <= time.monotonic() - began < 30
    assert netlab.existing_lab() is None
