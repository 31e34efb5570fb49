"""What every judgectl command shares: the connection, the one error it reports, the operator's SQL,
reading a secret given as a file or on standard input."""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime
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
    """The command could not do what was asked (a conflict, a failed canary, the database): exit 1."""


class InputError(CtlError):
    """What was typed cannot be right (a bad name, a missing file, an unknown worker): exit 2, as
    argparse does for a bad option; nothing was changed."""


# A problem's slug as it appears in URLs and the test data's paths: lower-case letters, digits, '-'
# and '_', starting with a letter or digit.
SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_USER_NAME = 64


def check_slug(slug: str) -> str:
    if not SLUG.fullmatch(slug):
        raise InputError(f"bad problem slug {slug[:80]!r}: 1-64 of a-z, 0-9, '-' and '_', starting with a "
                         "letter or digit")
    return slug


def check_user_name(name: str) -> str:
    if not 1 <= len(name) <= MAX_USER_NAME or not name.isprintable() or name != name.strip():
        raise InputError(f"bad user name {name[:80]!r}: 1-{MAX_USER_NAME} printable characters, no leading or "
                         "trailing space")
    return name


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str | None) -> dict:
    """--since as the statements take it: an age (90s, 30m, 2h, 1d: counted back from the database's
    now()) or a moment (2026-12-07T09:00:00+00:00; without a zone, the database session's)."""
    found = {"since_secs": None, "since_at": None}
    if value is None:
        return found
    age = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", value.strip())
    if age:
        found["since_secs"] = float(age.group(1)) * UNITS[age.group(2)]
        return found
    try:
        found["since_at"] = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InputError(f"bad --since {value[:80]!r}: an age (90s, 30m, 2h, 1d) or a moment "
                         "(2026-12-07T09:00:00+00:00)") from None
    return found

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
