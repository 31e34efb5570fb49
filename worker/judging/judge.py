"""Judges one submission: compile in the sandbox, run every test in the sandbox, compare its output
with the answer the problem's way (arbiter/protocol/compare.py: tokens, lines, floats, or its own checker).

Test data comes from the local test-data directory: ``<testdata>/<problem_id>/<n>.in`` and
``<n>.out`` (a directory named by the problem's slug is accepted too). Missing or broken
test data is never a wrong verdict: it raises CannotJudgeHere with the reason (the worker hands
the lease back, or reports a legacy claim as ``system_error`` with that reason).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from arbiter.protocol.compare import Comparer, ComparerError, outputs_match, parse_comparer
from arbiter.protocol.testdata import DigestCache
from arbiter.protocol.vocabulary import VerdictCode
from worker.backoff import Backoff
from worker.errors import WorkerError
from worker.judging import detail_budget
from worker.judging.checker import CheckerBroken, Checkers, CheckerUnusable
from worker.judging.datastore import DataStore, DataUnavailable
from worker.sandbox.base import Limits, RunResult, SandboxFailure, storable_text
from worker.sandbox.runner import Sandbox, limits_for_compile

# How much of a failed test's stderr goes into the verdict's detail (its end: a traceback's last lines).
STDERR_DETAIL_CHARS = 1000

log = logging.getLogger("worker.judge")
# Test data the arbiter cannot serve now is asked for again for this long (0.5, 1, 2 ... 5 s apart)
# while the lease lasts: longer than a database failover (about 10 s) or an arbiter's restart.
DATA_PATIENCE_SECS = 60.0
DATA_RETRY_INITIAL_SECS = 0.5
DATA_RETRY_MAX_SECS = 5.0

LANGUAGES = {
    "c": {"source": "main.c", "compile": ["/usr/bin/gcc", "-O2", "-std=gnu17", "-pipe", "-o", "main", "main.c", "-lm"],
          "run": ["./main"]},
    "cpp": {"source": "main.cpp", "compile": ["/usr/bin/g++", "-O2", "-std=gnu++17", "-pipe", "-o", "main",
                                              "main.cpp"],
            "run": ["./main"]},
    "python3": {"source": "main.py",
                "compile": ["/usr/bin/python3", "-I", "-c",
                            "import sys; compile(open('main.py', 'rb').read(), 'main.py', 'exec')"],
                "run": ["/usr/bin/python3", "-I", "-S", "main.py"]},
}


class JudgeCancelled(WorkerError):
    """The lease was lost (410 on a heartbeat): stop, report nothing."""


@dataclass
class Verdict:
    verdict: str
    time_ms: int = 0
    memory_kb: int = 0
    detail: dict = field(default_factory=dict)
    data_digest: str | None = None  # the digest of the test data this verdict was judged with


# A Job holds the fields of the store's Lease (arbiter/store/leases.py) as the worker receives them
# over either transport; the two stay apart on purpose: judging imports nothing of the store (the
# seam's contract), and a Lease carries what only the arbiter needs (token generation, expiry).
@dataclass(frozen=True)
class Job:
    submission_id: int
    problem_id: int
    problem_slug: str
    language: str
    source: str
    time_limit_ms: int
    memory_limit_kb: int
    comparer: str = "tokens"
    checker_sha256: str | None = None
    # The test data to judge with (problems.data_digest); None: whatever this worker has.
    data_digest: str | None = None


def tokens_equal(expected_path: Path, actual_path: Path) -> bool:
    return outputs_match(Comparer("tokens"), expected_path, actual_path)


# The canaries' built-in problem: its test data ships with this package, so every worker has it
# (a directory of that name under the worker's test data directory, if there is one, comes first).
CANARY_PROBLEM_SLUG = "judge-canary"
CANARY_TESTS_DIR = Path(__file__).resolve().parent / "canary_tests"


class CannotJudgeHere(WorkerError):
    """This worker lacks what the submission needs (its language, its problem's test data). Not a
    verdict on the submission: an arbiter lease is handed back for another worker; a legacy claim,
    which nothing hands on, is reported as system_error with this reason."""


def find_tests(testdata_dir: Path, job: Job) -> tuple[list[tuple[Path, Path]], str | None]:
    candidates = [testdata_dir / str(job.problem_id), testdata_dir / job.problem_slug]
    if job.problem_slug == CANARY_PROBLEM_SLUG:
        candidates.append(CANARY_TESTS_DIR)
    for directory in candidates:
        if directory.is_dir():
            break
    else:
        return [], f"no test data for problem {job.problem_id} ({job.problem_slug}) under {testdata_dir}"
    return tests_in(directory)


def tests_in(directory: Path) -> tuple[list[tuple[Path, Path]], str | None]:
    inputs = sorted(directory.glob("*.in"), key=lambda p: (len(p.stem), p.stem))
    if not inputs:
        return [], f"test data directory {directory} has no .in files"
    pairs = []
    for inp in inputs:
        out = inp.with_suffix(".out")
        if not out.is_file():
            return [], f"test {inp.name} has no matching {out.name}"
        pairs.append((inp, out))
    return pairs, None


class Judge:
    def __init__(self, sandbox: Sandbox, testdata_dir: Path, work_dir: Path, output_limit_kb: int = 65536,
                 wall_factor: float = 3.0, max_processes: int = 64, stderr_limit_kb: int = 8192):
        self.sandbox = sandbox
        self.testdata_dir = Path(testdata_dir)
        self.work_dir = Path(work_dir)
        self.output_limit_kb = output_limit_kb
        self.stderr_limit_kb = stderr_limit_kb
        self.wall_factor = wall_factor
        self.max_processes = max_processes
        self.checkers = Checkers(sandbox, self.work_dir)
        self.digests = DigestCache()
        # Where a data set the lease names comes from when this worker's copy differs (worker/judging/datastore.py).
        self.data_store: DataStore | None = None

    def judge(self, job: Job, cancelled: threading.Event | None = None) -> Verdict:
        """The verdict of one submission. Raises CannotJudgeHere when this worker lacks what it needs
        (the language, the test data) or its own disk fails it (full, read-only, a file where a
        directory should be): another worker may judge, so that is not a verdict."""
        try:
            return self._judge_here(job, cancelled or threading.Event())
        except OSError as exc:
            # The sandbox chain's own failures are SandboxFailure; what is left is this host's disk.
            raise CannotJudgeHere(f"a local fault of this host: {exc}") from exc

    def _judge_here(self, job: Job, cancelled: threading.Event) -> Verdict:
        if job.language not in LANGUAGES:
            raise CannotJudgeHere(f"worker does not judge language {job.language!r}")
        tests, problem = find_tests(self.testdata_dir, job)
        data_digest = None if problem else self.digests.digest(tests[0][0].parent)
        held = None  # a set of the data store, held (not evicted) while this judging uses it
        if job.data_digest and data_digest != job.data_digest:
            # Stale, newer or missing data here: judging with it could give a wrong verdict. The data
            # set the lease names is fetched (and verified) if this worker can; else another worker
            # that has it judges, and the operator sees the reason.
            if self.data_store is None:
                raise CannotJudgeHere(problem or f"test data for problem {job.problem_id} here has digest "
                                      f"{data_digest[:12]}, the problem's is {job.data_digest[:12]}")
            directory = self._fetch_data(job, cancelled)
            held = job.data_digest
        try:
            if held is not None:
                tests, problem = tests_in(directory)
                data_digest = None if problem else self.digests.digest(directory)
                if data_digest != job.data_digest:
                    raise CannotJudgeHere(problem or f"fetched test data {job.data_digest[:12]} lays out as "
                                                     f"{(data_digest or '')[:12]}")
            elif problem:
                raise CannotJudgeHere(problem)
            verdict = self._judge(job, tests, cancelled)
        finally:
            if held is not None:
                self.data_store.release(held)
        verdict.detail = detail_budget.fit(verdict.detail)  # however many tests: far below any body limit
        verdict.data_digest = data_digest
        return verdict

    def _fetch_data(self, job: Job, cancelled: threading.Event) -> Path:
        """The data set the lease names, held. An arbiter that cannot be asked now (down, paused, cut
        off, its database failing over) is asked again while the lease lasts (its heartbeats go on
        meanwhile), up to DATA_PATIENCE_SECS: an outage of the arbiter must not cost the lease. A
        definite no (unknown digest, a file that does not verify), or no answer within the patience,
        is CannotJudgeHere: the lease goes back for a worker that has the data."""
        backoff = Backoff(DATA_RETRY_INITIAL_SECS, DATA_RETRY_MAX_SECS)
        deadline = time.monotonic() + DATA_PATIENCE_SECS
        while True:
            try:
                return self.data_store.ensure(job.problem_id, job.data_digest)
            except DataUnavailable as exc:
                if not exc.transient or time.monotonic() >= deadline:
                    raise CannotJudgeHere(str(exc)) from None
                log.warning("test data cannot be fetched now; asking again while the lease lasts",
                            extra={"submission_id": job.submission_id, "reason": str(exc)[:300]})
            if cancelled.wait(backoff.next_delay()):
                raise JudgeCancelled()

    def _judge(self, job: Job, tests, cancelled: threading.Event) -> Verdict:
        try:
            comparer = parse_comparer(job.comparer)
        except ComparerError as exc:  # a comparer newer than this worker: another worker may know it
            raise CannotJudgeHere(str(exc)) from None
        checker = None
        if comparer.kind == "checker":
            try:
                checker = self.checkers.binary(tests[0][0].parent, job.checker_sha256 or "")
            except CheckerUnusable as exc:
                raise CannotJudgeHere(str(exc)) from None
            except CheckerBroken as exc:
                return Verdict(VerdictCode.system_error, detail={"reason": str(exc)})
        spec = LANGUAGES[job.language]
        run_dir = self.work_dir / f"s{job.submission_id}-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(run_dir, ignore_errors=True)
        box = run_dir / "box"
        box.mkdir(parents=True)
        os.chown(box, self.sandbox.uid, self.sandbox.gid)
        try:
            (box / spec["source"]).write_text(job.source, encoding="utf-8")
            compiled = self._compile(spec, box, run_dir)
            if compiled is not None:
                return compiled
            return self._run_tests(spec, job, tests, box, run_dir, cancelled, comparer, checker)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    def _compile(self, spec, box: Path, run_dir: Path) -> Verdict | None:
        log_path = run_dir / "compile.log"
        with open(log_path, "wb") as out:
            result = self.sandbox.run(spec["compile"], box=box, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                      limits=limits_for_compile(), writable_box=True)
        if result.exit_code == 0:
            return None
        message = storable_text(log_path.read_bytes()[:4000])
        if result.exit_code in (126, 127):
            # The shell in the sandbox could not execute the compiler (gone, not executable): no
            # compiler ever says that about a source file.
            raise SandboxFailure(f"the compiler {spec['compile'][0]} could not be executed: {message.strip()[:300]}")
        if result.wall_timeout or result.signal:
            message += f"\n(compiler stopped: {'time limit' if result.wall_timeout else signal.Signals(result.signal).name})"
        return Verdict(VerdictCode.CE, detail={"compiler_output": message})

    def _run_tests(self, spec, job: Job, tests, box: Path, run_dir: Path, cancelled, comparer: Comparer,
                   checker: Path | None) -> Verdict:
        limits = Limits(cpu_ms=job.time_limit_ms, wall_ms=int(job.time_limit_ms * self.wall_factor) + 1000,
                        memory_kb=job.memory_limit_kb, output_kb=self.output_limit_kb,
                        max_processes=self.max_processes, stderr_kb=self.stderr_limit_kb)
        # One box for all the tests: the sandbox is set up once, each test is one fork inside it.
        with self.sandbox.box(box, limits, run_dir / "box.log") as test_box:
            return self._run_each_test(spec, tests, test_box, run_dir, cancelled, comparer, checker, limits)

    def _run_each_test(self, spec, tests, test_box, run_dir: Path, cancelled, comparer: Comparer,
                       checker: Path | None, limits: Limits) -> Verdict:
        per_test = []
        worst_time = worst_memory = 0
        for index, (inp, expected) in enumerate(tests, start=1):
            if cancelled.is_set():
                raise JudgeCancelled()
            out_path, err_path = run_dir / f"{index}.out", run_dir / f"{index}.err"
            # stderr is pumped by this process (never charged as the program's memory); its tail is kept.
            with open(inp, "rb") as stdin:
                result = test_box.run(spec["run"], stdin=stdin, stdout=out_path, stderr=err_path, limits=limits,
                                      cancelled=cancelled)
            if cancelled.is_set():
                raise JudgeCancelled()  # a 410 on a heartbeat killed the running test
            verdict = self._classify(result, limits)
            message = None
            if verdict is None and checker is not None:
                outcome = self.checkers.check(checker, inp, out_path, expected, run_dir, cancelled)
                if cancelled.is_set():
                    raise JudgeCancelled()
                verdict, message = outcome.verdict, outcome.message
            elif verdict is None:
                verdict = VerdictCode.AC if outputs_match(comparer, expected, out_path) else VerdictCode.WA
            worst_time = max(worst_time, result.cpu_ms)
            worst_memory = max(worst_memory, result.memory_kb)
            per_test.append({"test": index, "verdict": verdict, "time_ms": result.cpu_ms,
                             "wall_ms": result.wall_ms, "memory_kb": result.memory_kb})
            if message:
                per_test[-1]["checker_message"] = message
            if verdict == VerdictCode.system_error:
                # The checker failed, not the program: nothing about the submission is decided.
                return Verdict(VerdictCode.system_error, detail={"tests": per_test, "failed_test": index,
                                                       "reason": f"test {index}: {message}"})
            if verdict != VerdictCode.AC:
                failed = {"tests": per_test, "failed_test": index}
                if result.stderr_tail:
                    failed["stderr_tail"] = result.stderr_tail[-STDERR_DETAIL_CHARS:]
                return Verdict(verdict, worst_time, worst_memory, failed)
        return Verdict(VerdictCode.AC, worst_time, worst_memory, {"tests": per_test})

    @staticmethod
    def _classify(result: RunResult, limits: Limits) -> str | None:
        """The verdict the run itself decides, or None: its output is to be compared."""
        if result.cpu_ms > limits.cpu_ms or result.wall_timeout or result.signal == signal.SIGXCPU:
            return VerdictCode.TLE
        if result.output_exceeded:
            return VerdictCode.OLE
        if result.oom_killed or result.memory_kb > limits.memory_kb:
            return VerdictCode.MLE
        if result.signal is not None or result.exit_code != 0:
            return VerdictCode.RE
        return None
