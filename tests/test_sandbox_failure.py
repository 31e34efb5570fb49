"""A sandbox that cannot start is the machine's failure, never the submission's verdict.

Found by the long chaos run: while other sandboxes ran on the machine, setpriv could not exec
bwrap (the sandbox uid's RLIMIT_NPROC budget was used up) and the worker reported CE. The faults
here are real (tests/support/sandbox_faults.py): the kernel refuses the sandbox its processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from support.procs import aplusb_site, sandbox_work_dir, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS
from support.sandbox_faults import PrivateSandbox, SandboxOutage

from arbiter.store import leases
from worker.judging.judge import Job, Judge
from worker.sandbox import cgroups
from worker.sandbox.runner import Limits, SandboxFailure

# Every fault here breaks the sandboxes of this identity only (tests/support/sandbox_faults.py), so the
# module runs beside the rest of the suite and the cutover lab.
IDENTITY = PrivateSandbox(uid=64990, cgroup_parent="judge-sandbox-faults")

WORKER_FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
               "backoff_max_secs": 2.0, "legacy_poll_secs": 0.2}


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    testdata = tmp_path_factory.mktemp("judge") / "testdata"
    write_testdata(testdata, 1, APLUSB_TESTS)
    work = sandbox_work_dir()
    yield Judge(IDENTITY.sandbox(), testdata, work)
    shutil.rmtree(work, ignore_errors=True)


def job(language: str, verdict: str = "AC") -> Job:
    return Job(submission_id=1, problem_id=1, problem_slug="p1", language=language,
               source=PROGRAMS[language][verdict], time_limit_ms=2000, memory_limit_kb=262144)


@pytest.mark.parametrize("language", ["python3", "c"])
def test_a_sandbox_that_cannot_start_raises_instead_of_judging(judge, language):
    with SandboxOutage(IDENTITY):
        with pytest.raises(SandboxFailure, match="did not start the program") as failure:
            judge.judge(job(language))
    # The chain's own words come with the failure (the worker logs them): here the outage's cause.
    assert "Resource temporarily unavailable" in str(failure.value), str(failure.value)
    assert judge.judge(job(language)).verdict == "AC"
    assert judge.judge(job(language, "CE")).verdict == "CE"  # real compiler diagnostics stay CE


def test_a_test_run_whose_sandbox_cannot_start_is_no_runtime_error(judge, tmp_path):
    box = sandbox_work_dir()
    try:
        (box / "main.py").write_text("print(1)\n")
        with SandboxOutage(IDENTITY), open(tmp_path / "err", "wb") as err:
            with pytest.raises(SandboxFailure):
                judge.sandbox.run(["/usr/bin/python3", "main.py"], box=box, stdin=subprocess.DEVNULL,
                                  stdout=tmp_path / "out", stderr=err,
                                  limits=Limits(cpu_ms=1000, wall_ms=5000, memory_kb=262144))
        assert b"Resource temporarily unavailable" in (tmp_path / "err").read_bytes()
    finally:
        shutil.rmtree(box, ignore_errors=True)


def test_other_processes_of_the_sandbox_uid_do_not_starve_a_run(judge):
    """The defect itself: RLIMIT_NPROC counts every process of the uid on the machine."""
    if cgroups.detect() is None:
        pytest.skip("without a pids cgroup RLIMIT_NPROC is the only process limit (documented)")
    uid = IDENTITY.uid
    sleepers = [subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
                for _ in range(80)]
    try:
        assert judge.judge(job("python3")).verdict == "AC"
        assert judge.judge(job("c")).verdict == "AC"
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


@pytest.fixture
def site(make_db, arbiters, workers, tmp_path):
    db = make_db("stage1")
    aplusb = aplusb_site(db, tmp_path)

    def submit():
        with db.connect() as conn:
            return leases.submit(conn, aplusb.user, aplusb.problem, "python3", PROGRAMS["python3"]["AC"])

    def row(sid):
        with db.connect() as conn:
            return conn.execute("SELECT status, judge_attempts FROM submissions WHERE id = %s", (sid,)).fetchone()

    def judgings(sid):
        with db.connect() as conn:
            return conn.execute("SELECT worker_id, verdict, detail FROM submission_judgings "
                                "WHERE submission_id = %s ORDER BY id", (sid,)).fetchall()

    return dict(db=db, arbiters=arbiters, workers=workers, testdata=aplusb.testdata, cred=aplusb.cred, submit=submit,
                row=row, judgings=judgings)


def arbiter_worker(site):
    a = site["arbiters"].start(site["db"].dsn)
    w = site["workers"]("home-1", "home", "arbiter", site["testdata"], arbiter_urls=[a.url],
                        credential=site["cred"], sandbox=IDENTITY.worker_config(), **WORKER_FAST).start()
    wait_for(lambda: '"worker started"' in w.log_text(), 30, what="worker started")
    return w


def test_worker_judges_again_after_a_passing_sandbox_failure(site):
    w = arbiter_worker(site)
    with SandboxOutage(IDENTITY):
        sid = site["submit"]()
        wait_for(lambda: "sandbox failed; judging again" in w.log_text(), 30, what="a sandbox failure")
    wait_for(lambda: site["row"](sid)[0] not in ("pending", "judging"), 30, what="judged")
    assert site["row"](sid) == ("AC", 1)
    assert [(j[0], j[1]) for j in site["judgings"](sid)] == [("home-1", "AC")]


def test_worker_hands_the_lease_back_and_takes_no_work_while_the_sandbox_keeps_failing(site):
    w = arbiter_worker(site)
    outage = SandboxOutage(IDENTITY).begin()
    try:
        sid = site["submit"]()
        wait_for(lambda: "handing the lease back" in w.log_text(), 30, what="the worker giving up")
        # Handed back (release), not left to expire: pending again, the attempt given back, and the
        # broken worker does not take it.
        wait_for(lambda: site["row"](sid)[0] == "pending", 30, interval=0.2, what="the lease handed back")
        with site["db"].connect() as conn:
            assert conn.execute("SELECT judge_attempts, lease_releases FROM submissions WHERE id = %s",
                                (sid,)).fetchone() == (0, 1)
        wait_for(lambda: "sandbox still failing; taking no work" in w.log_text(), 30, what="the self-test failing")
        with site["db"].connect() as conn:
            assert conn.execute("SELECT count(*) FROM lease_grants WHERE submission_id = %s",
                                (sid,)).fetchone() == (1,)
        assert site["judgings"](sid) == []
    finally:
        outage.end()
    wait_for(lambda: site["row"](sid)[0] not in ("pending", "judging"), 90, interval=0.3, what="judged")
    assert site["row"](sid) == ("AC", 1)
    assert [(j[0], j[1]) for j in site["judgings"](sid)] == [("home-1", "AC")]
    assert "sandbox works again" in w.log_text()


def test_legacy_worker_reports_system_error_with_the_reason(site):
    """A legacy claim is never reclaimed by anyone, so a sandbox that keeps failing ends it visibly."""
    from test_legacy_coexistence import legacy_login

    w = site["workers"]("home-2", "home", "direct", site["testdata"], dsn=legacy_login(site["db"], "home-2"),
                        sandbox=IDENTITY.worker_config(), **WORKER_FAST).start()
    wait_for(lambda: '"worker started"' in w.log_text(), 30, what="worker started")
    with SandboxOutage(IDENTITY):
        sid = site["submit"]()
        wait_for(lambda: site["row"](sid)[0] not in ("pending", "judging"), 30, interval=0.2, what="decided")
    assert site["row"](sid)[0] == "system_error"
    (worker_id, verdict, detail), = site["judgings"](sid)
    assert (worker_id, verdict) == ("home-2", "system_error")
    detail = detail if isinstance(detail, dict) else json.loads(detail)
    assert "sandbox failure" in detail["reason"]


def test_check_config_names_the_sandbox_failure(site):
    import sys

    from support.procs import WorkerProcess

    w = WorkerProcess(site["testdata"].parent, "home-9", "home", "direct", site["testdata"], dsn=site["db"].dsn,
                      sandbox=IDENTITY.worker_config())
    with SandboxOutage(IDENTITY):
        broken = subprocess.run([sys.executable, "-m", "worker.main", "--config", str(w.config), "--check-config"],
                                capture_output=True, text=True, timeout=60)
    assert broken.returncode == 3, broken.stderr
    assert "sandbox self-test failed" in broken.stderr and "Resource temporarily unavailable" in broken.stderr
    assert "Traceback" not in broken.stderr
    fine = subprocess.run([sys.executable, "-m", "worker.main", "--config", str(w.config), "--check-config"],
                          capture_output=True, text=True, timeout=60)
    assert fine.returncode == 0, fine.stderr
