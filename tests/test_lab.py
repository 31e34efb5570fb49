"""README command one: the local lab judges every sample with the right verdict, also under --chaos and --ha."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def lab_dir():
    # Not pytest's tmp_path: its parents are mode 0700, and the postgres user must reach the cluster.
    path = Path(tempfile.mkdtemp(prefix="judge-lab-test-", dir="/tmp")) / "lab"
    path.parent.chmod(0o711)
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def run_lab(lab_dir, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "arbiter.lab.run", "--dir", str(lab_dir), *args],
                            capture_output=True, text=True, timeout=600)
    # Nothing it started keeps running: supervisord and every program are gone.
    left = subprocess.run(["pgrep", "-f", str(lab_dir)], capture_output=True, text=True).stdout.split()
    assert left == [], f"the lab left processes running: {left}"
    return result


def test_lab_judges_every_sample_correctly_under_supervisord(lab_dir):
    result = run_lab(lab_dir, "--copies", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "11 submissions, 11 with the expected verdict, 0 judged twice with the same test data, 0 lost" in result.stdout
    # The production worker runs two slots, and the summary says which slot judged what. (Which of
    # prod-1's slots get work among 11 submissions is the dispatch's timing: home workers go first,
    # so prod-1 may judge only two, on one slot. That both slots judge at once is
    # test_slots.py::test_two_slots_judge_two_submissions_at_once_each_on_its_own_cpu.)
    assert re.search(r" (home-1|home-2|prod-1)/[01] ", result.stdout), result.stdout[-3000:]
    assert "slots = 2" in (lab_dir / "prod-1" / "worker.toml").read_text()
    # One problem's test data changed mid-run: what was judged with the old data was judged again with
    # the new, which the workers fetched (their shipped copy is the old one).
    changed = re.search(r"test data of reverse changed mid-run: (\d+) submission\(s\) rejudged with the new "
                        r"data, 0 left judged with the old", result.stdout)
    assert changed and int(changed.group(1)) >= 1, result.stdout[-3000:]
    # The arbiter's canary probe runs in the lab as in production; its canaries are counted apart.
    assert re.search(r"canaries of the arbiter's probe: (\d+) of \1 as expected", result.stdout), result.stdout[-2000:]
    conf = (lab_dir / "supervisord.conf").read_text()
    assert all(f"[program:{p}]" in conf for p in ("arbiter", "home-1", "home-2", "prod-1"))
    # Over HTTPS with the lab's own CA, as in production: every worker trusts that CA and nothing else.
    assert re.search(r"arbiter at https://127\.0\.0\.1:\d+/status", result.stdout), result.stdout[:2000]
    assert "tls_certfile" in (lab_dir / "arbiter.toml").read_text()
    for worker in ("home-1", "home-2", "prod-1"):
        toml = (lab_dir / worker / "worker.toml").read_text()
        assert 'arbiter_urls = ["https://' in toml and f'tls_ca_file = "{lab_dir}/tls/ca/ca.crt"' in toml


def test_lab_chaos_kills_programs_and_loses_nothing(lab_dir):
    result = run_lab(lab_dir, "--copies", "3", "--chaos")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "33 submissions, 33 with the expected verdict, 0 judged twice with the same test data, 0 lost" in result.stdout
    assert ", 0 left judged with the old" in result.stdout, result.stdout[-3000:]


def test_lab_ha_fails_the_database_over_and_the_arbiter_and_loses_nothing(lab_dir):
    """``bash .ci/lab --ha``: PostgreSQL on two hosts under Patroni (three etcd members), two arbiters;
    a third of the way the leading arbiter dies, then the database primary (-9, the whole host); each
    fault is followed by a lease, the killed database host streams again, and every submission gets
    its verdict once. Removed by hand once: with the arbiters' DSN naming the first host only (no
    multi-host DSN) no lease followed the failover and the lab timed out."""
    result = run_lab(lab_dir, "--ha")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "33 submissions, 33 with the expected verdict, 0 judged twice with the same test data, 0 lost" in result.stdout
    failover = re.search(r"^database failover: primary (pg\d) killed -9; first lease on the new primary \((pg\d)\) "
                         r"([\d.]+) s after$", result.stdout, re.M)
    assert failover and failover.group(1) != failover.group(2), result.stdout[-3000:]
    takeover = re.search(r"^arbiter takeover: (arbiter-\d) \(the leader\) killed -9; first lease ([\d.]+) s after, "
                         r"(arbiter-\d) leading$", result.stdout, re.M)
    assert takeover and takeover.group(1) != takeover.group(3), result.stdout[-3000:]
    assert re.search(rf"^database hosts: .*{failover.group(1)} sync_standby.*; the killed one streams again",
                     result.stdout, re.M), result.stdout[-3000:]
    print(failover.group(0), takeover.group(0), sep="\n")
    toml = (lab_dir / "home-1" / "worker.toml").read_text()
    assert toml.count("https://127.0.0.1:") == 2, "workers list both arbiters"
    assert "target_session_attrs=read-write" in (lab_dir / "arbiter-1.toml").read_text()


def test_lab_keep_leaves_the_site_running_for_judgectl_and_the_status_page_until_ctrl_c(lab_dir):
    import os
    import signal
    import ssl
    import time
    import urllib.request

    lab = subprocess.Popen([sys.executable, "-u", "-m", "arbiter.lab.run", "--dir", str(lab_dir), "--copies", "1",
                            "--keep"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("lab: Ctrl-C stops everything") for line in said):
            assert lab.poll() is None and time.monotonic() < deadline, "".join(said)[-3000:]
            said.append(lab.stdout.readline())
        text = "".join(said)
        assert "11 submissions, 11 with the expected verdict" in text, text[-3000:]
        # The progress line shows throughput; the done count is what was decided at least once.
        assert re.search(r"done \d+/11 +\d+\.\d verdicts/s", text), text[-3000:]
        url = re.search(r"Status page: (https://\S+/status) \(the lab's CA: (\S+)\)", text)
        dsn = re.search(r"export JUDGE_DSN='([^']+)'", text)
        assert url and dsn, text[-2000:]
        context = ssl.create_default_context(cafile=url.group(2))
        with urllib.request.urlopen(url.group(1), timeout=10, context=context) as page:
            assert page.status == 200 and "judge-arbiter" in page.read().decode()
        listed = subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "submission", "list", "--limit", "100"],
                                capture_output=True, text=True, timeout=60, env=dict(os.environ, JUDGE_DSN=dsn.group(1)))
        assert listed.returncode == 0 and "11 submission(s)" in listed.stdout, listed.stdout + listed.stderr
        lab.send_signal(signal.SIGINT)
        assert lab.wait(60) == 0
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait(30)
    left = subprocess.run(["pgrep", "-f", str(lab_dir)], capture_output=True, text=True).stdout.split()
    assert left == [], f"the lab left processes running: {left}"


def test_a_failed_lab_run_keeps_its_directory_and_says_where():
    result = subprocess.run([sys.executable, "-m", "arbiter.lab.run", "--copies", "1", "--timeout", "0.5"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    kept = re.search(r"lab: the run failed; its directory and logs stay in (\S+) ", result.stderr)
    assert kept, result.stderr[-2000:]
    try:
        assert (Path(kept.group(1)) / "supervisord.log").exists()
        assert "lab: timed out" in result.stderr
    finally:
        shutil.rmtree(kept.group(1), ignore_errors=True)
