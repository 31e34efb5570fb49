"""How a test's output is judged against its answer: a problem's comparer.

A problem names one (``problems.comparer``, set by ``judgectl problem add/set --comparer``):

- ``tokens`` (the default): the whitespace-separated tokens are equal;
- ``lines``: the lines are equal, ignoring trailing whitespace on each line and empty lines at the end;
- ``float:abs=A,rel=R``: token by token; where the answer's token is a number, the output's must be a
  number within A absolutely or within R relative to the answer (either suffices); other tokens equal;
- ``checker``: the problem's own checker program (worker/judging/checker.py) decides.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from arbiter.protocol.errors import ProtocolError

_FLOAT = re.compile(r"^float:abs=([^,]+),rel=([^,]+)$")


class ComparerError(ProtocolError, ValueError):
    pass


@dataclass(frozen=True)
class Comparer:
    kind: str  # tokens | lines | float | checker
    abs_tol: float = 0.0
    rel_tol: float = 0.0

    def __str__(self) -> str:
        return f"float:abs={self.abs_tol:g},rel={self.rel_tol:g}" if self.kind == "float" else self.kind


def parse_comparer(text: str) -> Comparer:
    """One clear error for anything but the forms above (tolerances finite, 0 <= tol < 1)."""
    if text in ("tokens", "lines", "checker"):
        return Comparer(text)
    match = _FLOAT.match(text or "")
    if not match:
        raise ComparerError(f"comparer {text!r} is not one of tokens, lines, checker, float:abs=A,rel=R")
    try:
        abs_tol, rel_tol = float(match.group(1)), float(match.group(2))
    except ValueError:
        raise ComparerError(f"comparer {text!r}: tolerances must be numbers, e.g. float:abs=1e-6,rel=1e-6") from None
    for name, tol in (("abs", abs_tol), ("rel", rel_tol)):
        if not (math.isfinite(tol) and 0 <= tol < 1):
            raise ComparerError(f"comparer {text!r}: {name} must be at least 0 and below 1")
    return Comparer("float", abs_tol, rel_tol)


def tokens_equal(expected: bytes, actual: bytes) -> bool:
    return expected.split() == actual.split()


def lines_equal(expected: bytes, actual: bytes) -> bool:
    def lines(data: bytes) -> list[bytes]:
        out = [line.rstrip() for line in data.split(b"\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(expected) == lines(actual)


def _number(token: bytes) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def floats_close(expected: bytes, actual: bytes, abs_tol: float, rel_tol: float) -> bool:
    want, got = expected.split(), actual.split()
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        w_value = _number(w)
        if w_value is None:
            if w != g:
                return False
            continue
        g_value = _number(g)
        if g_value is None:
            return False
        diff = abs(w_value - g_value)
        if diff > abs_tol and diff > rel_tol * abs(w_value):
            return False
    return True


def outputs_match(comparer: Comparer, expected_path: Path, actual_path: Path) -> bool:
    """The built-in comparers (not ``checker``: that one runs a program)."""
    expected, actual = Path(expected_path).read_bytes(), Path(actual_path).read_bytes()
    if comparer.kind == "tokens":
        return tokens_equal(expected, actual)
    if comparer.kind == "lines":
        return lines_equal(expected, actual)
    if comparer.kind == "float":
        return floats_close(expected, actual, comparer.abs_tol, comparer.rel_tol)
    raise ComparerError(f"comparer {comparer} is not a built-in comparer")
