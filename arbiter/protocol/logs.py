"""Structured logs: one JSON object per line. Tokens and credentials never appear."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_SECRET_KEYS = {"lease_token", "token", "authorization", "credential", "secret", "password", "dsn"}
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# Free text from elsewhere (an exception's message and traceback, an error's or a worker's words) may
# quote a lease token: PostgreSQL's message for a unique violation names the row's key, lease token
# and all. Lease tokens are UUIDs (either spelling); a credential travels as a bearer value.
_FREE_TEXT_KEYS = {"exception", "error", "reason", "description", "detail"}
_TOKEN_LIKE = re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"
                         r"|(?i:bearer)\s+\S+")


def scrub(text: str) -> str:
    """``text`` with whatever looks like a lease token or a bearer credential replaced."""
    return _TOKEN_LIKE.sub("[redacted]", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _STANDARD or key.startswith("_"):
                continue
            if key.lower() in _SECRET_KEYS:
                value = "[redacted]"
            elif key.lower() in _FREE_TEXT_KEYS and isinstance(value, str):
                value = scrub(value)
            entry[key] = value
        if record.exc_info:
            entry["exception"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def configure(level: str = "INFO") -> None:
    """JSON lines on stderr at ``level`` (a level name; an unknown one means INFO, as for gunicorn)."""
    if not isinstance(logging.getLevelName(level), int):
        level = "INFO"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
