"""What the arbiter's and the worker's config files share: the one ConfigError both refuse a config
with (one line naming the key), TOML type checks, and secrets kept in files only their owner reads."""

from __future__ import annotations

import tomllib
from pathlib import Path

import psycopg

from arbiter.protocol.errors import ProtocolError


class ConfigError(ProtocolError):
    """A config refused at start-up; the message is the one line an operator sees."""


def read_toml_file(path: str | Path) -> dict:
    """A config file's table, or one line saying why not (missing, unreadable, not UTF-8, not TOML)."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def is_toml_type(value, expected: type) -> bool:
    """TOML value check shared by the arbiter's and the worker's config: no bools for numbers, ints do for floats."""
    if isinstance(value, bool):
        return expected is bool
    return isinstance(value, expected) or (expected is float and isinstance(value, int))


def read_secret_file(path: str, what: str, error: type[Exception] = ConfigError) -> str:
    """A secret from a file only its owner may read: one clear error (``error``, a ConfigError unless
    the caller names another) if it is missing, readable by others, or empty."""
    p = Path(path)
    try:
        mode = p.stat().st_mode & 0o777
        text = p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise error(f"{what} {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise error(f"{what} {path} is readable by group/others (mode {oct(mode)}); chmod 600 it")
    if not text:
        raise error(f"{what} {path} is empty")
    return text


def check_dsn(dsn: str, what: str = "dsn") -> str:
    """A libpq connection string (key=value or URL) that can work, or one line saying why not.

    A DSN that names several hosts (a replicated database: docs/operations.md) must ask for the one
    that takes writes (``target_session_attrs=read-write`` or ``primary``): without it libpq keeps
    the first host that answers, which after a failover is a standby that refuses every write."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # libpq's message quotes pieces of the string, which may be a password: not repeated here.
        raise ConfigError(f"{what} is not a valid libpq connection string (key=value pairs or a postgresql:// URL)") from None
    hosts = [h for h in str(params.get("host", params.get("hostaddr", ""))).split(",") if h]
    if len(hosts) > 1 and params.get("target_session_attrs") not in ("read-write", "primary"):
        raise ConfigError(f"{what} names {len(hosts)} hosts: add target_session_attrs=read-write so that "
                          "every connection goes to the primary")
    return dsn
