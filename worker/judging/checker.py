"""A problem's own checker (special judge): compiled once per source digest, run in the sandbox.

The checker is ``checker.cpp`` next to the problem's tests (with any ``*.h`` beside it, e.g.
testlib.h); the database holds its SHA-256 (``problems.checker_sha256``, set by ``judgectl problem
set --checker``), and a worker whose copy differs does not judge with it (CannotJudgeHere: another
worker may have the right one). It is called the way testlib-based checkers expect:
``checker <input> <contestant-output> <answer>``; exit 0 accepts, 1 is a wrong answer, 2 a
presentation error (reported as WA); any other exit, a signal or a time-out is the checker's
failure, never the contestant's: the submission gets system_error with the checker's message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from arbiter.protocol.testdata import file_sha256
from arbiter.protocol.vocabulary import VerdictCode
from worker.errors import WorkerError
from worker.sandbox.base import Limits, SandboxFailure, storable_text
from worker.sandbox.runner import Sandbox, limits_for_compile

CHECKER_SOURCE = "checker.cpp"
COMPILE = ["/usr/bin/g++", "-O2", "-std=gnu++17", "-pipe", "-o", "checker", CHECKER_SOURCE]
# The checker's own limits: generous, and never the contestant's.
CHECKER_LIMITS = Limits(cpu_ms=10_000, wall_ms=30_000, memory_kb=1_048_576, output_kb=1024, max_processes=4,
                        stderr_kb=1024)
MESSAGE_CHARS = 500


class CheckerUnusable(WorkerError):
    """The checker cannot be used here (missing, another digest than the lease's): not a verdict."""


class CheckerBroken(WorkerError):
    """The checker itself fails (does not compile): system_error for the submission, with this reason."""


@dataclass(frozen=True)
class CheckerOutcome:
    verdict: str  # AC | WA | system_error
    message: str


def _place(src: Path, dst: Path) -> None:
    """A hard link where it can be (no copy of a large input), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
        os.chmod(dst, 0o644)


class Checkers:
    """The compiled checkers of this worker, by source digest (under work_dir/checkers)."""

    def __init__(self, sandbox: Sandbox, work_dir: Path):
        self.sandbox = sandbox
        self.root = Path(work_dir) / "checkers"
        self.limits = CHECKER_LIMITS
        self._lock = threading.Lock()

    def binary(self, tests_dir: Path, expected_sha256: str) -> Path:
        """The compiled checker of ``tests_dir/checker.cpp`` whose digest must be ``expected_sha256``."""
        source = tests_dir / CHECKER_SOURCE
        if not source.is_file():
            raise CheckerUnusable(f"the problem's checker {source} is missing")
        digest = file_sha256(source)
        if digest != expected_sha256:
            raise CheckerUnusable(f"the checker {source} here (sha256 {digest[:12]}) is not the problem's "
                                  f"(sha256 {expected_sha256[:12]})")
        target = self.root / digest / "checker"
        with self._lock:
            if target.is_file():
                return target
            return self._compile(source, tests_dir, digest, target)

    def _compile(self, source: Path, tests_dir: Path, digest: str, target: Path) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        scratch = self.root / f".build-{digest}-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        os.chown(scratch, self.sandbox.uid, self.sandbox.gid)
        try:
            shutil.copyfile(source, scratch / CHECKER_SOURCE)
            for header in tests_dir.glob("*.h"):
                shutil.copyfile(header, scratch / header.name)
            log_path = self.root / f".build-{digest}-{os.getpid()}.log"
            with open(log_path, "wb") as out:
                result = self.sandbox.run(COMPILE, box=scratch, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                          limits=limits_for_compile(), writable_box=True)
            message = storable_text(log_path.read_bytes()[:2000])
            log_path.unlink()
            if result.exit_code in (126, 127):
                raise SandboxFailure(f"the compiler {COMPILE[0]} could not be executed: {message.strip()[:300]}")
            if result.exit_code != 0 or not (scratch / "checker").is_file():
                raise CheckerBroken(f"the problem's checker does not compile: {message.strip()[:MESSAGE_CHARS]}")
            final = self.root / digest
            final.mkdir(exist_ok=True)
            os.replace(scratch / "checker", target)
            os.chmod(target, 0o755)
            os.chmod(final, 0o755)
            return target
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def check(self, binary: Path, test_input: Path, output: Path, answer: Path, scratch: Path,
              cancelled: threading.Event | None = None) -> CheckerOutcome:
        """Run the checker on one test, in a box of its own holding only its three files and itself."""
        box = scratch / "checker-box"
        shutil.rmtree(box, ignore_errors=True)
        box.mkdir(parents=True)
        for src, name in ((binary, "checker"), (test_input, "input"), (output, "output"), (answer, "answer")):
            _place(src, box / name)
        err_path = scratch / "checker.err"
        try:
            result = self.sandbox.run(["./checker", "input", "output", "answer"], box=box, stdin=subprocess.DEVNULL,
                                      stdout=scratch / "checker.out", stderr=err_path, limits=self.limits,
                                      cancelled=cancelled)
        finally:
            shutil.rmtree(box, ignore_errors=True)
        message = (result.stderr_tail or "").strip()[-MESSAGE_CHARS:]
        if result.wall_timeout or result.cpu_ms > self.limits.cpu_ms:
            return CheckerOutcome(VerdictCode.system_error, f"checker exceeded its time limit; {message}".strip("; "))
        if result.signal is not None:
            return CheckerOutcome(VerdictCode.system_error, f"checker killed by signal {result.signal}; {message}".strip("; "))
        if result.exit_code == 0:
            return CheckerOutcome(VerdictCode.AC, message)
        if result.exit_code in (1, 2):
            return CheckerOutcome(VerdictCode.WA, message)
        return CheckerOutcome(VerdictCode.system_error, f"checker exit {result.exit_code}; {message}".strip("; "))
