"""A submission's box (worker/sandbox/box.py, launcher.c --box): set up once, each test one fork inside it.

What the box must keep from a one-off run: nothing of one test reaches the next (files, processes,
IPC objects), each test's CPU time and memory are its own, and a box that fails is never a verdict.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from support.procs import sandbox_work_dir

from worker.sandbox.box import TRANSITIONS, BoxState, BoxStateError, next_state
from worker.sandbox.runner import Limits, Sandbox, SandboxFailure

SANDBOX_UID = 65534
LIMITS = Limits(cpu_ms=2000, wall_ms=4000, memory_kb=131072)

# Looks for what an earlier test could have left, says what it found, then leaves all of it behind
# for the next test: files in /tmp (one in a directory it makes unreadable) and /dev/shm, System V
# shared memory, a semaphore set and a message queue, and a process that outlives it. It also tries
# to make a POSIX message queue (whose name would outlive every process).
LEFTOVER_PROBE = r"""
#include <dirent.h>
#include <fcntl.h>
#include <mqueue.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

static int entries(const char *path) {
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

int main(void) {
    char found[512] = "";
    if (entries("/tmp")) strcat(found, " tmp");
    if (entries("/dev/shm")) strcat(found, " shm");
    DIR *proc = opendir("/proc");
    struct dirent *e;
    while ((e = readdir(proc))) {
        int pid = atoi(e->d_name);
        if (pid > 1 && pid != getpid()) { strcat(found, " process"); break; }
    }
    closedir(proc);
    if (shmget(0x5eed, 0, 0) >= 0) strcat(found, " sysv-shm");
    if (semget(0x5eed, 0, 0) >= 0) strcat(found, " sysv-sem");
    if (msgget(0x5eed, 0) >= 0) strcat(found, " sysv-msg");
    printf("%s\n", found[0] ? found + 1 : "clean");
    struct mq_attr attr = {.mq_maxmsg = 1, .mq_msgsize = 1};
    mqd_t q = mq_open("/judge-leftover", O_CREAT | O_RDWR, 0600, &attr);
    printf("%s\n", q == (mqd_t)-1 ? "no-mqueue" : "mqueue");
    fflush(stdout);

    FILE *f = fopen("/tmp/left", "w"); if (f) fclose(f);
    mkdir("/tmp/locked", 0700);
    f = fopen("/tmp/locked/inside", "w"); if (f) fclose(f);
    chmod("/tmp/locked", 0);
    f = fopen("/dev/shm/left", "w"); if (f) fclose(f);
    shmget(0x5eed, 4096, IPC_CREAT | 0600);
    semget(0x5eed, 1, IPC_CREAT | 0600);
    msgget(0x5eed, IPC_CREAT | 0600);
    if (fork() == 0) {
        setsid();
        if (fork() == 0) { close(1); close(2); sleep(60); }
        _exit(0);
    }
    return 0;
}
"""

# argv[1]: "big" touches 64 MiB and spins for 300 ms of CPU; "small" does neither; "deep" makes a
# directory tree in /tmp deeper than the box's wipe can hold open; "spin" never ends.
WORKLOAD = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "big") == 0) {
        char *p = malloc(64 << 20);
        memset(p, 1, 64 << 20);
        clock_t start = clock();
        volatile unsigned long x = 0;
        while (clock() - start < CLOCKS_PER_SEC * 3 / 10) x++;
        printf("%d\n", p[12345]);
    } else if (argc > 1 && strcmp(argv[1], "deep") == 0) {
        if (chdir("/tmp") != 0) return 1;
        for (int i = 0; i < 200; i++)
            if (mkdir("d", 0700) != 0 || chdir("d") != 0) return 1;
        printf("deep\n");
    } else if (argc > 1 && strcmp(argv[1], "spin") == 0) {
        for (volatile unsigned long x = 0;; x++) {}
    } else {
        printf("small\n");
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def sandbox():
    work = sandbox_work_dir()
    sb = Sandbox(uid=SANDBOX_UID, gid=SANDBOX_UID)
    sb.self_test(work / "selftest")
    yield sb
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def run_dir(tmp_path_factory):
    root = sandbox_work_dir() / f"box-{os.urandom(4).hex()}"
    box = root / "box"
    box.mkdir(parents=True)
    for name, source in (("probe", LEFTOVER_PROBE), ("work", WORKLOAD)):
        (root / f"{name}.c").write_text(source)
        subprocess.run(["gcc", "-O2", "-o", str(box / name), str(root / f"{name}.c")], check=True)
    os.chown(box, SANDBOX_UID, SANDBOX_UID)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run(box, run_dir: Path, argv: list[str], limits: Limits = LIMITS):
    stdin = run_dir / "in"
    stdin.write_text("")
    with open(stdin, "rb") as f:
        result = box.run(argv, stdin=f, stdout=run_dir / "out", stderr=run_dir / "err", limits=limits)
    return result, (run_dir / "out").read_text()


def test_nothing_a_test_leaves_reaches_the_next(sandbox, run_dir):
    with sandbox.box(run_dir / "box", LIMITS, run_dir / "box.log") as box:
        for _ in range(3):
            result, out = run(box, run_dir, ["./probe"])
            assert (result.exit_code, out) == (0, "clean\nno-mqueue\n"), (result, (run_dir / "err").read_text())
            assert box.state is BoxState.READY
        # The same box served all three: the wipe, not a new box, made each test start clean.
        assert box.starts == 1


def test_each_test_reports_its_own_cpu_time_and_memory(sandbox, run_dir):
    with sandbox.box(run_dir / "box", LIMITS, run_dir / "box.log") as box:
        big, out = run(box, run_dir, ["./work", "big"])
        assert (big.exit_code, out) == (0, "1\n")
        small, out = run(box, run_dir, ["./work", "small"])
        assert (small.exit_code, out) == (0, "small\n")
        assert box.starts == 1
    assert big.memory_kb >= 64 * 1024 and big.cpu_ms >= 280, big
    # Nothing of the big test: its 64 MiB and 300 ms are not the small one's.
    assert small.memory_kb < 4096 and small.cpu_ms <= 10, small


def test_a_timed_out_test_ends_the_box_and_the_next_test_gets_a_new_one(sandbox, run_dir):
    limits = Limits(cpu_ms=20000, wall_ms=500, memory_kb=131072)
    with sandbox.box(run_dir / "box", limits, run_dir / "box.log") as box:
        spun, _ = run(box, run_dir, ["./work", "spin"], limits)
        assert spun.wall_timeout and spun.signal == signal.SIGKILL, spun
        assert box.state is BoxState.DOWN
        after, out = run(box, run_dir, ["./probe"], limits)
        assert (after.exit_code, out) == (0, "clean\nno-mqueue\n")
        assert box.starts == 2


def test_a_tree_too_deep_to_wipe_ends_the_box_and_the_next_test_starts_clean(sandbox, run_dir):
    with sandbox.box(run_dir / "box", LIMITS, run_dir / "box.log") as box:
        deep, out = run(box, run_dir, ["./work", "deep"])
        assert (deep.exit_code, out) == (0, "deep\n")
        assert box.state is BoxState.DOWN, "the box must end when it cannot wipe what a test left"
        after, out = run(box, run_dir, ["./probe"])
        assert out == "clean\nno-mqueue\n"
        assert box.starts == 2


def test_a_box_killed_between_tests_is_replaced_not_a_failed_test(sandbox, run_dir):
    with sandbox.box(run_dir / "box", LIMITS, run_dir / "box.log") as box:
        run(box, run_dir, ["./work", "small"])
        os.killpg(box._proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, box._proc.pid, os.WEXITED | os.WNOWAIT)
        result, out = run(box, run_dir, ["./work", "small"])
        assert (result.exit_code, out) == (0, "small\n")
        assert box.starts == 2


def test_a_box_that_cannot_start_is_a_sandbox_failure_not_a_verdict(run_dir):
    broken = run_dir / "bwrap"  # where the sandbox uid can run it
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    broken.chmod(0o755)
    sandbox = Sandbox(uid=SANDBOX_UID, gid=SANDBOX_UID, bwrap=str(broken))
    with sandbox.box(run_dir / "box", LIMITS, run_dir / "box.log") as box:
        with pytest.raises(SandboxFailure, match="No permissions to create new namespace"):
            run(box, run_dir, ["./work", "small"])
        assert box.state is BoxState.DOWN


def test_the_box_lifecycle_takes_only_its_arrows():
    transitions = {t for _, t in TRANSITIONS}
    for state in BoxState:
        for transition in transitions:
            if (state, transition) in TRANSITIONS:
                assert next_state(state, transition) is TRANSITIONS[(state, transition)]
            else:
                with pytest.raises(BoxStateError):
                    next_state(state, transition)
    # Nothing leaves CLOSED; a test is only ever sent to a READY box.
    assert not any(state is BoxState.CLOSED for state, _ in TRANSITIONS)
    assert [s for s, t in TRANSITIONS if t == "send_test"] == [BoxState.READY]


# Prints the rlimits the program runs under: CPU seconds, file size, open files, core size (soft=hard each).
LIMITS_PROBE = r"""
#include <stdio.h>
#include <sys/resource.h>
int main(void) {
    int which[] = {RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE};
    for (int i = 0; i < 4; i++) {
        struct rlimit r;
        getrlimit(which[i], &r);
        printf("%llu/%llu%s", (unsigned long long)r.rlim_cur, (unsigned long long)r.rlim_max, i < 3 ? " " : "\n");
    }
    return 0;
}
"""


def _expected_rlimits(limits: Limits) -> str:
    cpu_s = -(-limits.cpu_ms // 1000) + 1  # a second past the limit: the hard limit kills
    return " ".join(f"{v}/{v}" for v in (cpu_s, limits.output_kb * 1024, limits.max_open_files, 0)) + "\n"


def test_each_test_in_a_box_runs_under_its_own_rlimits_as_a_one_off_run_does(sandbox, run_dir):
    (run_dir / "limits.c").write_text(LIMITS_PROBE)
    subprocess.run(["gcc", "-O2", "-o", str(run_dir / "box" / "limits"), str(run_dir / "limits.c")], check=True)
    first = Limits(cpu_ms=2000, wall_ms=4000, memory_kb=131072, output_kb=1024, max_open_files=16)
    second = Limits(cpu_ms=5500, wall_ms=9000, memory_kb=131072, output_kb=2048, max_open_files=40)
    with sandbox.box(run_dir / "box", first, run_dir / "box.log") as box:
        for limits in (first, second, first):
            result, out = run(box, run_dir, ["./limits"], limits)
            assert (result.exit_code, out) == (0, _expected_rlimits(limits)), (run_dir / "err").read_text()
        assert box.starts == 1
    with open(run_dir / "in", "rb") as stdin:
        result = sandbox.run(["./limits"], box=run_dir / "box", stdin=stdin, stdout=run_dir / "out",
                             stderr=run_dir / "err", limits=second)
    assert (result.exit_code, (run_dir / "out").read_text()) == (0, _expected_rlimits(second))
