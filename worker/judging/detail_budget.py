"""A verdict's ``detail`` kept within a budget, whatever the number of tests.

The judge writes one row per test run (about 80 bytes each) and stops at the first test that fails,
so a problem of N tests gives up to N rows. Past ``DETAIL_BUDGET_BYTES`` (far below the arbiter's
``max_body_bytes``, 1 MiB by default) the rows are compacted: every test that did not pass, the failed
test's neighbours and the first test keep their rows; each run of other passed tests becomes one row
``{"tests": "3-1996", "count": 1994, "verdict": "AC", "max_time_ms": ..., "max_wall_ms": ...,
"max_memory_kb": ...}``. Long texts are then cut, and as a last resort only the failed test's number is
kept. The verdict, time and memory are never touched (they are not in ``detail``).

``minimal`` is what a worker sends when the arbiter still answers 413 (its limit set lower than this
budget): the failed test's number and why the rest is missing.
"""

from __future__ import annotations

import json

from arbiter.protocol.vocabulary import VerdictCode

DETAIL_BUDGET_BYTES = 64 * 1024
NEIGHBOURS = 2  # rows kept on each side of the failed test
TEXT_KEYS = ("compiler_output", "stderr_tail", "reason")
TEXT_CUT_CHARS = 2000
ROW_TEXT_CUT_CHARS = 200


def size_of(detail: dict) -> int:
    return len(json.dumps(detail).encode())


def fit(detail: dict, budget: int = DETAIL_BUDGET_BYTES) -> dict:
    """``detail`` itself when it is within ``budget`` bytes (as JSON); else a compacted copy that is."""
    if size_of(detail) <= budget:
        return detail
    fitted = dict(detail)
    tests = fitted.get("tests")
    if isinstance(tests, list):
        fitted["tests"] = compact_rows(tests, fitted.get("failed_test"))
        fitted["tests_compacted"] = True
    if size_of(fitted) <= budget:
        return fitted
    for key in TEXT_KEYS:
        if isinstance(fitted.get(key), str) and len(fitted[key]) > TEXT_CUT_CHARS:
            fitted[key] = fitted[key][:TEXT_CUT_CHARS] + " [cut]"
    if isinstance(fitted.get("tests"), list):
        fitted["tests"] = [_cut_row_texts(row) for row in fitted["tests"]]
    if size_of(fitted) <= budget:
        return fitted
    return minimal(detail, f"the detail did not fit its budget of {budget} bytes")


def minimal(detail: dict, why: str) -> dict:
    """The failed test's number (when there is one) and why the rest of the detail is missing."""
    kept = {"detail_dropped": why}
    if isinstance(detail.get("failed_test"), int):
        kept["failed_test"] = detail["failed_test"]
    return kept


def compact_rows(rows: list, failed_test) -> list:
    """Rows of tests that did not pass, the failed test's neighbours and the first test as they are;
    each run of other passed tests as one summary row."""
    keep_near = set()
    if isinstance(failed_test, int):
        keep_near = set(range(failed_test - NEIGHBOURS, failed_test + NEIGHBOURS + 1))
    out: list = []
    run: list[dict] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            out.append(run[0])
        else:
            out.append({"tests": f"{run[0]['test']}-{run[-1]['test']}", "count": len(run), "verdict": VerdictCode.AC,
                        **{f"max_{key}": max(r.get(key) or 0 for r in run)
                           for key in ("time_ms", "wall_ms", "memory_kb")}})
        run.clear()

    for position, row in enumerate(rows):
        passed = isinstance(row, dict) and row.get("verdict") == VerdictCode.AC and isinstance(row.get("test"), int)
        if passed and position > 0 and row["test"] not in keep_near:
            run.append(row)
            continue
        flush()
        out.append(row)
    flush()
    return out


def _cut_row_texts(row):
    if not isinstance(row, dict):
        return row
    return {key: (value[:ROW_TEXT_CUT_CHARS] + " [cut]" if isinstance(value, str) and len(value) > ROW_TEXT_CUT_CHARS
                  else value) for key, value in row.items()}
