"""Comparers and checkers: how a test's output is judged against its answer.

The built-in comparers (tokens, lines, floats with tolerances) as functions; a problem's own checker
compiled once per digest and run in the sandbox (AC, WA, presentation error, crash, time-out, a
checker that does not compile, a checker of another digest); the comparer travelling from
``judgectl problem set`` through the lease to the verdict."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys

import pytest
from support.procs import sandbox_work_dir, write_testdata

from arbiter.protocol.compare import ComparerError, floats_close, lines_equal, parse_comparer, tokens_equal
from worker.judging.judge import CannotJudgeHere, Job, Judge
from worker.sandbox.runner import Sandbox

AC_PY = "a, b = map(int, input().split())\nprint(a + b)\n"
# A testlib-style checker without testlib: <input> <output> <answer>; the sum is right when it equals
# the answer; "3.0" for 3 is a presentation error (exit 2); the verdict's message on stderr.
CHECKER = r"""
#include <cstdio>
#include <cstring>
int main(int argc, char** argv) {
    if (argc != 4) { fprintf(stderr, "usage: checker in out ans"); return 3; }
    FILE* out = fopen(argv[2], "r"); FILE* ans = fopen(argv[3], "r");
    char got[64] = {0}; long want = 0;
    if (!out || !ans || fscanf(ans, "%ld", &want) != 1) { fprintf(stderr, "cannot read files"); return 3; }
    if (fscanf(out, "%63s", got) != 1) { fprintf(stderr, "wrong answer: no output"); return 1; }
    if (strchr(got, '.')) { fprintf(stderr, "presentation error: %s is not an integer", got); return 2; }
    long value = 0; sscanf(got, "%ld", &value);
    if (value != want) { fprintf(stderr, "wrong answer: expected %ld, found %ld", want, value); return 1; }
    fprintf(stderr, "ok %ld", value);
    return 0;
}
"""
CRASHING_CHECKER = "#include <cstdlib>\nint main(){ abort(); }\n"
SLOW_CHECKER = "int main(){ volatile unsigned long x = 0; for(;;) x++; }\n"
BROKEN_CHECKER = "int main() { this is not C++ }\n"
TESTS = [("1 2\n", "3\n"), ("10 20\n", "30\n")]


def test_parse_comparer_accepts_the_documented_forms_only():
    assert str(parse_comparer("tokens")) == "tokens" and str(parse_comparer("lines")) == "lines"
    assert str(parse_comparer("checker")) == "checker"
    c = parse_comparer("float:abs=1e-6,rel=1e-9")
    assert (c.kind, c.abs_tol, c.rel_tol) == ("float", 1e-6, 1e-9)
    for bad in ("", "exact", "float", "float:abs=x,rel=1", "float:abs=1,rel=nan", "float:abs=-1,rel=0",
                "float:abs=1,rel=0", "tokens "):
        with pytest.raises(ComparerError):
            parse_comparer(bad)


def test_builtin_comparers():
    assert tokens_equal(b"1 2\n3\n", b"1   2 3") and not tokens_equal(b"1 2 3", b"1 2 4")
    assert lines_equal(b"a b\nc\n", b"a b  \nc\n\n\n") and not lines_equal(b"a b\nc\n", b"a\nb c\n")
    assert not lines_equal(b"a  b\n", b"a b\n"), "inside a line, whitespace counts"
    assert floats_close(b"3.14159 x 2", b"3.1416 x 2.0000001", 1e-4, 0)
    assert floats_close(b"1000000", b"1000001", 0, 1e-5), "relative tolerance suffices"
    assert not floats_close(b"1000000", b"1000100", 1e-6, 1e-6)
    assert not floats_close(b"1.0", b"nan", 1, 1) and not floats_close(b"1.0", b"inf", 1, 1)
    assert not floats_close(b"x 1", b"y 1", 1, 1), "a word must be equal"
    assert not floats_close(b"1 2", b"1", 1, 1)


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkers")
    testdata = root / "testdata"
    for problem, checker in ((1, CHECKER), (2, CRASHING_CHECKER), (3, SLOW_CHECKER), (4, BROKEN_CHECKER)):
        write_testdata(testdata, problem, TESTS)
        (testdata / str(problem) / "checker.cpp").write_text(checker)
    write_testdata(testdata, 5, [("", "a b\nc\n")])
    work = sandbox_work_dir()
    sandbox = Sandbox(uid=65534, gid=65534)
    sandbox.self_test(work / "selftest")
    judge = Judge(sandbox, testdata, work, output_limit_kb=8192)
    # The checker's own limits, shorter than the worker's 10 s so that the slow checker's test is quick.
    judge.checkers.limits = dataclasses.replace(judge.checkers.limits, cpu_ms=1500, wall_ms=5000)
    yield judge
    shutil.rmtree(work, ignore_errors=True)


def digest(judge, problem: int) -> str:
    return hashlib.sha256((judge.testdata_dir / str(problem) / "checker.cpp").read_bytes()).hexdigest()


def job(judge, source, problem=1, language="python3", comparer="checker", sha=None):
    return Job(submission_id=abs(hash((source, problem))) % 100000, problem_id=problem, problem_slug=f"p{problem}",
               language=language, source=source, time_limit_ms=2000, memory_limit_kb=131072, comparer=comparer,
               checker_sha256=sha if sha is not None else (digest(judge, problem) if comparer == "checker" else None))


def test_checker_accepts_rejects_and_reports_a_presentation_error_as_wa(judge):
    ok = judge.judge(job(judge, AC_PY))
    assert ok.verdict == "AC", ok.detail
    assert ok.detail["tests"][-1]["checker_message"] == "ok 30"
    wrong = judge.judge(job(judge, "a, b = map(int, input().split())\nprint(a * b)\n"))
    assert wrong.verdict == "WA" and wrong.detail["failed_test"] == 1
    assert wrong.detail["tests"][0]["checker_message"] == "wrong answer: expected 3, found 2"
    pe = judge.judge(job(judge, "a, b = map(int, input().split())\nprint(float(a + b))\n"))
    assert pe.verdict == "WA" and "presentation error" in pe.detail["tests"][0]["checker_message"]
    # The program's own failures come first: the checker never sees a TLE's output.
    tle = judge.judge(job(judge, "while True:\n    pass\n"))
    assert tle.verdict == "TLE" and "checker_message" not in tle.detail["tests"][0]


def test_the_checker_is_compiled_once_per_digest(judge):
    judge.judge(job(judge, AC_PY))
    binary = judge.checkers.root / digest(judge, 1) / "checker"
    assert binary.is_file()
    before = binary.stat().st_mtime_ns
    assert judge.judge(job(judge, AC_PY)).verdict == "AC"
    assert binary.stat().st_mtime_ns == before, "compiled again"


def test_a_checker_that_crashes_times_out_or_does_not_compile_is_system_error_not_a_verdict(judge):
    crashed = judge.judge(job(judge, AC_PY, problem=2))
    assert crashed.verdict == "system_error" and "checker killed by signal" in crashed.detail["reason"]
    slow = judge.judge(job(judge, AC_PY, problem=3))
    assert slow.verdict == "system_error" and "time limit" in slow.detail["reason"]
    broken = judge.judge(job(judge, AC_PY, problem=4))
    assert broken.verdict == "system_error" and "does not compile" in broken.detail["reason"]


def test_a_checker_of_another_digest_or_none_at_all_is_never_used(judge):
    with pytest.raises(CannotJudgeHere, match="is not the problem's"):
        judge.judge(job(judge, AC_PY, sha="0" * 64))
    with pytest.raises(CannotJudgeHere, match="checker .* is missing"):
        judge.judge(job(judge, AC_PY, problem=5, sha="0" * 64))
    with pytest.raises(CannotJudgeHere, match="not one of"):
        judge.judge(job(judge, AC_PY, comparer="magic"))


def test_builtin_comparers_decide_verdicts(judge):
    lines_src = "print('a b  ')\nprint('c')\n"
    assert judge.judge(job(judge, lines_src, problem=5, comparer="lines")).verdict == "AC"
    assert judge.judge(job(judge, "print('a')\nprint('b c')\n", problem=5, comparer="lines")).verdict == "WA"
    assert judge.judge(job(judge, "print('a')\nprint('b c')\n", problem=5, comparer="tokens")).verdict == "AC"
    close = "a, b = map(int, input().split())\nprint(a + b + 1e-7)\n"
    assert judge.judge(job(judge, close, comparer="float:abs=1e-6,rel=0")).verdict == "AC"
    assert judge.judge(job(judge, close, comparer="tokens")).verdict == "WA"


def judgectl(db, *args):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=60)


def test_judgectl_sets_the_comparer_and_the_checker_digest_and_the_lease_carries_them(db, tmp_path):
    from support.procs import add_worker

    from arbiter.store import leases

    source = tmp_path / "checker.cpp"
    source.write_text(CHECKER)
    added = judgectl(db, "problem", "add", "sum", "--checker", str(source))
    assert added.returncode == 0, added.stderr
    assert "checker.cpp" in added.stderr
    with db.connect() as conn:
        row = conn.execute("SELECT comparer, checker_sha256 FROM problems WHERE slug = 'sum'").fetchone()
    assert row == ("checker", hashlib.sha256(CHECKER.encode()).hexdigest())
    assert judgectl(db, "problem", "set", "sum", "--comparer", "float:abs=1e-6,rel=1e-6").returncode == 0
    with db.connect() as conn:
        row = conn.execute("SELECT comparer, checker_sha256, time_limit_ms FROM problems WHERE slug = 'sum'").fetchone()
    assert row == ("float:abs=1e-06,rel=1e-06", None, 1000)
    for bad, error in ((("--comparer", "checker"), "needs --checker"), (("--comparer", "exact"), "not one of"),
                       (("--comparer", "lines", "--checker", str(source)), "makes the comparer 'checker'"),
                       (("--checker", "/nonexistent"), "--checker /nonexistent")):
        refused = judgectl(db, "problem", "set", "sum", *bad)
        assert refused.returncode == 1 and error in refused.stderr, refused.stderr
    assert judgectl(db, "problem", "set", "nope", "--comparer", "lines").stderr.strip().endswith("no problem 'nope'")
    with db.connect() as conn:
        assert conn.execute("SELECT comparer FROM problems WHERE slug = 'sum'").fetchone() == ("float:abs=1e-06,rel=1e-06",)
        # The database refuses what judgectl would, whoever writes.
        with pytest.raises(Exception, match="problems_checker_has_its_digest|check constraint"):
            conn.execute("UPDATE problems SET comparer = 'checker' WHERE slug = 'sum'")
    assert judgectl(db, "problem", "set", "sum", "--checker", str(source)).returncode == 0
    with db.connect() as conn:
        pid = conn.execute("SELECT id FROM problems WHERE slug = 'sum'").fetchone()[0]
        user = conn.execute("INSERT INTO users (name) VALUES ('u') RETURNING id").fetchone()[0]
        leases.submit(conn, user, pid, "python3", AC_PY)
        add_worker(conn, "home-1")
        lease = leases.acquire(conn, worker_id="home-1", kind="home", request_id="r1", languages=["python3"],
                               unconfirmed_secs=10, legacy=None)
    problem = lease.as_json()["problem"]
    assert problem["comparer"] == "checker" and problem["checker_sha256"] == hashlib.sha256(CHECKER.encode()).hexdigest()
