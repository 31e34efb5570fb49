"""The judge with real compilers and the real sandbox: every verdict in every language, hostile programs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time

import pytest
from support.procs import sandbox_work_dir, wait_for, write_testdata
from support.programs import (
    APLUSB_TESTS,
    FORK_BOMB_C,
    FORK_BOMB_PY,
    PROGRAMS,
    escape_writer_py,
    network_probe_c,
    network_probe_py,
)
from support.sandbox_faults import PrivateSandbox

from worker.judging.judge import Job, Judge, tokens_equal
from worker.sandbox.runner import Sandbox

SANDBOX_UID = 65534


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge")
    testdata = root / "testdata"
    write_testdata(testdata, 1, APLUSB_TESTS)
    write_testdata(testdata, 2, [("", "connected\n")])
    write_testdata(testdata, 3, [("", "written\n")])
    (testdata / "4").mkdir()  # a problem whose test data is missing
    work = sandbox_work_dir()
    sandbox = Sandbox(uid=SANDBOX_UID, gid=SANDBOX_UID)
    sandbox.self_test(work / "selftest")
    yield Judge(sandbox, testdata, work, output_limit_kb=8192)
    shutil.rmtree(work, ignore_errors=True)


def job(language, source, problem_id=1, time_limit_ms=1000, memory_limit_kb=131072):
    return Job(submission_id=abs(hash(source)) % 100000, problem_id=problem_id, problem_slug=f"p{problem_id}",
               language=language, source=source, time_limit_ms=time_limit_ms, memory_limit_kb=memory_limit_kb)


CASES = [(lang, verdict) for lang in PROGRAMS for verdict in PROGRAMS[lang]]


@pytest.mark.parametrize("language,expected", CASES, ids=[f"{l}-{v}" for l, v in CASES])
def test_every_verdict_in_every_language(judge, language, expected):
    result = judge.judge(job(language, PROGRAMS[language][expected]))
    assert result.verdict == expected, result.detail
    if expected == "AC":
        assert len(result.detail["tests"]) == len(APLUSB_TESTS)
        assert 0 < result.memory_kb < 131072
    if expected == "TLE":
        assert result.detail["tests"][-1]["wall_ms"] < 1000 * 3 + 1500
    if expected == "MLE":
        assert result.memory_kb >= 131072 or result.detail["tests"][-1]["memory_kb"] >= 131072
    if expected == "CE":
        assert result.detail["compiler_output"]


# The bomb runs under a uid and cgroup parent of its own: the check below counts every process of
# that uid on the machine (other workers' sandboxes must not be counted), and without a pids cgroup
# the bomb uses up that uid's process budget, which must not be anyone else's.
BOMB_IDENTITY = PrivateSandbox(uid=64991, cgroup_parent="judge-sandbox-bomb")


@pytest.fixture(scope="module")
def bomb_judge(judge):
    return Judge(BOMB_IDENTITY.sandbox(), judge.testdata_dir, judge.work_dir, output_limit_kb=8192)


@pytest.mark.parametrize("language,source", [("c", FORK_BOMB_C), ("python3", FORK_BOMB_PY)], ids=["c", "python3"])
def test_fork_bomb_is_contained(bomb_judge, language, source):
    t0 = time.monotonic()
    result = bomb_judge.judge(job(language, source, time_limit_ms=500))
    assert result.verdict in ("TLE", "RE", "MLE"), result.detail
    assert time.monotonic() - t0 < 15
    wait_for(lambda: BOMB_IDENTITY.processes() == [], 3, what="every sandboxed process to be gone")
    # The host can still fork.
    assert subprocess.run(["true"]).returncode == 0


@pytest.mark.parametrize("language", ["python3", "c"])
def test_no_network_inside_the_sandbox(judge, language):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                pass

    thread = threading.Thread(target=accept)
    thread.start()
    source = network_probe_py(port) if language == "python3" else network_probe_c(port)
    result = judge.judge(job(language, source, problem_id=2))
    thread.join()
    server.close()
    assert accepted == [], "a sandboxed program reached a host socket"
    assert result.verdict == "RE", result.detail  # connect failed -> non-zero exit, never 'connected'


def test_writes_outside_the_box_never_reach_the_host(judge, tmp_path):
    targets = [str(tmp_path / "escaped.txt"), "/etc/judge-escape", "/usr/judge-escape", "/box/../judge-escape",
               "/root/judge-escape", "/tmp/../judge-escape-root"]
    result = judge.judge(job("python3", escape_writer_py(targets), problem_id=3))
    for target in targets:
        assert not os.path.exists(os.path.normpath(target)), target
    assert not (tmp_path / "escaped.txt").exists()
    assert not os.path.exists("/judge-escape") and not os.path.exists("/judge-escape-root")
    # Inside the sandbox only its private tmpfs /tmp is writable; nothing above is written on the host.
    assert result.verdict in ("AC", "WA")


def test_host_secrets_are_not_visible(judge):
    src = ("import os\nseen = [p for p in ('/etc/shadow', '/etc/passwd', '/root', '/home', '/work') "
           "if os.path.exists(p)]\nprint('written' if not seen else 'visible:' + ','.join(seen))\n")
    result = judge.judge(job("python3", src, problem_id=3))
    assert result.verdict == "AC", result.detail


def test_compiler_cannot_include_host_files(judge):
    src = '#include "/etc/shadow"\nint main(void){return 0;}\n'
    result = judge.judge(job("c", src))
    assert result.verdict == "CE"
    assert "root:" not in result.detail["compiler_output"]


def test_missing_test_data_is_never_a_verdict_but_a_reason_this_worker_cannot_judge_it(judge):
    from worker.judging.judge import CannotJudgeHere

    with pytest.raises(CannotJudgeHere, match="no .in files"):
        judge.judge(job("python3", PROGRAMS["python3"]["AC"], problem_id=4))
    with pytest.raises(CannotJudgeHere, match="no test data for problem 99"):
        judge.judge(job("python3", PROGRAMS["python3"]["AC"], problem_id=99))


# A correct A+B that writes a lot of debug output to stderr first.
STDERR_CHATTY_C = r"""
#include <stdio.h>
#include <string.h>
int main(void) {
    static char line[1 << 20];
    memset(line, 'x', sizeof line);
    for (int i = 0; i < %d; i++) fwrite(line, 1, sizeof line, stderr);
    fputs("last words on stderr\n", stderr);
    long a, b;
    if (scanf("%%ld %%ld", &a, &b) != 2) return 1;
    printf("%%ld\n", a + b);
    return 0;
}
"""


def test_stderr_is_never_charged_as_the_programs_memory(judge):
    """48 MB of stderr from a program using about 1 MB, under a 32 MB limit: AC, its own memory."""
    chatty = Judge(judge.sandbox, judge.testdata_dir, judge.work_dir, output_limit_kb=8192, stderr_limit_kb=65536)
    result = chatty.judge(job("c", STDERR_CHATTY_C % 48, memory_limit_kb=32768))
    assert result.verdict == "AC", result.detail
    # Its own memory is about 2 MB (a 1 MB buffer, libc, the sandbox's pages). With stderr written to a
    # file the page cache of it was charged too: 10.6 MB here, 69 MB in the report of issue #14.
    assert result.memory_kb < 8192, result.detail


def test_stderr_past_its_limit_is_ole_and_only_its_tail_is_kept(judge):
    result = judge.judge(job("c", STDERR_CHATTY_C % 16))  # the fixture's stderr limit: 8 MB
    assert result.verdict == "OLE", result.detail
    failed = judge.judge(job("python3", "import sys\nprint('trace line', file=sys.stderr)\n" + "1 / 0\n"))
    assert failed.verdict == "RE"
    tail = failed.detail["stderr_tail"]
    assert "ZeroDivisionError" in tail and "trace line" in tail and len(tail) <= 1000


def test_token_comparison(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1 2\n3\n")
    b.write_text("1   2 3")
    assert tokens_equal(a, b)
    b.write_text("1 2 4")
    assert not tokens_equal(a, b)


def test_the_wall_clock_limit_starts_with_the_program_not_with_the_sandbox(tmp_path):
    """A sandbox slow to set up (a busy machine creating namespaces) costs the program nothing."""
    from worker.sandbox.runner import Limits

    tools, box = sandbox_work_dir(), sandbox_work_dir()  # the sandbox uid runs the wrapper: it must reach it
    try:
        slow_bwrap = tools / "slow-bwrap"
        slow_bwrap.write_text(f"#!/bin/sh\nsleep 2\nexec {shutil.which('bwrap')} \"$@\"\n")
        slow_bwrap.chmod(0o755)
        (box / "main.py").write_text("print(1)\n")
        os.chown(box, 65534, 65534)
        with open(tmp_path / "err", "wb") as err:
            result = Sandbox(bwrap=str(slow_bwrap)).run(
                ["/usr/bin/python3", "main.py"], box=box, stdin=subprocess.DEVNULL, stdout=tmp_path / "out",
                stderr=err, limits=Limits(cpu_ms=1000, wall_ms=1000, memory_kb=262144))
        assert not result.wall_timeout and result.exit_code == 0, (result, (tmp_path / "err").read_text())
        assert (tmp_path / "out").read_text() == "1\n"
        assert result.wall_ms < 1000, "the 2 s set-up is not the program's wall time"
    finally:
        shutil.rmtree(tools, ignore_errors=True)
        shutil.rmtree(box, ignore_errors=True)


def _evict_from_page_cache(path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_reading_a_large_input_is_never_charged_as_the_programs_memory(judge):
    """A+B after 100 MB of blanks, under a 64 MB limit: AC cold and warm, with the program's own ~1 MB.

    The cgroup's peak counts the page cache of the input the program read (80.9 MB and MLE cold, in
    the report of issue #14); the launcher's figure is the program's RSS."""
    directory = write_testdata(judge.testdata_dir, 5, [("", "3\n")])
    with open(directory / "1.in", "wb") as f:
        blank = b" " * (1 << 20)
        for _ in range(100):
            f.write(blank)
        f.write(b"1 2\n")
    try:
        for cache in ("cold", "warm"):
            if cache == "cold":
                _evict_from_page_cache(directory / "1.in")
            result = judge.judge(job("c", PROGRAMS["c"]["AC"], problem_id=5, time_limit_ms=5000,
                                     memory_limit_kb=65536))
            assert result.verdict == "AC", (cache, result.detail)
            assert result.memory_kb < 8192, (cache, result.detail)
    finally:
        shutil.rmtree(directory)


def test_cpu_time_is_the_programs_own(judge):
    """Nothing of the launch chain (bash, prlimit, setpriv, bwrap) is charged: 12-13 ms before."""
    result = judge.judge(job("c", PROGRAMS["c"]["AC"]))
    assert result.verdict == "AC", result.detail
    assert all(t["time_ms"] <= 2 for t in result.detail["tests"]), result.detail


# The parent answers and exits without waiting for the child that does the work (it only reads a
# pipe the child writes when done, so a busy machine cannot end the child early): the child's CPU
# must still be charged (the launcher reaps what the program leaves and reports all of it).
CPU_IN_AN_ORPHAN_C = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(void) {
    long a, b;
    int done[2];
    char c;
    if (scanf("%ld %ld", &a, &b) != 2 || pipe(done) != 0) return 1;
    if (fork() == 0) {
        volatile unsigned long x = 0;
        clock_t start = clock();
        while (clock() - start < CLOCKS_PER_SEC * 3 / 10) x++;
        write(done[1], "x", 1);
        _exit(0);
    }
    close(done[1]);
    if (read(done[0], &c, 1) != 1) return 1;
    printf("%ld\n", a + b);
    return 0;
}
"""


def test_cpu_used_by_processes_the_program_left_behind_is_charged(judge):
    result = judge.judge(job("c", CPU_IN_AN_ORPHAN_C, time_limit_ms=2000))
    assert result.verdict == "AC", result.detail
    assert all(t["time_ms"] >= 250 for t in result.detail["tests"]), result.detail


PRIVILEGE_PROBE = """
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
limits = {line[:26].strip(): line[26:].split()[:2] for line in open("/proc/self/limits").read().splitlines()[1:]}
print(repr({k: status[k].split() for k in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                          "NoNewPrivs", "Cpus_allowed_list")}))
print(repr(limits))
"""


@pytest.mark.parametrize("pinned", [False, True], ids=["unpinned", "pinned-by-affinity"])
def test_the_program_runs_unprivileged_under_its_limits(tmp_path, pinned):
    """What the launch chain sets before bwrap (launcher.c --enter): the sandbox uid and gid and no
    other group, no capability, no_new_privs, the run's resource limits, and a slot's CPU where no
    cpuset cgroup pins it."""
    import ast

    from worker.sandbox.runner import Limits

    box = sandbox_work_dir()
    try:
        (box / "probe.py").write_text(PRIVILEGE_PROBE)
        cpu = max(os.sched_getaffinity(0))
        sandbox = Sandbox(uid=SANDBOX_UID, gid=SANDBOX_UID, cpus=(cpu,) if pinned else ())
        sandbox.cpuset = False  # the affinity path; the cpuset path is tests/test_slots.py's
        limits = Limits(cpu_ms=1500, wall_ms=10000, memory_kb=262144)
        result = sandbox.run(["/usr/bin/python3", "probe.py"], box=box, stdin=subprocess.DEVNULL,
                             stdout=tmp_path / "out", stderr=tmp_path / "err", limits=limits)
        assert result.exit_code == 0, (tmp_path / "err").read_text()
        status_line, limits_line = (tmp_path / "out").read_text().splitlines()
        status, rlimits = ast.literal_eval(status_line), ast.literal_eval(limits_line)
    finally:
        shutil.rmtree(box, ignore_errors=True)
    assert status["Uid"] == [str(SANDBOX_UID)] * 4 and status["Gid"] == [str(SANDBOX_UID)] * 4
    assert status["Groups"] == []
    for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[caps][0], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"] == ["1"]
    if pinned:
        assert status["Cpus_allowed_list"] == [str(cpu)]
    assert rlimits["Max cpu time"] == ["3", "3"]  # ceil(1.5 s) + 1, soft = hard
    assert rlimits["Max core file size"] == ["0", "0"]
    assert rlimits["Max open files"] == [str(limits.max_open_files)] * 2
    assert rlimits["Max file size"] == [str(limits.output_kb * 1024)] * 2
