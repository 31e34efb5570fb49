"""Structured logs: one JSON object per line. Tokens and credentials never appear."""

from __future__ import annotations

import json
import logging
import sys
import time

_SECRET_KEYS = {"lease_token", "token", "authorization", "credential", "secret", "password", "dsn"}
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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
            entry[key] = "[redacted]" if key.lower() in _SECRET_KEYS else value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
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
