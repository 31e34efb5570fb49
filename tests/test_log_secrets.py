"""Logs never carry a lease token or a credential, also where the text comes from elsewhere: an
exception's message (PostgreSQL's own, for a unique violation, names the colliding key, lease token
and all) and the free-text fields of a log line."""

from __future__ import annotations

import io
import json
import logging
import uuid

import psycopg
import pytest

from arbiter.protocol.logs import JsonFormatter


def _logged(emit) -> dict:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("test.log_secrets")
    log.addHandler(handler)
    log.propagate = False
    try:
        emit(log)
    finally:
        log.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    return json.loads(line)


def test_a_token_quoted_by_the_database_in_an_exception_is_not_logged(conn):
    token = uuid.uuid4()
    conn.execute("CREATE TEMP TABLE held (lease_token uuid PRIMARY KEY)")
    conn.execute("INSERT INTO held VALUES (%s)", (token,))
    with pytest.raises(psycopg.errors.UniqueViolation) as raised:
        conn.execute("INSERT INTO held VALUES (%s)", (token,))
    assert str(token) in str(raised.value), "PostgreSQL's message names the key (else this proves nothing)"

    def emit(log):
        try:
            raise raised.value
        except psycopg.Error as exc:
            log.exception("unhandled error", extra={"error": str(exc)})

    entry = _logged(emit)
    text = json.dumps(entry)
    assert str(token) not in text and token.hex not in text, text
    assert "UniqueViolation" in entry["exception"] and "[redacted]" in entry["error"]


@pytest.mark.parametrize("spelling", ["dashed", "hex"])
def test_free_text_fields_lose_what_looks_like_a_token_and_keep_the_rest(spelling):
    token = uuid.uuid4()
    quoted = str(token) if spelling == "dashed" else token.hex
    entry = _logged(lambda log: log.warning("lease handed back", extra={
        "reason": f"sandbox failed for lease {quoted}", "error": "Authorization: Bearer home-1.s3cr3t-v4lue",
        "submission_id": 42, "worker_id": "home-1"}))
    assert entry["reason"] == "sandbox failed for lease [redacted]"
    assert entry["error"] == "Authorization: [redacted]"
    assert (entry["submission_id"], entry["worker_id"]) == (42, "home-1")
