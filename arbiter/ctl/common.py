"""What every judgectl command shares: the connection, the one error it reports, the operator's SQL,
reading a secret given as a file or on standard input."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psycopg

from arbiter.errors import ArbiterError
from arbiter.protocol.configfiles import ConfigError, check_dsn
from arbiter.store.sqlfiles import Statements

OPS = Statements("operator.sql")

# How often the waiting commands (the cutover gate, the lease drain) look again: a gate passes within
# this much of the moment its condition holds; each look is one small indexed query.
POLL_SECS = 0.2

class CtlError(ArbiterError):
    pass

def connect(dsn: str | None) -> psycopg.Connection:
    what = "--dsn" if dsn else "JUDGE_DSN"
    dsn = dsn or os.environ.get("JUDGE_DSN")
    if not dsn:
        raise CtlError("no database given: pass --dsn or set JUDGE_DSN")
    try:
        check_dsn(dsn, what)
    except ConfigError as exc:
        raise CtlError(str(exc)) from None
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise CtlError(f"cannot connect to the database: {str(exc).strip().splitlines()[0]}") from None

def read_secret_arg(path: str, what: str) -> str:
    """A secret from a file or '-' (standard input): never from the command line, where ps would show it."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CtlError(f"cannot read {what} {path}: {exc.strerror}") from None
    text = text.strip()
    if not text:
        raise CtlError(f"{what} is empty")
    return text
