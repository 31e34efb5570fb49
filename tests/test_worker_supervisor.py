"""The worker under a real supervisord: RUNNING, restarted after kill -9, graceful stop, nothing lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.procs import WorkerProcess, aplusb_site, wait_for
from support.programs import PROGRAMS

from arbiter.store import leases

BIN = Path(sys.executable).parent


def ctl(conf, *args):
    return subprocess.run([str(BIN / "supervisorctl"), "-c", str(conf), *args], capture_output=True, text=True,
                          timeout=60)


def test_worker_under_supervisord(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    problem, user, cred, testdata = site.problem, site.user, site.cred, site.testdata
    a = arbiters.start(db.dsn)
    spec = WorkerProcess(tmp_path, "home-1", "home", "arbiter", testdata, arbiter_urls=[a.url], credential=cred,
                         heartbeat_interval_secs=1.0, long_poll_secs=2.0, backoff_initial_secs=0.2,
                         backoff_max_secs=2.0)
    shipped = (Path(__file__).resolve().parents[1] / "worker" / "supervisor" / "judge-worker.conf").read_text()
    program = (shipped.replace("/opt/judge-arbiter/venv/bin/judge-worker", f"{BIN / 'judge-worker'}")
               .replace("/etc/judge-worker/worker.toml", str(spec.config))
               .replace("/var/lib/judge-worker", str(tmp_path))
               .replace("/var/log/judge-worker/worker.log", str(tmp_path / "worker.log")))
    conf = tmp_path / "supervisord.conf"
    sock = tmp_path / "supervisor.sock"
    conf.write_text(f"""[unix_http_server]
file={sock}
[supervisord]
logfile={tmp_path / 'supervisord.log'}
pidfile={tmp_path / 'supervisord.pid'}
nodaemon=false
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://{sock}
{program}""")
    subprocess.run([str(BIN / "supervisord"), "-c", str(conf)], check=True, timeout=30)
    try:
        wait_for(lambda: "RUNNING" in ctl(conf, "status", "judge-worker").stdout, 30, what="RUNNING")
        pid = int(ctl(conf, "pid", "judge-worker").stdout.strip())
        with db.connect() as conn:
            first = leases.submit(conn, user, problem, "python3", PROGRAMS["python3"]["AC"])
        with db.connect() as conn:
            wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s", (first,)).fetchone()[0]
                     == "AC", 60, what="judged under supervisor")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: ctl(conf, "pid", "judge-worker").stdout.strip() not in ("0", str(pid)), 30,
                 what="supervisor restarts the worker")
        with db.connect() as conn:
            second = leases.submit(conn, user, problem, "c", PROGRAMS["c"]["WA"])
            wait_for(lambda: conn.execute("SELECT status FROM submissions WHERE id = %s", (second,)).fetchone()[0]
                     == "WA", 60, what="judged after the restart")
        t0 = time.monotonic()
        out = ctl(conf, "stop", "judge-worker")
        assert "stopped" in out.stdout, out
        assert time.monotonic() - t0 < 30
        assert "worker stopped" in (tmp_path / "worker.log").read_text()
    finally:
        ctl(conf, "shutdown")
